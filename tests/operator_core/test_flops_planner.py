"""Planner and FLOP accounting: the documented formulas, checked with numbers worked by hand."""

import json
import subprocess
import sys

import pytest

from llmtrain.catalog import ModelDims, instance_type, model_preset
from llmtrain.flops import flops_per_token, num_params
from llmtrain.planner import activation_bytes, plan_for, plan_job, suggest_fit
from llmtrain.validation import parse_spec

SMALL = ModelDims(hidden_size=8, intermediate_size=16, num_layers=2, num_heads=2, num_kv_heads=1,
                  vocab_size=10)


def test_param_count_by_hand():
    # per block: Wq 64 + Wk 8*4 + Wv 8*4 + Wo 64 + MLP 3*8*16 + norms 16 = 592
    # total: emb 80 + 2*592 + final norm 8 + output 80 = 1352
    assert num_params(SMALL) == 1352


def test_flops_per_token_by_hand():
    # 6 * (1352 - 80) + 12 * L(2) * H(2) * q(4) * T(16) = 7632 + 3072
    assert flops_per_token(SMALL, 16) == 10704


def test_llama2_7b_flops_per_token_matches_the_6n_rule_of_thumb():
    d = model_preset("llama2-7b")
    # 6N dominates at short sequences; attention adds 12·L·H·q·T = 12·32·4096·T.
    assert flops_per_token(d, 4096) == 6 * (num_params(d) - 32000 * 4096) + 12 * 32 * 4096 * 4096


PSI = num_params(model_preset("llama2-7b"))


