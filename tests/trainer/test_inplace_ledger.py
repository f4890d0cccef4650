"""The in-place restart ledger (llmtrain_trainer/metrics/restarts.py) on hand-made process histories:
each case would fail if a process's counters were dropped or a span counted twice."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from llmtrain.controller.policy.progress import parse_progress
from llmtrain_trainer.metrics.prometheus import TrainerMetrics
from llmtrain_trainer.metrics.restarts import SLOT_BYTES, AttemptLedger, ledger_path, read_ledger


def _process(path, run="run-a", attempt=1) -> AttemptLedger:
    return AttemptLedger(path, run, attempt)


def test_a_restarted_process_carries_the_attempt_and_counts_its_gap_once(tmp_path):
    path = ledger_path(str(tmp_path), 0)
    p1 = _process(path)
    p1.loop_started(100.0, resume_step=0)
    for step in range(1, 31):  # 30 steps of 1 s, 0.1 s of it data wait; a 2 s save after step 20
        p1.step(step, 1.0, 0.1, 100.0 + step + (2.0 if step > 20 else 0.0))
        if step == 20:
            p1.saved(2.0, 122.0)
    # step 30 ended at 132; the process died; the next one's loop began at 150 from step 20
    p2 = _process(path)
    assert p2.state.processes == 2 and p2.state.in_place_restarts == 1
    p2.loop_started(150.0, resume_step=20)
    assert p2.state.restart_seconds == 0.0  # held back until a step of this process completes
    for step in range(21, 41):
        p2.step(step, 1.5, 0.2, 150.0 + 1.5 * (step - 20))
    s = p2.state
    assert (s.train_start, s.resume_step) == (100.0, 0)  # the first process's
    assert (s.steps, s.step_seconds, s.data_wait_seconds) == (50, pytest.approx(60.0), pytest.approx(7.0))
    assert s.checkpoint_blocking_seconds == 2.0
    assert s.restart_seconds == pytest.approx(150.0 - 132.0)
    assert (s.redone_steps, s.redone_seconds) == (10, pytest.approx(10 * 1.3))  # 21..30, less data wait
    assert s.high_step == 40 and s.heartbeat == 180.0
    on_disk = read_ledger(path, "run-a", 1)
    assert on_disk is not None and on_disk["restart_seconds"] == pytest.approx(18.0) and on_disk["steps"] == 50


def test_a_process_that_dies_before_its_first_step_passes_its_time_on(tmp_path):
    path = ledger_path(str(tmp_path), 0)
    p1 = _process(path)
    p1.loop_started(0.0, 0)
    p1.step(1, 1.0, 0.0, 10.0)
    p2 = _process(path)
    p2.loop_started(20.0, 0)  # died before a step: 10 s pending
    p3 = _process(path)
    p3.loop_started(35.0, 0)  # 15 s more
    p3.step(1, 1.0, 0.0, 36.0)
    s = p3.state
    assert s.processes == 3 and s.in_place_restarts == 2
    assert s.restart_seconds == pytest.approx(25.0) and s.pending_restart_seconds == 0.0
    assert (s.redone_steps, s.redone_seconds) == (1, pytest.approx(1.0))


def test_another_attempt_or_run_or_a_garbage_file_starts_afresh(tmp_path):
    path = ledger_path(str(tmp_path), 1)
    p = _process(path)
    p.loop_started(0.0, 0)
    p.step(1, 1.0, 0.0, 1.0)
    assert _process(path, attempt=2).state.processes == 1
    assert _process(path, run="run-b").state.processes == 1
    with open(path, "w") as f:
        f.write('{"run_id": "run-a", "attempt": 1, "steps": -5, "seq": 9}')
    assert _process(path).state.steps == 0
    with open(path, "w") as f:
        f.write("x" * 10000)
    assert _process(path).state.processes == 1


def test_a_write_torn_by_a_kill_leaves_the_other_slot(tmp_path):
    path = ledger_path(str(tmp_path), 0)
    p = _process(path)
    p.loop_started(0.0, 0)
    p.step(1, 1.0, 0.0, 1.0)
    p.step(2, 1.0, 0.0, 2.0)
    newest = read_ledger(path, "run-a", 1)
    assert newest is not None and newest["steps"] == 2
    with open(path, "r+b") as f:  # the newest slot half-written when the process died
        f.seek((newest["seq"] % 2) * SLOT_BYTES)
        f.write(b'{"run_id":"run-a","attempt":1,"steps":3,' + b"\0" * 40)
    assert _process(path).state.steps == 1  # the slot before: one step less, nothing garbled


def test_the_scrape_prefers_the_attempt_wide_counters(tmp_path):
    ledger = _process(ledger_path(str(tmp_path), 0))
    ledger.loop_started(0.0, 0)
    for step in range(1, 5):
        ledger.step(step, 2.0, 0.5, 2.0 * step)
    ledger = _process(ledger.path)
    ledger.loop_started(20.0, 0)
    ledger.step(1, 3.0, 0.5, 23.0)  # redone
    m = TrainerMetrics(job="j", rank=0)
    m.step_seconds.observe(3.0)  # this process's own: 1 step
    m.export_ledger(ledger, restart_count=0)
    s = parse_progress(generate_latest(m.registry)).as_status()
    assert (s["attemptSteps"], s["stepSeconds"], s["dataWaitSeconds"]) == (5, 11.0, 2.5)
    assert (s["inPlaceRestarts"], s["inPlaceRestartSeconds"]) == (1, 12.0)
    assert (s["inPlaceRedoneSteps"], s["inPlaceRedoneSeconds"]) == (1, 2.5)
    # without a ledger (no staging volume) torchrun's own count still shows
    m.export_ledger(_process(None), restart_count=2)
    assert parse_progress(generate_latest(m.registry)).as_status()["inPlaceRestarts"] == 2
