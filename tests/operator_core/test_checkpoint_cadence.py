"""spec.checkpoint.intervalMinutes: auto — Young/Daly's τ = √(2 · C · M), the MTBF estimate, the
spec's validation and what decide writes in status.checkpoint. No cluster: the expected figures are
computed by hand below (from the formulas in llmtrain/cadence.py's docstring), not by the code."""

from __future__ import annotations

import datetime as dt
import math

import pytest

from llmtrain import cadence
from llmtrain.controller.adapters import reliability
from llmtrain.controller.policy.progress import Progress, timestamp
from llmtrain.controller.policy.snapshot import CreateResult
from llmtrain.crd import spec_schema
from llmtrain.spec import CheckpointSpec
from llmtrain.validation import InvalidJob, validate

from .decide_world import NOW, ago, decide_, gpu, ptj, running, snap

H = 3600.0
# Llama 3: 419 interruptions in 54 days on 16,384 GPUs → GPU-hours per interruption
GPU_MTBF_H = 54 * 24 * 16384 / 419  # 50,677.0 h
P5_NODE_MTBF_H = GPU_MTBF_H / 8  # 6,334.6 h


# --- Young/Daly and the clamp ---------------------------------------------------------------------


def test_young_daly_by_hand():
    # C = 30 s, M = 400 h: √(2 · 30 · 1,440,000) = √86,400,000 = 9,295.2 s = 154.9 min
    assert cadence.young_daly(30, 400 * H) == pytest.approx(9295.16, abs=0.01)
    assert cadence.interval(30, 400 * H) / 60 == pytest.approx(154.92, abs=0.01)
    # C = 41 s, M = 37.5 h: √(2 · 41 · 135,000) = √11,070,000 = 3,327.2 s
    assert cadence.interval(41, 37.5 * H) == pytest.approx(3327.2, abs=0.1)


def test_the_interval_is_clamped_to_5_minutes_and_24_hours():
    assert cadence.interval(0.1, 1 * H) == 300  # √720 = 26.8 s
    assert cadence.interval(0, 400 * H) == 300  # a free save: still not more often than 5 min
    assert cadence.interval(600, 10000 * H) == 86400  # √(4.32e10) = 207,846 s
    assert cadence.clamp_interval(float("nan")) == 86400
    assert cadence.clamp_interval(float("inf")) == 86400


# --- the MTBF ---------------------------------------------------------------------------------------


def test_the_prior_is_llama3s_interruption_rate_per_gpu():
    assert cadence.prior_node_mtbf_hours(1) == pytest.approx(GPU_MTBF_H)
    assert cadence.prior_node_mtbf_hours(8) == pytest.approx(6334.6, abs=0.1)
    assert cadence.prior_node_mtbf_hours(0) == pytest.approx(GPU_MTBF_H)  # a CPU node counts as one GPU
    prior = cadence.node_mtbf("p5.48xlarge", 8)
    assert prior.job_seconds(16) / H == pytest.approx(395.9, abs=0.1)
    # Llama 3's own scale (2,048 nodes of 8): one interruption every 3.09 h, as the paper saw
    assert prior.job_seconds(2048) / H == pytest.approx(54 * 24 / 419, rel=1e-9)


def test_gamma_poisson_estimate_by_hand():
    # (K · M0 + E) / (K + F) with K = 2, M0 = 6,334.6 h, F = 2 failures in E = 310 node-hours
    node = cadence.node_mtbf("p5.48xlarge", 8, failures=2, node_hours=310)
    assert node.hours == pytest.approx((2 * P5_NODE_MTBF_H + 310) / 4)  # 3,244.8 h
    assert node.hours == pytest.approx(3244.8, abs=0.1)
    assert node.job_seconds(16) / H == pytest.approx(202.8, abs=0.1)
    # no failures in ten times the prior's pseudo-hours: the MTBF is believed ~six times longer
    calm = cadence.node_mtbf("p5.48xlarge", 8, failures=0, node_hours=10 * 2 * P5_NODE_MTBF_H)
    assert calm.hours == pytest.approx(11 * P5_NODE_MTBF_H)


