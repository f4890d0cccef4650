"""The health rules as pure functions (controller/policy/health.py) and the trainer's per-step loss facts
they read (llmtrain_trainer/metrics/losswatch.py): every rule fires on its trigger and stays quiet just
below it, with the spec's thresholds."""

from __future__ import annotations

import datetime as dt
import math

import pytest

from llmtrain.controller.policy import health
from llmtrain.controller.policy.child_status import progress_from_metrics
from llmtrain.controller.policy.progress import Progress, timestamp
from llmtrain.defaults import first_step_timeout_minutes, resolve
from llmtrain.spec import LLMTrainingJobSpec
from llmtrain.status import Reason

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def spec(resilience=None, checkpoint=None, **model) -> LLMTrainingJobSpec:
    return resolve(
        LLMTrainingJobSpec.model_validate(
            {
                "model": {"preset": "tiny", **model},
                "cluster": {"instanceType": "cpu"},
                "resilience": resilience or {},
                "checkpoint": checkpoint or {},
            }
        )
    )


def status(minutes_running: float, heartbeat_minutes_ago: float | None = None, **extra) -> tuple[dict, dt.datetime]:
    """A Running attempt's status `minutes_running` after it started, and the time it is judged at."""
    at = T0 + dt.timedelta(minutes=minutes_running)
    progress = dict(extra.pop("progress", {}))
    if heartbeat_minutes_ago is not None:
        progress["heartbeatTime"] = timestamp(at - dt.timedelta(minutes=heartbeat_minutes_ago))
    return {"phase": "Running", "attempt": 1, "attemptStartTime": timestamp(T0), "progress": progress, **extra}, at


def restart_of(s, st, at, progress=None):
    return health.evaluate(s, st, progress, at).restart


def test_no_first_step_after_the_allowance_restarts():
    s = spec({"firstStepTimeoutMinutes": 45, "hangTimeoutMinutes": 10})
    # Past the hang timeout but within the start-up allowance: loading is not a hang.
    assert restart_of(s, *status(44)) is None
    r = restart_of(s, *status(46))
    assert (r.reason, r.condition_reason, r.resume_before_step) == (Reason.NO_FIRST_STEP, "NoFirstStep", None)
    assert "firstStepTimeoutMinutes 45" in r.message
    # A step of the PREVIOUS attempt does not count as this attempt's first step.
    st, at = status(46)
    st["progress"]["heartbeatTime"] = timestamp(T0 - dt.timedelta(minutes=1))
    assert restart_of(s, st, at).reason == Reason.NO_FIRST_STEP


def test_hang_counts_from_the_last_step_once_there_was_one():
    s = spec({"firstStepTimeoutMinutes": 45, "hangTimeoutMinutes": 10})
    assert restart_of(s, *status(100, heartbeat_minutes_ago=9)) is None
    r = restart_of(s, *status(100, heartbeat_minutes_ago=11))
    assert (r.reason, r.condition_reason) == (Reason.HANG, "Hang") and "hangTimeoutMinutes 10" in r.message


def test_first_step_allowance_default_grows_with_what_a_node_loads():
    tiny = spec({"hangTimeoutMinutes": 30})
    assert tiny.resilience.first_step_timeout_minutes == 30 + 1  # the tiny model loads in well under a minute
    big = resolve(
        LLMTrainingJobSpec.model_validate(
            {
                "model": {"preset": "llama3-70b", "pretrainedUri": "s3://b/m/"},
                "cluster": {"instanceType": "p5.48xlarge", "nodes": 16},
                "resilience": {"hangTimeoutMinutes": 30},
            }
        )
    )
    # Every node reads the whole bf16 model (2 B × ~70.6 B params ≈ 141 GB) at 100 MB/s: ~24 min.
    minutes, why = first_step_timeout_minutes(big)
    assert big.resilience.first_step_timeout_minutes == minutes and 30 + 23 <= minutes <= 30 + 25, why
    assert "141" in why or "140" in why


def test_non_finite_losses_for_n_steps_roll_back_before_the_first_bad_one():
    s = spec({"nonFiniteLossSteps": 3})
    st, at = status(60, heartbeat_minutes_ago=0)
    assert restart_of(s, st, at, Progress(step=120, nonfinite_loss_max_steps=2, nonfinite_loss_first_step=118)) is None
    r = restart_of(s, st, at, Progress(step=120, nonfinite_loss_max_steps=3, nonfinite_loss_first_step=118))
    assert (r.reason, r.condition_reason, r.resume_before_step) == (Reason.NON_FINITE_LOSS, "NonFiniteLoss", 118)
    # The streak ended between two scrapes (the loss is finite again): the trainer's longest run still counts.
    r = restart_of(
        s,
        st,
        at,
        Progress(step=130, loss=2.0, nonfinite_loss_steps=0, nonfinite_loss_max_steps=5, nonfinite_loss_first_step=121),
    )
    assert r.resume_before_step == 121
    off = spec({"nonFiniteLossSteps": 0})
    assert restart_of(off, st, at, Progress(nonfinite_loss_max_steps=50, nonfinite_loss_first_step=1)) is None


