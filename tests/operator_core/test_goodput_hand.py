"""The hand computation the goodput proofs compare status.goodput with (tests/goodput_hand.py), on a
step log made by hand: its buckets are the ones worked out below, and the operator's arithmetic
(llmtrain/goodput.py) on the records that log would give it (exact times, no scrape in between)
finds the same."""

from __future__ import annotations

import pytest

from goodput_hand import generations, hand
from llmtrain import goodput as gp


def _step(step: int, end: float, seconds: float = 1.0, wait: float = 0.0) -> dict:
    return {"event": "step", "step": step, "time": end, "step_seconds": seconds, "data_wait_seconds": wait}


# created 0; attempt 1's PyTorchJob at 1; its first process: steps 1 (2→3, 0.1 s data wait) and 2
# (3.5→4.5, after a 0.5 s save); killed, the second process resumes from step 1 at 6: step 2 again
# (redone) and 3; the pod fails, the attempt ends at 9; attempt 2 at 10 resumes from step 2: step 3
# again (11→12, redone) and 4; it succeeds at 14, the job's end.
ATTEMPT_1 = [
    {"event": "config", "in_place_restarts": 0},
    _step(1, 3.0, wait=0.1),
    _step(2, 4.5),
    {"event": "config", "in_place_restarts": 1},
    _step(2, 7.0),
    _step(3, 8.0),
]
ATTEMPT_2 = [{"event": "config", "in_place_restarts": 0}, _step(3, 12.0), _step(4, 13.0)]
RUNS = [
    {"created": 1.0, "end": 9.0, "why": "PodFailed", "gens": generations(ATTEMPT_1)},
    {"created": 10.0, "end": 14.0, "why": gp.SUCCEEDED, "gens": generations(ATTEMPT_2)},
]
EXPECTED = {
    "queued": 1.0,  # 0 → 1
    "starting": 2.0,  # 1 → 2, 10 → 11
    "productive": 3.9,  # steps 1 (less its wait), 2, 3 (first time) and 4
    "slow": 0.0,  # no straggler verdict
    "lostWork": 2.0,  # step 2 in the second process, step 3 in attempt 2
    "restarting": 3.5,  # 4.5 → 6 in place, 8 → 9 the failure, 9 → 10 the backoff
    "hang": 0.0,
    "checkpointStall": 1.5,  # the save 3 → 3.5, the end 13 → 14
    "dataWait": 0.1,
    "suspended": 0.0,
}


def test_generations_split_at_each_process():
    assert [[s["step"] for s in g] for g in generations(ATTEMPT_1)] == [[1, 2], [2, 3]]


def test_hand_buckets_of_a_made_up_log():
    b = hand(RUNS, 0.0, 14.0)
    assert b == pytest.approx(EXPECTED)
    assert sum(b.values()) == pytest.approx(14.0)


def test_the_operators_arithmetic_on_the_same_log_agrees():
    t = gp.Timeline(
        start=0.0,
        attempts=(
            gp.Attempt(
                1,
                created=1.0,
                end=9.0,
                end_reason="PodFailed",
                train_start=2.0,
                last_heartbeat=8.0,
                resume_step=0,
                last_step=3,
                steps=4,
                step_seconds=4.0,
                checkpoint_blocking_seconds=0.5,
                data_wait_seconds=0.1,
                in_place_restarts=1,
                in_place_restart_seconds=1.5,
                in_place_redone_steps=1,
                in_place_redone_seconds=1.0,
            ),
            gp.Attempt(
                2,
                created=10.0,
                end=14.0,
                end_reason=gp.SUCCEEDED,
                train_start=11.0,
                last_heartbeat=13.0,
                resume_step=2,
                last_step=4,
                steps=2,
                step_seconds=2.0,
                checkpoint_blocking_seconds=0.0,
                data_wait_seconds=0.0,
            ),
        ),
    )
    assert gp.buckets(t, 14.0) == pytest.approx(hand(RUNS, 0.0, 14.0))