def test_reason_words():
    node = cadence.node_mtbf("p5.48xlarge", 8, failures=2, node_hours=310)
    words = cadence.reason(41, node.job_seconds(16), node.words(16))
    # √(2 · 41 s · 202.8 h · 3,600) = √59,866,560 = 7,737 s = 129 min
    assert words == (
        "auto: √(2 × 41 s blocking × 202.8 h MTBF (16 p5.48xlarge nodes, prior + 2 failures in 310 "
        "node-hours)) = 129 min"
    )
    assert cadence.node_mtbf("cpu", 0).words(1) == "1 cpu node, prior only"
    assert cadence.reason(0.1, H, "x").endswith("= 27 s, clamped to 5 min (5 min..24.0 h)")


def test_auto_interval_follows_the_measured_blocking_cost():
    auto = cadence.AutoInterval(400 * H, blocking_seconds=0.5)
    assert auto.seconds == pytest.approx(math.sqrt(2 * 0.5 * 400 * H))  # 1,200 s from the estimate
    assert auto.observe(30) == pytest.approx(9295.16, abs=0.01)  # the first measurement replaces it
    assert auto.observe(50) == pytest.approx(math.sqrt(2 * 40 * 400 * H))  # EWMA ½: 30 → 40
    assert auto.measured_saves == 2
    assert auto.observe(float("nan")) == pytest.approx(math.sqrt(2 * 40 * 400 * H))  # ignored
    assert auto.measured_saves == 2


# --- the fleet's failures (controller/adapters/reliability.py) -------------------------------------------------


def _job(ns, instance, nodes, ran_s, bad=(), wall=None, created=None):
    return {
        "metadata": {"namespace": ns, "name": "j", "creationTimestamp": created or ago(days=2)},
        "spec": {"cluster": {"instanceType": instance, "nodes": nodes}},
        "status": {
            "goodput": {
                "wallSeconds": wall if wall is not None else ran_s,
                "seconds": {"productive": ran_s * 0.9, "checkpointStall": ran_s * 0.1, "queued": 999_999},
            },
            "badNodes": list(bad),
        },
    }


def _bad(attempt, reason, xid=None):
    entry = {"node": f"n{attempt}", "reason": reason, "attempt": attempt}
    if xid is not None:
        entry["xid"] = xid
    return entry


def test_only_node_faults_count():
    assert reliability.node_fault(_bad(1, "XID 79", 79))
    assert reliability.node_fault(_bad(1, "XID 48", 48))
    assert reliability.node_fault(_bad(1, "EFA error"))
    assert reliability.node_fault(_bad(1, "DeletionByPodGC"))
    for own in (_bad(1, "XID 13", 13), _bad(1, "exit 1"), _bad(1, "OOMKilled"), _bad(1, "NCCL error"), "junk"):
        assert not reliability.node_fault(own), own


def test_fleet_estimate_by_hand():
    t = NOW.timestamp()
    jobs = [
        # 16 nodes × 10 h; node faults in attempts 1 (two nodes) and 2; its own bugs in 3 and 4
        _job(
            "team-a",
            "p5.48xlarge",
            16,
            10 * H,
            [
                _bad(1, "XID 79", 79),
                {**_bad(1, "XID 79", 79), "node": "other"},
                _bad(2, "EFA error"),
                _bad(3, "exit 1"),
                _bad(4, "XID 13", 13),
            ],
        ),
        _job("team-b", "p4d.24xlarge", 4, 100 * H, [_bad(1, "XID 79", 79)]),  # another instance type
        # a tenant that fakes 20 XIDs in 2 node-hours: counted as 2 (its ceiling), not 20
        _job("team-c", "p5.48xlarge", 2, 1 * H, [_bad(n, "XID 79", 79) for n in range(1, 21)]),
        # a status claiming 10⁹ s run by a job created an hour ago: an hour
        _job("team-d", "p5.48xlarge", 1, 1e9, created=timestamp(NOW - dt.timedelta(hours=1))),
    ]
    node = reliability.estimate(jobs, "p5.48xlarge", t)
    assert node.failures == 2 + 2
    assert node.node_hours == pytest.approx(16 * 10 + 2 * 1 + 1 * 1)
    assert node.hours == pytest.approx((2 * P5_NODE_MTBF_H + 163) / (2 + 4))  # 2,138.8 h
    # hostile shapes never raise
    junk = [{}, {"spec": []}, {"spec": {"cluster": {"instanceType": "p5.48xlarge", "nodes": True}}, "status": 5}]
    assert reliability.estimate(junk, "p5.48xlarge", t).failures == 0