def test_loss_spike_rolls_back_before_it_only_when_the_rule_is_on_and_past_min_steps():
    st, at = status(60, heartbeat_minutes_ago=0)
    spiked = Progress(step=510, loss_spike_step=503, loss_spike_ratio=3.1)
    assert restart_of(spec(), st, at, spiked) is None  # off by default
    on = spec({"lossSpikeFactor": 3.0, "lossSpikeMinSteps": 100}, {"uri": "s3://b/run"})
    r = restart_of(on, st, at, spiked)
    assert (r.reason, r.condition_reason, r.resume_before_step) == (Reason.LOSS_SPIKE, "LossSpike", 503)
    assert "s3://b/run/quarantine/" in r.message and "3.10×" in r.message
    # A spike the trainer recorded under a lower factor than the spec's current one is not a spike.
    assert restart_of(on, st, at, Progress(loss_spike_step=503, loss_spike_ratio=2.9)) is None
    # Before lossSpikeMinSteps the rule does not apply.
    assert restart_of(spec({"lossSpikeFactor": 3.0, "lossSpikeMinSteps": 600}), st, at, spiked) is None


def test_amend_writes_the_condition_and_the_rollback_with_the_restart():
    s = spec({"lossSpikeFactor": 2.0}, {"uri": "file:///ckpt"})
    st, at = status(60, heartbeat_minutes_ago=0)
    r = restart_of(s, st, at, Progress(loss_spike_step=300, loss_spike_ratio=4.0))
    up = r.amend(3, {"phase": "Restarting", "conditions": [{"type": "Ready", "status": "False"}]}, at)
    assert up["resumeBeforeStep"] == 300
    cond = next(c for c in up["conditions"] if c["type"] == "TrainingHealthy")
    assert (cond["status"], cond["reason"], cond["observedGeneration"]) == ("False", "LossSpike", 3)
    # A spent budget fails the job: nothing left to roll back.
    assert "resumeBeforeStep" not in r.amend(3, {"phase": "Failed", "conditions": []}, at)


def test_stale_checkpoint_is_a_warning_condition_and_clears():
    s = spec(checkpoint={"uri": "file:///ckpt", "intervalMinutes": 30})
    fresh, at = status(59, heartbeat_minutes_ago=0)
    v = health.evaluate(s, fresh, None, at)
    assert v.restart is None
    assert [(c.type, c.status) for c in v.conditions if c.type == "CheckpointStale"] == [("CheckpointStale", False)]
    assert health.changed_conditions([], v) == [c for c in v.conditions if c.type != "CheckpointStale"]
    stale, at = status(61, heartbeat_minutes_ago=0)
    v = health.evaluate(s, stale, None, at)
    c = next(c for c in v.conditions if c.type == "CheckpointStale")
    assert (c.status, c.reason, c.warn, v.restart) == (True, "NoRecentCheckpoint", True, None)
    # A checkpoint 10 minutes ago, an hour and a half into the attempt: not stale; the True clears.
    st, at = status(
        90, heartbeat_minutes_ago=0, progress={"lastCheckpointTime": timestamp(T0 + dt.timedelta(minutes=80))}
    )
    v = health.evaluate(s, st, None, at)
    changed = health.changed_conditions(
        [{"type": "CheckpointStale", "status": "True", "reason": "NoRecentCheckpoint"}], v
    )
    assert ("CheckpointStale", False, "CheckpointRecent") in [(c.type, c.status, c.reason) for c in changed]
    # No checkpoint location: no such condition at all.
    assert not [c for c in health.evaluate(spec(), stale, None, at).conditions if c.type == "CheckpointStale"]


def test_training_healthy_and_the_applied_rollback():
    s = spec()
    st, at = status(
        10,
        heartbeat_minutes_ago=0,
        resumeBeforeStep=300,
        conditions=[{"type": "TrainingHealthy", "status": "False", "reason": "LossSpike"}],
    )
    v = health.evaluate(s, st, Progress(step=250, resumed_before_step=300), at)
    assert v.rollback_applied == 300 and health.needs_write(st, v)
    assert [(c.type, c.status, c.reason) for c in health.changed_conditions(st["conditions"], v)] == [
        ("TrainingHealthy", True, "StepsCompleting")
    ]
    # Nothing new: no write (and no GET) on this scrape.
    quiet = {
        **st,
        "resumeBeforeStep": None,
        "conditions": [{"type": "TrainingHealthy", "status": "True", "reason": "StepsCompleting"}],
    }
    assert not health.needs_write(quiet, health.evaluate(s, quiet, Progress(step=251), at))


