"""Multi-process training on CPU (gloo, torchrun): strategies, resume, rendezvous, S3, pretrained.

Every run uses `base_spec` on the prepared corpus and is compared with the single-process reference
trajectory; fp32 everywhere so the only differences are reduction order (≪ the 1e-4 tolerance).
"""

from __future__ import annotations

import signal

import pytest

from conftest import STEPS, base_spec, run_to_end

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

RTOL = 2e-4


def assert_matches_reference(losses: dict[int, float], reference: dict[int, float]):
    assert losses, "no steps logged"
    for step, loss in losses.items():
        assert loss == pytest.approx(reference[step], rel=RTOL), (step, losses, reference)


@pytest.mark.parametrize(
    "strategy,ac",
    [("FULL_SHARD", "selective"), ("SHARD_GRAD_OP", "full"), ("HYBRID_SHARD", "none"), ("NO_SHARD", "none")],
)
def test_strategy_trains_and_matches_single_process_reference(strategy, ac, corpus, reference, launch):
    w = run_to_end(
        launch(base_spec(**{"data.uri": corpus, "fsdp.shardingStrategy": strategy, "fsdp.activationCheckpointing": ac}))
    )
    losses = w.losses()
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert losses[STEPS] < losses[1] - 0.5, losses  # it learns
    assert_matches_reference(losses, reference)
    cfg = w.of("config")[0]
    assert cfg["world_size"] == 2 and cfg["grad_accum"] == 2
    if strategy in ("NO_SHARD", "HYBRID_SHARD"):
        # Gradients are all-reduced across replicas once per step, not once per micro-batch (2 here):
        # one fp32 gradient shard — all parameters for NO_SHARD (shard=1), half for HYBRID_SHARD
        # (shard=2 processes on this "node"; every tiny dim-0 size is even, so no padding).
        from llmtrain.catalog import model_preset
        from llmtrain.flops import num_params

        shard = 1 if strategy == "NO_SHARD" else 2
        assert {e["allreduce_bytes"] for e in w.of("step")} == {num_params(model_preset("tiny")) * 4 // shard}

    # MFU / TFLOP/s as logged = the documented formula applied to the logged throughput (cpu peak).
    from llmtrain.catalog import instance_type

    d, f, L, V, H, kvh = 64, 176, 2, 256, 4, 2
    q, T = d // H, 32
    n_matmul = L * (2 * d * d + 2 * d * kvh * q + 3 * d * f + 2 * d) + d + V * d
    fpt = 6 * n_matmul + 12 * L * H * q * T
    peak = instance_type("cpu").peak_flops_per_device
    for e in w.of("step"):
        # over the wall time since the previous step ended (a checkpoint's blocking included)
        assert e["wall_seconds"] >= e["step_seconds"]
        per_dev = e["tokens"] / e["wall_seconds"] / 2
        assert e["tokens_per_second_per_device"] == pytest.approx(per_dev, rel=1e-3)
        assert e["tflops_per_device"] == pytest.approx(per_dev * fpt / 1e12, rel=1e-3)
        assert e["mfu"] == pytest.approx(per_dev * fpt / peak, rel=1e-3)


def test_bf16_mixed_precision_trains_close_to_fp32(corpus, reference, launch):
    """bf16 compute with fp32 master weights and reduction: same trajectory within bf16 precision."""
    w = run_to_end(
        launch(
            base_spec(
                **{"data.uri": corpus, "fsdp.mixedPrecision": "bf16", "fsdp.activationCheckpointing": "selective"}
            )
        )
    )
    losses = w.losses()
    assert losses[STEPS] < losses[1] - 0.5, losses
    for step, loss in losses.items():
        assert loss == pytest.approx(reference[step], rel=3e-2), (step, losses, reference)


def test_sigkill_a_worker_then_restart_resumes_from_last_checkpoint(corpus, reference, launch, tmp_path):
    spec = base_spec(
        **{
            "data.uri": corpus,
            "checkpoint.uri": str(tmp_path / "ckpt"),
            "checkpoint.intervalSteps": 2,
            "checkpoint.keep": 2,
        }
    )
    first = launch(spec, name="first")
    first.wait_for(lambda e: e.get("event") == "step" and e["step"] == 5)
    # Rank 0's /metrics (what the operator scrapes) is live and labelled.
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{first.metrics_port}/metrics", timeout=5) as r:
        fams = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    step_sample = fams["llmtrain_trainer_step"].samples[0]
    assert step_sample.labels == {"llmtrain_job": "test", "rank": "0"} and step_sample.value >= 5
    assert fams["llmtrain_trainer_heartbeat_timestamp_seconds"].samples[0].value > 0
    assert fams["llmtrain_trainer_last_checkpoint_step"].samples[0].value >= 2
    assert fams["llmtrain_trainer_hang_timeout_seconds"].samples[0].value == 30 * 60
    # tokens_total is this rank's share: 8 sequences × 32 tokens per step over 2 ranks = 128 per step
    # (the scrape may fall between the step gauge and the counter update of the same step).
    tokens = fams["llmtrain_trainer_tokens"].samples[0].value
    assert (step_sample.value - 1) * 128 <= tokens <= step_sample.value * 128, (tokens, step_sample.value)
    victim = first.worker_pids()[1]
    import os

    os.kill(victim, signal.SIGKILL)
    assert first.wait() != 0
    committed = [e["step"] for e in first.of("checkpoint")]
    assert committed and max(committed) >= 2
    last = max(committed)
    # A save in flight when the worker died must not be visible; only whole checkpoints are.
    ckpts = sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("step-"))
    assert ckpts[-1] == f"step-{last:010d}" and len(ckpts) <= 2

    second = run_to_end(launch(spec, name="second"))
    resume = second.of("resume")[0]
    assert resume["step"] == last and resume["from_world_size"] == 2
    steps = second.of("step")
    assert [e["step"] for e in steps] == list(range(last + 1, STEPS + 1))  # same step count
    assert [e["sample_start"] for e in steps] == [(s - 1) * 8 for s in range(last + 1, STEPS + 1)]
    assert_matches_reference(first.losses(), reference)  # continuous loss:
    assert_matches_reference(second.losses(), reference)  # as if never killed
    for s in set(first.losses()) & set(second.losses()):  # re-done steps repeat exactly
        assert second.losses()[s] == pytest.approx(first.losses()[s], rel=1e-5)