def test_fleet_reliability_is_computed_at_most_once_per_ttl():
    calls = []
    clock = [0.0]

    def jobs():
        calls.append(1)
        return [_job("a", "p5.48xlarge", 1, H)]

    fleet = reliability.FleetReliability(jobs, ttl=60, clock=lambda: clock[0], wall=lambda: NOW.timestamp())
    for _ in range(100):
        fleet.of("p5.48xlarge")
    clock[0] = 61
    fleet.of("p5.48xlarge")
    assert len(calls) == 2


# --- the spec -------------------------------------------------------------------------------------------


def test_interval_minutes_accepts_a_number_or_auto():
    assert CheckpointSpec().interval_minutes == 60  # the default stays
    assert CheckpointSpec.model_validate({"intervalMinutes": "auto"}).auto
    assert CheckpointSpec.model_validate({"intervalMinutes": 30}).fixed_interval_seconds == 1800


@pytest.mark.parametrize("bad", ["fast", "Auto", "60", -5, 0, 10081, 1.5, True, None])
def test_bad_interval_minutes_get_a_clear_error(bad):
    raw = {"model": {"preset": "tiny"}, "cluster": {"instanceType": "cpu"}, "checkpoint": {"intervalMinutes": bad}}
    with pytest.raises(InvalidJob) as err:
        validate(raw, "j", None)
    text = str(err.value)
    assert "spec.checkpoint.intervalMinutes" in text and "is not a number of minutes or 'auto'" in text
    assert 'a whole number of minutes from 1 to 10080, or "auto"' in text


def test_the_crd_takes_an_integer_or_auto():
    node = spec_schema()["properties"]["checkpoint"]["properties"]["intervalMinutes"]
    assert node["x-kubernetes-int-or-string"] is True and "type" not in node and node["default"] == 60
    (rule,) = node["x-kubernetes-validations"]
    assert rule["rule"] == "type(self) == int ? (self >= 1 && self <= 10080) : self == 'auto'"
    assert "auto" in rule["message"]


# --- decide: status.checkpoint and the pods' environment ------------------------------------------------

AUTO = gpu(16, checkpoint={"uri": "s3://b/ckpt/", "intervalMinutes": "auto"})
FLEET = cadence.node_mtbf("p5.48xlarge", 8, failures=2, node_hours=310)  # job MTBF 202.8 h


def _env(obj):
    (container,) = obj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


def test_an_auto_attempt_first_reads_the_instance_types_mtbf_then_renders_it():
    assert decide_(snap(spec=AUTO)).need == "node_mtbf"
    plan = decide_(snap(spec=AUTO, node_mtbf=FLEET, node_mtbf_read=True))
    env = _env(plan.create)
    assert float(env[cadence.MTBF_ENV]) == pytest.approx(202.8 * H, rel=1e-3)
    blocking = float(env[cadence.BLOCKING_ENV])
    assert 0 < blocking < 0.001  # the planner's estimate: the staging copy of a tiny model's shard

    created = decide_(
        snap(spec=AUTO, node_mtbf=FLEET, node_mtbf_read=True, created=CreateResult("j-a1", "created", "r"))
    )
    ck = created.status["checkpoint"]
    assert ck["attempt"] == 1 and ck["intervalSource"] == "auto" and ck["blockingMeasuredSaves"] == 0
    assert ck["intervalSeconds"] == round(max(300, math.sqrt(2 * ck["blockingSeconds"] * ck["mtbfSeconds"])))
    assert ck["failures"] == 2 and ck["nodeHours"] == 310 and ck["nodeMtbfHours"] == pytest.approx(3244.8, abs=0.1)
    assert ck["reason"].startswith("auto: √(2 × ")
    assert "(estimated) × 202.8 h MTBF (16 p5.48xlarge nodes, prior + 2 failures in 310 node-hours))" in ck["reason"]