def test_progress_reads_the_loss_facts_and_never_writes_nan():
    from prometheus_client import generate_latest

    from llmtrain_trainer.metrics.prometheus import TrainerMetrics

    m = TrainerMetrics(job="j", rank=0)
    m.loss.set(math.nan)
    m.nonfinite_loss_steps.set(4)
    m.nonfinite_loss_max_steps.set(4)
    m.nonfinite_loss_first_step.set(17)
    m.loss_median.set(math.inf)
    m.loss_spike_step.set(9)
    m.loss_spike_ratio.set(2.5)
    p = progress_from_metrics(generate_latest(m.registry).decode())
    assert (p.nonfinite_loss_max_steps, p.nonfinite_loss_first_step, p.loss_spike_step, p.loss_spike_ratio) == (
        4,
        17,
        9,
        2.5,
    )
    out = p.as_status()
    assert "loss" not in out and "lossMedian" not in out  # the API server refuses NaN/Inf in JSON
    assert (out["nonFiniteLossSteps"], out["lossSpikeStep"], out["lossSpikeRatio"]) == (4, 9, 2.5)


def test_losswatch_records_every_step_between_scrapes():
    from llmtrain_trainer.metrics.losswatch import LossWatch

    w = LossWatch(window=5, factor=2.0, min_steps=8)
    losses = {s: 3.0 - 0.1 * s for s in range(1, 8)}  # falling: step 6 median 2.7 (steps 1-5), ratios < 1
    losses.update({8: 2.3, 9: 5.0, 10: 2.2, 11: 9.0})  # step 9: 5.0 / median(2.6..2.3) ≈ 2.08 > 2
    for step, loss in sorted(losses.items()):
        w.observe(step, loss)
    assert w.spike_step == 9 and w.spike_ratio == pytest.approx(5.0 / 2.4)  # the FIRST spike, not the largest
    w2 = LossWatch(window=5, factor=2.0, min_steps=10)  # same losses, the spike at 9 is before minSteps
    for step, loss in sorted(losses.items()):
        w2.observe(step, loss)
    assert w2.spike_step == 11
    n = LossWatch(window=5, factor=None, min_steps=0)
    for step, loss in [(1, 2.0), (2, math.nan), (3, math.inf), (4, 2.0), (5, math.nan), (6, math.nan), (7, math.nan)]:
        n.observe(step, loss)
    assert (n.streak, n.max_streak, n.max_streak_start) == (3, 3, 5)
    n.observe(8, 1.9)
    assert (n.streak, n.max_streak, n.max_streak_start) == (0, 3, 5)


def test_the_renderer_passes_a_pending_rollback_to_the_trainer():
    from llmtrain.backends.pytorchjob import render_pytorchjob

    def env(**kw) -> dict:
        ptj = render_pytorchjob(spec(), "j", "ns", 2, "uid", "etcd:2379", **kw)
        c = ptj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
        return {e["name"]: e.get("value") for e in c["env"]}

    assert env(resume_before_step=290)["LLMTRAIN_RESUME_BEFORE_STEP"] == "290"
    assert "LLMTRAIN_RESUME_BEFORE_STEP" not in env() and "LLMTRAIN_RESUME_BEFORE_STEP" not in env(
        resume_before_step=None
    )


def test_a_spike_factor_of_one_or_less_is_refused_with_the_field():
    from llmtrain.validation import InvalidJob, validate

    with pytest.raises(InvalidJob, match=r"spec.resilience.lossSpikeFactor: 1.0 is out of range \(accepted: > 1.0\)"):
        validate(
            {"model": {"preset": "tiny"}, "cluster": {"instanceType": "cpu"}, "resilience": {"lossSpikeFactor": 1.0}},
            "x",
            "etcd:2379",
        )


def test_the_trainers_loss_facts_reach_the_operator_under_the_names_it_reads():
    from prometheus_client import generate_latest

    from llmtrain_trainer.metrics.losswatch import LossWatch
    from llmtrain_trainer.metrics.prometheus import TrainerMetrics

    w = LossWatch(window=3, factor=2.0, min_steps=0)
    for step, loss in enumerate([2.0, 2.1, 1.9, 4.5, math.nan, math.nan], start=1):
        w.observe(step, loss)
    m = TrainerMetrics(job="j", rank=0)
    w.export(m)
    p = progress_from_metrics(generate_latest(m.registry).decode())
    assert (p.loss_spike_step, p.loss_spike_ratio) == (4, pytest.approx(4.5 / 2.0))
    assert (p.nonfinite_loss_steps, p.nonfinite_loss_max_steps, p.nonfinite_loss_first_step) == (2, 2, 5)
    assert p.loss_median == 2.0