def test_sigterm_checkpoints_and_exits_cleanly_then_resumes_on_one_process(corpus, reference, launch, tmp_path):
    # Micro-batches of 1: 4 per rank and step, so the stop usually lands inside a step and is taken
    # at the next micro-batch boundary (the partial step is dropped); a stop at the step boundary
    # must give the same outcome. Micro-batch size does not change the trajectory (equal-size means).
    spec = base_spec(**{"data.uri": corpus, "checkpoint.uri": f"file://{tmp_path}/ckpt", "training.microBatchSize": 1})
    two = launch(spec, name="two")
    two.wait_for(lambda e: e.get("event") == "step" and e["step"] == 3)
    import os

    # What the kubelet does on a drain: SIGTERM to the container's PID 1, the launcher. The workers
    # stop, checkpoint, exit 0, and so does the pod (torchrun alone would exit 1).
    os.kill(two.proc.pid, signal.SIGTERM)
    assert two.wait(60) == 0, two.stderr()
    end = two.of("end")[0]
    assert end["reason"] == "signal" and end["last_checkpoint"] == end["step"] >= 3
    assert end["step"] < STEPS
    stop = two.of("stop")[0]
    assert stop["step"] == end["step"] == max(e["step"] for e in two.of("step"))  # no half step counted
    assert stop.get("dropped_micro_batches", 1) in range(1, 4) and stop["signal"] == "SIGTERM"

    one = run_to_end(launch(spec, nproc=1, name="one"))
    resume = one.of("resume")[0]
    assert resume == {**resume, "step": end["step"], "from_world_size": 2, "world_size": 1}
    assert one.of("config")[0]["grad_accum"] == 8
    assert sorted(one.losses()) == list(range(end["step"] + 1, STEPS + 1))
    assert_matches_reference(two.losses(), reference)
    assert_matches_reference(one.losses(), reference)


def test_two_torchrun_nodes_meet_through_real_etcd(corpus, reference, launch, etcd):
    """HYBRID_SHARD over 2 "nodes" × 1 process: mesh (replicate=2, shard=1)."""
    import uuid

    spec = base_spec(
        **{
            "data.uri": corpus,
            "fsdp.shardingStrategy": "HYBRID_SHARD",
            "rendezvous.backend": "etcd-v2",
            "training.maxSteps": 4,
        }
    )
    rid = f"etcd-test-{uuid.uuid4().hex[:8]}"
    nodes = [launch(spec, nproc=1, nnodes=2, rdzv=("etcd-v2", etcd), rdzv_id=rid, name=f"node{i}") for i in range(2)]
    for n in nodes:
        run_to_end(n)
    main = [n for n in nodes if n.of("config")]
    assert len(main) == 1, "exactly one node hosts rank 0"
    assert main[0].of("config")[0]["world_size"] == 2
    ref4 = reference_for(corpus, steps=4)
    assert_matches_reference(main[0].losses(), ref4)


def reference_for(corpus, **over):
    from trainer_reference import reference_losses

    steps = over.pop("steps")
    return reference_losses(base_spec(**{"data.uri": corpus, "training.maxSteps": steps}))