def test_a_numeric_interval_is_recorded_without_reading_the_fleet():
    spec = gpu(2, checkpoint={"uri": "s3://b/ckpt/", "intervalMinutes": 45})
    plan = decide_(snap(spec=spec))
    assert plan.create is not None and cadence.MTBF_ENV not in _env(plan.create)
    created = decide_(snap(spec=spec, created=CreateResult("j-a1", "created", "r")))
    assert created.status["checkpoint"] == {
        "attempt": 1,
        "intervalSource": "spec",
        "intervalSeconds": 2700,
        "reason": "spec.checkpoint.intervalMinutes: 45",
        "updateTime": timestamp(NOW),
    }
    assert "checkpoint" not in decide_(snap(created=CreateResult("j-a1", "created", "r"))).status  # no uri


RECORDED = {
    "attempt": 1,
    "intervalSource": "auto",
    "intervalSeconds": 1200,
    "blockingSeconds": 0.5,
    "blockingMeasuredSaves": 0,
    "mtbfSeconds": 400 * 3600,
    "nodeMtbfHours": 6400.0,
    "failures": 0,
    "nodeHours": 0.0,
}


def _running_auto(progress: Progress, checkpoint=RECORDED):
    return snap(
        running(checkpoint=checkpoint),
        spec=AUTO,
        children=[ptj(1, "Running", raw_spec=AUTO)],
        progress=progress,
    )


def test_the_trainers_new_interval_reaches_status_checkpoint():
    p = Progress(
        step=50,
        heartbeat=NOW.timestamp() - 5,
        checkpoint_interval_seconds=9295.16,
        checkpoint_blocking_estimate_seconds=30.0,
        checkpoint_blocking_measured_saves=1,
    )
    plan = decide_(_running_auto(p))
    assert plan.situation == "steady"
    ck = plan.status["checkpoint"]
    assert (ck["intervalSeconds"], ck["blockingSeconds"], ck["blockingMeasuredSaves"]) == (9295, 30.0, 1)
    assert ck["mtbfSeconds"] == 400 * 3600  # the operator's, recorded at creation
    assert ck["reason"] == (
        "auto: √(2 × 30 s blocking (measured, 1 save) × 400.0 h MTBF (16 p5.48xlarge nodes, prior only)) = 155 min"
    )
    # nothing new: no write
    same = decide_(_running_auto(p, {**RECORDED, "intervalSeconds": 9295, "blockingMeasuredSaves": 1}))
    assert same.status is None or "checkpoint" not in same.status


def test_a_hostile_trainer_gauge_is_bounded():
    wild = Progress(
        step=50,
        heartbeat=NOW.timestamp() - 5,
        checkpoint_interval_seconds=1e12,
        checkpoint_blocking_estimate_seconds=30.0,
        checkpoint_blocking_measured_saves=1,
    )
    assert decide_(_running_auto(wild)).status["checkpoint"]["intervalSeconds"] == 86400
    nan = Progress(step=50, heartbeat=NOW.timestamp() - 5, checkpoint_interval_seconds=float("nan"))
    plan = decide_(_running_auto(nan))
    assert plan.status is None or "checkpoint" not in plan.status


