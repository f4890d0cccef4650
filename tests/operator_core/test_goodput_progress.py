"""The trainer's goodput counters, from its real Prometheus exposition through the operator's
bounded scrape into status.progress, and the ETA computed from them."""

from __future__ import annotations

import datetime as dt

import pytest
from prometheus_client import generate_latest

from llmtrain.controller.policy.progress import eta, parse_progress
from llmtrain_trainer.metrics.prometheus import TrainerMetrics

AT = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)


def test_the_scrape_reads_the_goodput_counters():
    m = TrainerMetrics(job="j", rank=0)
    m.train_start_timestamp_seconds.set(AT.timestamp() - 600)
    m.resume_step.set(80)
    for _ in range(4):
        m.step_seconds.observe(2.5)
        m.data_wait_seconds.observe(0.25)
    m.checkpoint_blocking_seconds.inc(7.5)
    m.step.set(84)
    # a trainer from before the attempt-wide series (metrics/restarts.py): the per-process ones count
    body = b"".join(
        line
        for line in generate_latest(m.registry).splitlines(keepends=True)
        if b"llmtrain_trainer_attempt_" not in line and b"llmtrain_trainer_inplace_" not in line
    )
    p = parse_progress(body)
    assert (p.resume_step, p.step_seconds_count, p.step_seconds_sum) == (80, 4, 10.0)
    assert (p.checkpoint_blocking_seconds, p.data_wait_seconds) == (7.5, 1.0)
    s = p.as_status()
    assert s["trainStartTime"] == "2026-03-01T11:50:00Z"
    assert {
        k: s[k] for k in ("resumeStep", "attemptSteps", "stepSeconds", "checkpointBlockingSeconds", "dataWaitSeconds")
    } == {
        "resumeStep": 80,
        "attemptSteps": 4,
        "stepSeconds": 10.0,
        "checkpointBlockingSeconds": 7.5,
        "dataWaitSeconds": 1.0,
    }


def test_eta_uses_the_recent_step_time_and_the_checkpoint_stall():
    now = {"attempt": 2, "step": 600, "attemptSteps": 500, "stepSeconds": 1500.0, "checkpointBlockingSeconds": 50.0}
    # the last 100 steps took 2 s each (the attempt's mean is 3 s); checkpoints cost 0.1 s a step
    before = {"attempt": 2, "attemptSteps": 400, "stepSeconds": 1300.0}
    got = eta(now, before, 1000, AT)
    assert got == {"estimatedRemainingSeconds": 400 * 2.1, "estimatedCompletionTime": "2026-03-01T12:14:00Z"}
    # the previous scrape was another attempt's: the mean of this one
    assert eta(now, {**before, "attempt": 1}, 1000, AT)["estimatedRemainingSeconds"] == 400 * 3.1
    assert eta({**now, "step": 1000}, before, 1000, AT)["estimatedRemainingSeconds"] == 0
    assert eta({"step": 5}, {}, 1000, AT) == {}  # no step timed yet


def test_the_trainers_times_keep_their_fraction_of_a_second():
    """trainStartTime and heartbeatTime bound an attempt's steps in status.goodput. Cut to whole
    seconds, the loop's start moved up to 1 s earlier in every attempt, always from starting into
    productive, and the last step likewise from productive into the tail: a bias of up to 2 s per
    attempt that the chain's proof (tests/chain/test_goodput_chain.py), comparing with the step
    log, cannot tell from a mis-assigned bucket."""
    from llmtrain import goodput as gp

    created = AT.timestamp() - 610
    m = TrainerMetrics(job="j", rank=0)
    m.train_start_timestamp_seconds.set(AT.timestamp() - 599.75)
    m.heartbeat_timestamp_seconds.set(AT.timestamp() - 0.375)
    m.step.set(10)
    s = parse_progress(generate_latest(m.registry)).as_status()
    assert (s["trainStartTime"], s["heartbeatTime"]) == ("2026-03-01T11:50:00.250Z", "2026-03-01T11:59:59.625Z")
    g = gp.closed(gp.opened({}, 1, created, job_created=created), 1, AT.timestamp(), "PodFailed", {**s, "attempt": 1})
    b = gp.buckets(gp.timeline_of(g, created), AT.timestamp())
    assert b["starting"] == pytest.approx(10.25, abs=1e-3)
    assert b["productive"] == pytest.approx(599.375, abs=1e-3) and b["restarting"] == pytest.approx(0.375, abs=1e-3)


@pytest.mark.parametrize(
    "series",
    [
        "llmtrain_trainer_step +Inf",
        "llmtrain_trainer_step 1e300",
        "llmtrain_trainer_last_checkpoint_step -Inf",
        "llmtrain_trainer_last_checkpoint_timestamp_seconds 1e20",
        "llmtrain_trainer_heartbeat_timestamp_seconds +Inf",
        "llmtrain_trainer_heartbeat_timestamp_seconds -1e20",
        "llmtrain_trainer_train_start_timestamp_seconds 1e20",
        "llmtrain_trainer_step NaN",
    ],
)
def test_a_tenant_number_out_of_range_is_dropped_not_raised(series):
    """The scrape body is the tenant's: a value no status field can hold (an infinite step, a
    timestamp past year 9999) is left out of status.progress; the rest of the scrape still reads."""
    body = f"{series}\nllmtrain_trainer_loss 2.5\n"
    status = parse_progress(body).as_status()
    assert status.get("loss") == 2.5
    dropped = {"step", "lastCheckpointStep", "lastCheckpointTime", "heartbeatTime", "trainStartTime"}
    assert not dropped & set(status), (series, status)


def test_where_the_attempt_resumed_from_reaches_status_and_the_attempts_record():
    """llmtrain_trainer_resume_tier (the trainer's resume: durable checkpoint or in-memory snapshots)
    → status.progress.resumeFrom → the attempt's goodput record, by name; a value the trainer cannot
    have written (the tenant's scrape body) is left out."""
    from llmtrain import goodput as gp
    from llmtrain.status import ProgressStatus

    m = TrainerMetrics(job="j", rank=0)
    m.resume_tier.set(3)
    s = parse_progress(generate_latest(m.registry)).as_status()
    assert s["resumeFrom"] == "partner"
    ProgressStatus.model_validate(s)  # the CRD's schema takes it
    created = AT.timestamp() - 60
    rec = gp.attempt_from({"attempt": 2, "createdTime": "2026-03-01T11:59:00Z"}, {**s, "attempt": 2})
    assert rec is not None and rec.resume_from == "partner" and created == rec.created
    for value in ("4", "-1", "NaN", "2.5e9"):
        got = parse_progress(f"llmtrain_trainer_resume_tier {value}\n").as_status()
        assert "resumeFrom" not in got, (value, got)
    assert (
        gp.attempt_from({"attempt": 2, "createdTime": "2026-03-01T11:59:00Z", "resumeFrom": "disk"}).resume_from is None
    )