def test_s3_checkpoint_round_trip(corpus, launch, s3, tmp_path):
    import boto3
    from trainer_reference import reference_losses

    c = boto3.client("s3")
    c.create_bucket(Bucket="ckpt")
    # Constant LR, so that stopping at 4 and continuing to 8 follows the same trajectory as 8 in one go.
    spec = base_spec(
        **{
            "data.uri": corpus,
            "checkpoint.uri": "s3://ckpt/runs/a/",
            "checkpoint.intervalSteps": 2,
            "checkpoint.keep": 1,
            "training.lrSchedule": "constant",
            "training.warmupSteps": 0,
            "training.learningRate": 0.005,
        }
    )
    expected = reference_losses(spec)
    first = run_to_end(launch(dict(spec, training={**spec["training"], "maxSteps": 4}), env=s3, name="s3-first"))
    assert [e["step"] for e in first.of("checkpoint")] == [2, 4]
    keys = sorted(o["Key"] for o in c.list_objects_v2(Bucket="ckpt", Prefix="runs/a/")["Contents"])
    # keep=1: step 2 pruned; step 4 complete, in attempt 0's directory: both ranks' shards, the
    # metadata and the commit marker that lists them.
    assert keys == [
        "runs/a/step-0000000004/a0/.metadata",
        "runs/a/step-0000000004/a0/_COMPLETE",
        "runs/a/step-0000000004/a0/__0_0.distcp",
        "runs/a/step-0000000004/a0/__1_0.distcp",
    ]
    import json

    marker = json.loads(c.get_object(Bucket="ckpt", Key=keys[1])["Body"].read())
    assert marker["attempt"] == 0 and marker["step"] == 4
    sizes = {
        k.rsplit("/", 1)[1]: o["Size"]
        for o in c.list_objects_v2(Bucket="ckpt", Prefix="runs/a/")["Contents"]
        for k in [o["Key"]]
    }
    assert marker["files"] == {n: sizes[n] for n in (".metadata", "__0_0.distcp", "__1_0.distcp")}

    # `llmtrain export` reassembles the two ranks' FSDP shards from S3 into a model transformers
    # loads, with the logits of the trainer's own model on those weights.
    import torch
    from transformers import AutoModelForCausalLM

    from llmtrain.defaults import resolve
    from llmtrain.spec import LLMTrainingJobSpec, resolve_dims
    from llmtrain_trainer.cli.export import export
    from llmtrain_trainer.models.llama import Llama
    from llmtrain_trainer.models.pretrained import load_pretrained

    job = resolve(LLMTrainingJobSpec.model_validate(spec))
    info = export(job, str(tmp_path / "hf"), dtype="fp32")
    assert info["step"] == 4 and info["checkpoint"] == "s3://ckpt/runs/a/step-0000000004"
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), attn_implementation="eager").eval()
    mine = Llama(resolve_dims(job.model))
    mine.init_rope("cpu")
    load_pretrained(mine, str(tmp_path / "hf"))
    tokens = torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (hf(tokens).logits - mine.eval()(tokens)).abs().max().item() < 1e-5

    second = run_to_end(launch(spec, env=s3, name="s3-second"))
    assert second.of("resume")[0]["step"] == 4
    assert sorted(second.losses()) == list(range(5, STEPS + 1))
    assert_matches_reference(first.losses(), expected)
    assert_matches_reference(second.losses(), expected)


@pytest.mark.parametrize("where", ["file", "s3"])
def test_pretrained_safetensors_load_into_shards(where, corpus, launch, tmp_path, request):
    """Weights written by the test (HF names, a different seed) are what the sharded model starts from."""
    from safetensors.torch import save_file
    from trainer_reference import reference_losses, reference_model

    from llmtrain.defaults import resolve
    from llmtrain.spec import LLMTrainingJobSpec

    spec = base_spec(**{"data.uri": corpus, "training.maxSteps": 2})
    hf = reference_model(resolve(LLMTrainingJobSpec.model_validate(spec)), seed=1234)
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in hf.state_dict().items()}, str(path))
    expected = reference_losses(spec, model=hf)

    env = None
    if where == "s3":
        import boto3

        env = request.getfixturevalue("s3")
        c = boto3.client("s3")
        c.create_bucket(Bucket="weights")
        c.upload_file(str(path), "weights", "tiny/model.safetensors")
        spec["model"]["pretrainedUri"] = "s3://weights/tiny/"
        env = dict(env, LLMTRAIN_CACHE_DIR=str(tmp_path / "cache"))
    else:
        spec["model"]["pretrainedUri"] = f"file://{path}"
    if where == "file":
        spec["checkpoint"] = {**spec["checkpoint"], "uri": str(tmp_path / "ckpt")}
    w = run_to_end(launch(spec, env=env))
    assert w.of("pretrained")[0]["tensors"] == len(list(hf.parameters()))
    assert_matches_reference(w.losses(), expected)
    if where == "file":
        # Resuming reads the checkpoint only: the pretrained weights are not read again (at 70B that
        # is ~138 GB per node per restart), so a run resumes even once they are gone.
        path.unlink()
        again = run_to_end(launch(dict(spec, training={**spec["training"], "maxSteps": 3}), name="again"))
        assert again.of("resume")[0]["step"] == 2 and not again.of("pretrained")
        assert sorted(again.losses()) == [3]
