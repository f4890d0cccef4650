"""spec.checkpoint.memory on paper (llmtrain/snapshot_plan.py): each figure by hand from the model's
dimensions and the catalog, the goodput model against the planner's durable-only run, and
`llmtrain plan`'s lines."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from llmtrain import cadence
from llmtrain.catalog import GIB, instance_type, model_preset
from llmtrain.cli import main
from llmtrain.flops import num_params
from llmtrain.planner import RESTART_SECONDS, expected_run, interval_seconds, plan_job, prior_node
from llmtrain.snapshot_plan import (
    HARDWARE_SHARE,
    MEMORY_RESTART_SECONDS,
    REQUEST_FRACTION,
    host_memory,
    memory_run,
    pod_memory_gib,
    snapshot_bytes,
    snapshot_plan,
)
from llmtrain.validation import parse_spec

from .invalid_cases import spec_with

P5 = instance_type("p5.48xlarge")
# the 70B example of docs/concepts/goodput.md, with snapshots: 16 × p5, 128 ranks
B70 = {
    "model": {"preset": "llama2-70b"},
    "cluster": {"instanceType": "p5.48xlarge", "nodes": 16},
    "fsdp": {"activationCheckpointing": "full"},
    "training": {"maxSteps": 3000, "globalBatchTokens": 4194304},
    "checkpoint": {"uri": "s3://b/ckpt/", "intervalMinutes": "auto", "memory": {}},
}


def _spec(**over):
    return parse_spec(spec_with({**B70, **over}))


def _snapshot_by_hand(preset: str, group: int) -> int:
    dims = model_preset(preset)
    return 12 * math.ceil(num_params(dims) / group) + 4 * (9 * dims.num_layers + 3)


def test_a_snapshot_is_the_durable_checkpoints_tensors_of_one_rank():
    """fp32 master parameters + exp_avg + exp_avg_sq (12 bytes per local parameter) and one fp32 step
    per parameter tensor, whatever the mixed precision."""
    for precision in ("bf16", "fp32"):
        spec = _spec(fsdp={"mixedPrecision": precision})
        assert snapshot_bytes(spec, plan_job(spec)) == _snapshot_by_hand("llama2-70b", 128)
    hybrid = _spec(fsdp={"shardingStrategy": "HYBRID_SHARD"})  # sharded over a node's 8 GPUs
    assert snapshot_bytes(hybrid, plan_job(hybrid)) == _snapshot_by_hand("llama2-70b", 8)


def test_host_memory_by_hand():
    s = _snapshot_by_hand("llama2-70b", 128)
    host = host_memory(_spec())
    # 2 own + 2 partner copies of 8 ranks' snapshots; the durable save's pinned buffers and its S3 files
    assert (host.own_bytes, host.partner_bytes, host.staging_bytes) == (2 * 8 * s, 2 * 8 * s, 2 * 8 * s)
    assert host.total_bytes == 6 * 8 * s and host.offload_bytes == host.workers_bytes == 0
    assert host.pod_bytes == int(2048 * GIB * REQUEST_FRACTION) and host.fits
    # FSx (file://): no staging files; no partner: only the own copies; one node: no partner either
    assert host_memory(_spec(checkpoint={"uri": "file:///mnt/fsx/c"})).staging_bytes == 8 * s
    assert host_memory(_spec(checkpoint={"memory": {"partner": False}})).partner_bytes == 0
    one = _spec(model={"preset": "llama2-7b"}, cluster={"nodes": 1}, training={"globalBatchTokens": 4096 * 8 * 4})
    assert host_memory(one).partner_bytes == 0 and host_memory(one).own_bytes > 0


def test_without_snapshots_nothing_changes():
    """The durable path stays as it was: no snapshot bytes counted, the same pod memory."""
    spec = _spec(checkpoint={"memory": None})
    assert spec.checkpoint.memory is None
    assert host_memory(spec).own_bytes == host_memory(spec).partner_bytes == 0
    assert pod_memory_gib(spec) == int(2048 * 0.85)


def test_cpu_workers_count_their_own_memory():
    spec = parse_spec(
        spec_with(
            {
                "model": {"preset": "tiny"},
                "data": {"seqLen": 128},
                "cluster": {"instanceType": "cpu", "nodes": 2, "processesPerNode": 2},
                "training": {"globalBatchTokens": 128 * 4},
                "fsdp": {"mixedPrecision": "fp32"},
                "checkpoint": {"memory": {}},
            }
        )
    )
    host, cpu = host_memory(spec), instance_type("cpu")
    assert host.workers_bytes == 2 * cpu.device_memory_bytes and host.staging_bytes == 0
    assert host.pod_bytes == cpu.memory_gib * GIB  # CPU pods ask per process, not a share of the node
    assert pod_memory_gib(spec) == 2 * int(cpu.gpu_memory_gib) + math.ceil(host.snapshots_bytes / GIB)


def test_blocking_replication_and_interval_by_hand():
    spec = _spec()
    plan = plan_job(spec)
    s = _snapshot_by_hand("llama2-70b", 128)
    sp = snapshot_plan(spec, plan)
    assert sp.blocking_seconds == pytest.approx(s / 10e9)  # the durable save's staging rate
    assert sp.replication_seconds == pytest.approx(8 * s * 8 / (P5.network_gbps * 1e9))  # one node's, line rate
    mtbf = cadence.prior_node_mtbf_hours(8) * 3600 / 16
    step = sp.run.durable.train_seconds / 3000
    assert sp.interval_steps == math.ceil(math.sqrt(2 * s / 10e9 * mtbf) / step)  # 23 min: not clamped
    assert 5 * 60 < math.sqrt(2 * s / 10e9 * mtbf) < 24 * 3600
    fixed = _spec(checkpoint={"memory": {"intervalSteps": 7, "partner": False}})
    assert snapshot_plan(fixed).interval_steps == 7 and snapshot_plan(fixed).replication_seconds == 0


def test_without_memory_the_baseline_is_the_plans_expected_run():
    spec = _spec()
    plan = plan_job(spec)
    run = memory_run(spec, plan)
    assert run.durable == expected_run(spec, plan)  # what `llmtrain plan` prints already


@pytest.mark.parametrize("scale", [1.0, 16.0])
@pytest.mark.parametrize("partner", [True, False])
def test_goodput_with_snapshots_by_hand(scale, partner):
    spec = _spec(checkpoint={"memory": {"partner": partner}})
    plan = plan_job(spec)
    sp = snapshot_plan(spec, plan, failure_scale=scale)
    run, durable = sp.run, sp.run.durable
    train, ckpt = durable.train_seconds, durable.checkpoint_seconds
    snaps = 3000 // sp.interval_steps * sp.blocking_seconds
    restarts = 128 * (train + ckpt + snaps) / 3600 * cadence.FAILURES_PER_GPU_HOUR * scale
    p = 1.0 if partner else 1 - HARDWARE_SHARE
    from_memory = MEMORY_RESTART_SECONDS + sp.interval_steps * train / 3000 / 2
    from_durable = RESTART_SECONDS + interval_seconds(spec, plan, prior_node(spec, scale)) / 2
    wall = train + ckpt + snaps + restarts * (p * from_memory + (1 - p) * from_durable)
    assert run.restarts == pytest.approx(restarts) and run.from_memory == p
    assert run.wall_seconds == pytest.approx(wall) and run.goodput == pytest.approx(train / wall)


def test_memory_pays_where_failures_are_frequent():
    """At Llama 3's rate 70B on 16 × p5 gains nothing (durable auto already saves every ~25 min and
    the snapshots' copies cost about what the shorter restarts save); at 16× the rate it does."""
    spec = _spec()
    at = {scale: snapshot_plan(spec, failure_scale=scale).run for scale in (1.0, 16.0)}
    assert abs(at[1.0].goodput - at[1.0].durable.goodput) < 0.001
    assert (1 - at[16.0].goodput) < 0.9 * (1 - at[16.0].durable.goodput)