@pytest.mark.parametrize("strategy,expected", [
    ("FULL_SHARD", (2 * PSI // 16, 2 * PSI // 16, 12 * PSI // 16)),
    ("SHARD_GRAD_OP", (2 * PSI, 2 * PSI // 16, 12 * PSI // 16)),
    ("HYBRID_SHARD", (2 * PSI // 8, 2 * PSI // 8, 12 * PSI // 8)),
    ("NO_SHARD", (2 * PSI, 2 * PSI, 12 * PSI)),
])
def test_model_state_follows_zero_accounting(strategy, expected):
    plan = plan_for(model_preset("llama2-7b"), instance_type("p5.48xlarge"), 2, strategy, "bf16",
                    "selective", 4096, 1)
    assert (plan.params_bytes, plan.grads_bytes, plan.optimizer_bytes) == expected
    # 16 bytes per parameter in all, whatever the split
    if strategy == "NO_SHARD":
        assert sum(expected) == 16 * PSI


def test_cpu_offload_leaves_no_model_state_on_the_gpu():
    plan = plan_for(model_preset("llama2-7b"), instance_type("p5.48xlarge"), 1, "FULL_SHARD", "bf16",
                    "full", 4096, 1, cpu_offload=True)
    assert plan.params_bytes == plan.grads_bytes == plan.optimizer_bytes == 0


def test_activation_formulas_for_the_trainers_llama_block():
    # llama2-7b: d = 4096, kv = 32 heads · 128 = 4096, f = 11008; bf16 (e = 2), per token and layer:
    #   none      8d + e(7d + 2kv + 4f) = 32768 + 2·(28672 + 8192 + 44032) = 194560
    #   selective e(5d + 2kv + 2f)      = 2·(20480 + 8192 + 22016)         = 101376
    #   full      e·d                                                        = 8192
    d = model_preset("llama2-7b")
    s, b, L = 4096, 2, 32
    assert activation_bytes(d, s, b, "none", "bf16") == 194560 * s * b * L
    assert activation_bytes(d, s, b, "selective", "bf16") == 101376 * s * b * L
    assert activation_bytes(d, s, b, "full", "bf16") == 8192 * s * b * L
    # fp32: e = 4; only the fp32 RMSNorm input copies (8d) don't double.
    assert activation_bytes(d, s, b, "full", "fp32") == 2 * activation_bytes(d, s, b, "full", "bf16")
    assert activation_bytes(d, s, b, "none", "fp32") == (8 * 4096 + 4 * (7 * 4096 + 2 * 4096 + 4 * 11008)) * s * b * L


def test_peak_is_the_larger_of_backward_start_and_end_not_the_sum():
    # Gradients (freed each step) and activations never peak together: adding a little activation
    # memory to a job whose gradients dominate leaves the plan unchanged.
    d, inst = model_preset("llama2-7b"), instance_type("p5.48xlarge")
    p = plan_for(d, inst, 1, "NO_SHARD", "bf16", "full", 128, 1)
    assert p.grads_bytes > p.activations_bytes + p.workspace_bytes
    assert p.total_bytes == p.params_bytes + p.optimizer_bytes + p.grads_bytes


def test_more_nodes_never_need_more_memory_under_full_shard():
    d, inst = model_preset("llama2-70b"), instance_type("p5.48xlarge")
    totals = [plan_for(d, inst, n, "FULL_SHARD", "bf16", "full", 4096, 1).total_bytes for n in (1, 2, 4, 8, 16)]
    assert totals == sorted(totals, reverse=True)


def _spec(**over):
    raw = {"model": {"preset": "llama2-70b"}, "data": {"seqLen": 4096},
           "cluster": {"instanceType": "p5.48xlarge", "nodes": 1},
           "training": {"globalBatchTokens": 4096 * 8 * 16}}
    raw.update(over)
    return parse_spec(raw)


def test_suggestion_for_a_job_that_does_not_fit_really_fits():
    spec = _spec()
    assert not plan_job(spec).fits
    hint = suggest_fit(spec)
    first = hint.split("; or ")[0]
    nodes = int(first.split("spec.cluster.nodes: ")[1].split()[0])
    fixed = spec.model_copy(update={"fsdp": spec.fsdp.model_copy(update={"activation_checkpointing": "full"})}) \
        if "activationCheckpointing: full" in first else spec
    assert plan_job(fixed, nodes=nodes).fits
    assert not plan_job(fixed, nodes=nodes - 1).fits  # and it is the smallest such count


def test_expected_throughput_from_assumed_mfu():
    plan = plan_job(_spec(cluster={"instanceType": "p5.48xlarge", "nodes": 16},
                          fsdp={"activationCheckpointing": "full"},
                          training={"globalBatchTokens": 4096 * 128}))
    assert plan.tokens_per_second_per_gpu == pytest.approx(0.40 * 989e12 / plan.flops_per_token)
    assert plan.tokens_per_second == pytest.approx(plan.tokens_per_second_per_gpu * 128)


def test_plan_json_has_the_documented_keys(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(open("examples/llama2-7b-p5.yaml").read())
    out = subprocess.run([sys.executable, "-m", "llmtrain.cli", "plan", str(job), "--output", "json"],
                         capture_output=True, text=True, check=True).stdout
    plan = json.loads(out)
    for key in ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "total_bytes",
                "gpu_memory_bytes", "fits", "flops_per_token", "num_params"):
        assert key in plan
    assert plan["fits"] is True
    assert plan["total_bytes"] >= plan["params_bytes"] + plan["grads_bytes"] + plan["optimizer_bytes"] \
        + plan["activations_bytes"]


def test_sharded_peak_at_end_of_backward_holds_the_roots_unsharded_gradients():
    # FULL_SHARD, full checkpointing, short sequences: the end of backward is the peak. There the
    # sharded gradients sit next to the root module's (embedding + lm_head) fp32 gradients, still
    # whole until the root's reduce-scatter, and the 2 gathered blocks.
    from llmtrain.flops import block_params

    d, inst = model_preset("llama2-7b"), instance_type("p5.48xlarge")
    p = plan_for(d, inst, 2, "FULL_SHARD", "bf16", "full", 128, 1)
    root_grads = 4 * 2 * 32000 * 4096
    gathered = 2 * 2 * block_params(d)
    assert p.total_bytes == p.params_bytes + p.optimizer_bytes + p.grads_bytes + gathered + root_grads
