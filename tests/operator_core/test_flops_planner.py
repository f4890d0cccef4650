"""Planner and FLOP accounting: the documented formulas, checked with numbers worked by hand."""

import json
import subprocess
import sys

import pytest

from llmtrain.catalog import ModelDims, instance_type, model_preset
from llmtrain.flops import flops_per_token, num_params
from llmtrain.planner import activation_bytes, plan_for, plan_job, suggest_fit
from llmtrain.validation import parse_spec

SMALL = ModelDims(hidden_size=8, intermediate_size=16, num_layers=2, num_heads=2, num_kv_heads=1, vocab_size=10)


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


# Between steps FSDP2 keeps every strategy's state sharded over its shard group; SHARD_GRAD_OP's
# "params whole" (ZeRO-2) are gathered copies that live only from forward to backward (workspace).
@pytest.mark.parametrize(
    "strategy,expected",
    [
        ("FULL_SHARD", (2 * PSI // 16, 2 * PSI // 16, 12 * PSI // 16)),
        ("SHARD_GRAD_OP", (2 * PSI // 16, 2 * PSI // 16, 12 * PSI // 16)),
        ("HYBRID_SHARD", (2 * PSI // 8, 2 * PSI // 8, 12 * PSI // 8)),
        ("NO_SHARD", (2 * PSI, 2 * PSI, 12 * PSI)),
    ],
)
def test_model_state_follows_zero_accounting(strategy, expected):
    plan = plan_for(model_preset("llama2-7b"), instance_type("p5.48xlarge"), 2, strategy, "bf16", "selective", 4096, 1)
    assert (plan.params_bytes, plan.grads_bytes, plan.optimizer_bytes) == expected
    # 16 bytes per parameter in all, whatever the split
    if strategy == "NO_SHARD":
        assert sum(expected) == 16 * PSI


def test_cpu_offload_leaves_no_model_state_on_the_gpu():
    plan = plan_for(
        model_preset("llama2-7b"),
        instance_type("p5.48xlarge"),
        1,
        "FULL_SHARD",
        "bf16",
        "full",
        4096,
        1,
        cpu_offload=True,
    )
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


def test_peak_is_the_largest_moment_not_the_sum():
    # Gradients (freed each step) and activations never peak together: NO_SHARD with full
    # checkpointing on short sequences peaks in the optimizer step (all gradients, 2Ψ in bf16, and
    # foreach AdamW's fp32 temporary, 4Ψ), and the activations do not add to it.
    d, inst = model_preset("llama2-7b"), instance_type("p5.48xlarge")
    p = plan_for(d, inst, 1, "NO_SHARD", "bf16", "full", 128, 1)
    assert p.total_bytes == 2 * PSI + 12 * PSI + 2 * PSI + 4 * PSI
    longer = plan_for(d, inst, 1, "NO_SHARD", "bf16", "full", 256, 1)
    assert longer.activations_bytes > p.activations_bytes and longer.total_bytes == p.total_bytes


def test_more_nodes_never_need_more_memory_under_full_shard():
    d, inst = model_preset("llama2-70b"), instance_type("p5.48xlarge")
    totals = [plan_for(d, inst, n, "FULL_SHARD", "bf16", "full", 4096, 1).total_bytes for n in (1, 2, 4, 8, 16)]
    assert totals == sorted(totals, reverse=True)


def _spec(**over):
    raw = {
        "model": {"preset": "llama2-70b"},
        "data": {"seqLen": 4096},
        "cluster": {"instanceType": "p5.48xlarge", "nodes": 1},
        "training": {"globalBatchTokens": 4096 * 8 * 16},
    }
    raw.update(over)
    return parse_spec(raw)


def test_suggestion_for_a_job_that_does_not_fit_really_fits():
    spec = _spec()
    assert not plan_job(spec).fits
    hint = suggest_fit(spec)
    first = hint.split("; or ")[0]
    nodes = int(first.split("spec.cluster.nodes: ")[1].split()[0])
    fixed = (
        spec.model_copy(update={"fsdp": spec.fsdp.model_copy(update={"activation_checkpointing": "full"})})
        if "activationCheckpointing: full" in first
        else spec
    )
    assert plan_job(fixed, nodes=nodes).fits
    assert not plan_job(fixed, nodes=nodes - 1).fits  # and it is the smallest such count


def test_expected_throughput_from_assumed_mfu():
    plan = plan_job(
        _spec(
            cluster={"instanceType": "p5.48xlarge", "nodes": 16},
            fsdp={"activationCheckpointing": "full"},
            training={"globalBatchTokens": 4096 * 128},
        )
    )
    assert plan.tokens_per_second_per_gpu == pytest.approx(0.40 * 989e12 / plan.flops_per_token)
    assert plan.tokens_per_second == pytest.approx(plan.tokens_per_second_per_gpu * 128)


def test_plan_json_has_the_documented_keys(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(open("examples/llama2-7b-p5.yaml").read())
    out = subprocess.run(
        [sys.executable, "-m", "llmtrain.cli", "plan", str(job), "--output", "json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    plan = json.loads(out)
    for key in (
        "params_bytes",
        "grads_bytes",
        "optimizer_bytes",
        "activations_bytes",
        "total_bytes",
        "gpu_memory_bytes",
        "fits",
        "flops_per_token",
        "num_params",
    ):
        assert key in plan
    assert plan["fits"] is True
    assert (
        plan["total_bytes"]
        >= plan["params_bytes"] + plan["grads_bytes"] + plan["optimizer_bytes"] + plan["activations_bytes"]
    )


def test_sharded_peak_at_end_of_backward_holds_the_roots_unsharded_gradients():
    # FULL_SHARD, full checkpointing, short sequences: the end of backward is the peak. There the
    # sharded gradients sit next to the root module's (embedding + lm_head) fp32 gradients, still
    # whole until the root's reduce-scatter, the root's gathered bf16 parameters (kept from forward
    # to the end of backward) and 2 gathered blocks.
    d, inst = model_preset("llama2-7b"), instance_type("p5.48xlarge")
    p = plan_for(d, inst, 2, "FULL_SHARD", "bf16", "full", 128, 1)
    root_grads = 4 * 2 * 32000 * 4096
    # llama2-7b block: q, k, v, o 4·4096² + MLP 3·4096·11008 + 2 norms 2·4096 = 202,383,360
    # root: embedding and lm_head 2·32000·4096 + final norm 4096 = 262,148,096
    gathered = 2 * (262_148_096 + 2 * 202_383_360)
    assert p.total_bytes == p.params_bytes + p.optimizer_bytes + p.grads_bytes + gathered + root_grads


# SMALL with 4 layers: Ψ = 80 (embedding) + 4 · 592 (blocks) + 8 (final norm) + 80 (lm_head) = 2536;
# root (embedding, final norm, lm_head) 168. fp32, 2 workers on one node, seq 8, micro-batch 1:
#   activations, no checkpointing: (8d + 4(7d + 2kv + 4f)) = 64 + 4·128 = 576 B per token and layer,
#                                  × 8 tokens × 4 layers = 18432
#   loss workspace: 3·4·V + 4d + 4d = 120 + 32 + 32 = 184 B per token × 8 = 1472
#   root's fp32 gradients 4·2·V·d = 640
SMALL4 = ModelDims(hidden_size=8, intermediate_size=16, num_layers=4, num_heads=2, num_kv_heads=1, vocab_size=10)


def _small4(strategy, checkpointing="none", seq=8, nodes=1):
    return plan_for(SMALL4, instance_type("cpu"), nodes, strategy, "fp32", checkpointing, seq, 1, per_node=2)


def test_small_model_by_hand():
    assert num_params(SMALL4) == 2536
    assert activation_bytes(SMALL4, 8, 1, "none", "fp32") == 18432


def test_no_shard_holds_whole_state_and_a_gathered_copy_of_every_parameter():
    # FSDP2 under NO_SHARD (shard group 1) still copies every parameter into its unsharded buffer,
    # and keeps all of them from forward to backward. Start of backward:
    #   params 4Ψ 10144 + optimizer 8Ψ 20288 + activations 18432 + gathered 4Ψ 10144 + loss 1472
    p = _small4("NO_SHARD")
    assert (p.params_bytes, p.grads_bytes, p.optimizer_bytes) == (10144, 10144, 20288)
    assert p.workspace_bytes == 10144 + 1472
    assert p.total_bytes == 10144 + 20288 + 18432 + 10144 + 1472  # 60480


def test_no_shard_with_full_checkpointing_peaks_in_the_optimizer_step():
    # seq 4, full checkpointing: the start of backward holds 512 B of block inputs, the gathered
    # copies 10144 and one rebuilt block (576 + 4(2d + 3f) = 832 B per token × 4 = 3328) = 13984; the
    # end of backward grads 10144 + root and 2 blocks gathered 4(168 + 2·592) = 5408 + root grads 640
    # = 16192; the optimizer step grads 10144 + AdamW's fp32 temporary 10144 = 20288: the largest.
    p = _small4("NO_SHARD", "full", seq=4)
    assert p.total_bytes == 10144 + 20288 + 20288  # 50720


def test_hybrid_shard_shards_within_a_node_and_gathers_root_and_two_blocks():
    # HYBRID_SHARD shards over the 2 workers of a node, on one node or two: params 5072, grads 5072,
    # optimizer 10144; start of backward: activations 18432 + gathered root and 2 blocks
    # 4(168 + 2·592) = 5408 + loss 1472 = 25312 (end of backward 5072 + 5408 + 640 = 11120;
    # optimizer step 5072 + 5072).
    for nodes in (1, 2):
        p = _small4("HYBRID_SHARD", nodes=nodes)
        assert (p.params_bytes, p.grads_bytes, p.optimizer_bytes) == (5072, 5072, 10144)
        assert p.workspace_bytes == 5408 + 1472
        assert p.total_bytes == 5072 + 10144 + 25312  # 40528
    assert _small4("FULL_SHARD").total_bytes == 40528  # the same 2-way sharding on one node


def test_shard_grad_op_keeps_sharded_state_and_every_gathered_parameter():
    # params 5072 (sharded) + optimizer 10144; start of backward: activations 18432 + all 2536
    # parameters gathered (4Ψ = 10144) + loss 1472
    p = _small4("SHARD_GRAD_OP")
    assert (p.params_bytes, p.grads_bytes, p.optimizer_bytes) == (5072, 5072, 10144)
    assert p.total_bytes == 5072 + 10144 + 18432 + 10144 + 1472  # 45264