def _plan_cli(tmp_path, capsys, spec: dict, *args) -> tuple[int, str]:
    path = tmp_path / "job.yaml"
    doc = {"apiVersion": "llmtrain.dev/v1alpha1", "kind": "LLMTrainingJob", "metadata": {"name": "j"}, "spec": spec}
    path.write_text(yaml.safe_dump(doc))
    rc = main(["plan", str(path), *args])
    return rc, capsys.readouterr().out


def test_plan_prints_the_snapshot_figures(tmp_path, capsys):
    rc, out = _plan_cli(tmp_path, capsys, spec_with(B70))
    sp = snapshot_plan(_spec())
    assert rc == 0
    assert f"memory snapshots: every {sp.interval_steps:,} steps (auto: √(2 × " in out
    assert "host memory per node: 289.1 GiB of the 1,740.8 GiB a worker pod gets (p5.48xlarge: 2,048.0 GiB)" in out
    assert f"blocking per snapshot: {sp.blocking_seconds:.3g} s (estimated)" in out
    assert f"{sp.replication_seconds:.3g} s per snapshot at 3,200 Gbit/s" in out
    assert f"expected goodput {sp.run.goodput:.2%} with memory snapshots, {sp.run.durable.goodput:.2%}" in out
    rc, out = _plan_cli(tmp_path, capsys, spec_with(B70), "--output", "json")
    got = json.loads(out)["memorySnapshots"]
    assert got["host"]["total_bytes"] == sp.host.total_bytes and got["run"]["goodput"] == sp.run.goodput
    rc, out = _plan_cli(tmp_path, capsys, spec_with({**B70, "checkpoint": {"uri": "s3://b/c/"}}))
    assert rc == 0 and "memory snapshots" not in out


def test_plan_fails_when_the_snapshots_do_not_fit(tmp_path, capsys):
    spec = {
        **B70,
        "model": {"preset": "llama2-70b"},
        "cluster": {"instanceType": "p4de.24xlarge", "nodes": 4},
        "training": {"globalBatchTokens": 4096 * 32 * 4},
    }
    rc, out = _plan_cli(tmp_path, capsys, spec_with(spec))
    assert rc == 1 and "fits: NO" in out and "spec.cluster: the in-memory snapshots" in out