def test_the_next_attempt_starts_from_the_measured_blocking_cost():
    status = {
        **running(checkpoint={**RECORDED, "blockingSeconds": 30.0, "blockingMeasuredSaves": 3}),
        "phase": "Restarting",
        "attempt": 2,
        "child": "j-a2",
        "attemptCreationTime": ago(seconds=1),
    }
    status["checkpoint"] = {**RECORDED, "blockingSeconds": 30.0, "blockingMeasuredSaves": 3}
    plan = decide_(snap(status, spec=AUTO, node_mtbf=FLEET, node_mtbf_read=True))
    assert plan.create is not None and plan.create["metadata"]["name"] == "j-a2"
    assert _env(plan.create)[cadence.BLOCKING_ENV] == "30"
    done = decide_(
        snap(status, spec=AUTO, node_mtbf=FLEET, node_mtbf_read=True, created=CreateResult("j-a2", "created", "r"))
    )
    assert "30 s blocking (measured by attempt 1)" in done.status["checkpoint"]["reason"]


def test_checkpoint_stale_follows_the_auto_interval():
    from llmtrain.controller.policy import health
    from llmtrain.validation import validate as v

    spec = v(AUTO, "j", "etcd:2379")
    status = running(checkpoint={**RECORDED, "intervalSeconds": 600}, progress={"lastCheckpointTime": ago(minutes=25)})
    stale = health._checkpoint_stale(spec, status, NOW - dt.timedelta(hours=1), NOW)
    assert stale.status and "2 × the auto interval (10 min)" in stale.message
    fresh = health._checkpoint_stale(spec, {**status, "checkpoint": None}, NOW - dt.timedelta(hours=1), NOW)
    assert not fresh.status  # no interval recorded yet: the longest auto interval (24 h) applies


def test_checkpoint_stale_counts_the_interval_the_attempt_runs_with():
    """A change of intervalMinutes applies from the next attempt: until then the trainer saves at
    the interval its pods were rendered with (status.checkpoint), so staleness counts that one."""
    from llmtrain.controller.policy import health
    from llmtrain.validation import validate as v

    now_60 = v(gpu(16, checkpoint={"uri": "s3://b/ckpt/", "intervalMinutes": 60}), "j", "etcd:2379")
    rendered_5 = {"attempt": 1, "intervalSource": "spec", "intervalSeconds": 300}
    status = running(checkpoint=rendered_5, progress={"lastCheckpointTime": ago(minutes=25)})
    stale = health._checkpoint_stale(now_60, status, NOW - dt.timedelta(hours=1), NOW)
    assert stale.status and "2 × checkpoint.intervalMinutes (5)" in stale.message
    # a record of an earlier attempt is not this one's: the spec's 60 minutes
    older = {**status, "checkpoint": {**rendered_5, "attempt": 0}}
    assert not health._checkpoint_stale(now_60, older, NOW - dt.timedelta(hours=1), NOW).status


def test_observe_reads_the_mtbf_from_the_jobs_the_operator_caches():
    """The estimate comes from the statuses the watch brought (the work queue's latest objects), so
    a restarted operator, seeing the same statuses, starts the next attempt with the same MTBF."""
    from prometheus_client import CollectorRegistry

    from llmtrain.controller.adapters.metrics import OperatorMetrics
    from llmtrain.controller.adapters.observe import more
    from llmtrain.controller.operator import Operator
    from llmtrain.controller.policy.config import OperatorConfig

    def operator_with(jobs):
        op = Operator(OperatorConfig(default_etcd_endpoint="etcd:2379"), OperatorMetrics(CollectorRegistry()))
        for i, job in enumerate(jobs):
            op.queue.observe((job["metadata"]["namespace"], f"j{i}"), job)
        return op

    jobs = [_job("team-a", "p5.48xlarge", 16, 10 * H, [_bad(1, "XID 79", 79), _bad(2, "EFA error")])]
    seen = [more(operator_with(jobs), snap(spec=AUTO), "node_mtbf").node_mtbf for _ in range(2)]
    assert seen[0] == seen[1] and seen[0].failures == 2 and seen[0].node_hours == pytest.approx(160)
    assert seen[0].hours == pytest.approx((2 * P5_NODE_MTBF_H + 160) / 4)
