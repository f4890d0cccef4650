"""The goodput bucket arithmetic (llmtrain/goodput.py) on hand-made timelines.

Every case states all ten buckets, worked out by hand in the comments from the timeline's times
and counters: a bucket counted twice or left out changes one figure (and the sum) and fails.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmtrain import goodput as gp
from llmtrain.goodput import Attempt, Timeline


def expect(**nonzero: float) -> dict[str, float]:
    out = gp.zero()
    out.update(nonzero)
    return out


def check(t: Timeline, now: float, want: dict[str, float]) -> dict[str, float]:
    got = gp.buckets(t, now)
    assert got == pytest.approx(want), {k: (got[k], want[k]) for k in gp.BUCKETS if got[k] != pytest.approx(want[k])}
    assert sum(got.values()) == pytest.approx(now - t.start + sum(t.earlier.values()))
    return got


def test_no_attempt_yet_is_queued():
    check(Timeline(start=0.0), 42.0, expect(queued=42.0))


def test_one_running_attempt():
    # created 0; PyTorchJob 10; loop 40; now 160: 120 s of steps, of which 5 s checkpoint stall
    # and 3 s data wait (the current attempt: its counters up to its last scrape, the rest steps).
    a = Attempt(
        1,
        created=10,
        train_start=40,
        last_heartbeat=150,
        resume_step=0,
        last_step=50,
        steps=50,
        step_seconds=110,
        checkpoint_blocking_seconds=5,
        data_wait_seconds=3,
    )
    got = check(
        Timeline(start=0.0, attempts=(a,)),
        160.0,
        expect(queued=10, starting=30, checkpointStall=5, dataWait=3, productive=112),
    )
    assert gp.ratio(got) == pytest.approx(112 / 160)


def test_hang_then_restart_with_redone_steps():
    # a1: PyTorchJob 10, loop 40, last step at 200 (step 100), hang detected 260
    #     starting 30; inside 40..200 = 160: stall 6, data wait 4, productive 150; hang 60
    # backoff 260..290: restarting 30
    # a2: PyTorchJob 290, loop 330, resumed from step 80, at step 200 after 120 steps of 2 s; now 600
    #     starting 40; inside 330..600 = 270: stall 10, lost work (100 - 80) × 2 s = 40, productive 220
    a1 = Attempt(
        1,
        created=10,
        end=260,
        end_reason="Hang",
        train_start=40,
        last_heartbeat=200,
        resume_step=0,
        last_step=100,
        steps=100,
        step_seconds=150,
        checkpoint_blocking_seconds=6,
        data_wait_seconds=4,
    )
    a2 = Attempt(
        2,
        created=290,
        train_start=330,
        last_heartbeat=590,
        resume_step=80,
        last_step=200,
        steps=120,
        step_seconds=240,
        checkpoint_blocking_seconds=10,
        data_wait_seconds=0,
    )
    t = Timeline(start=0.0, attempts=(a2, a1))  # order of the records does not matter
    got = check(
        t,
        600.0,
        expect(
            queued=10, starting=70, hang=60, restarting=30, checkpointStall=16, dataWait=4, lostWork=40, productive=370
        ),
    )
    assert gp.ratio(got) == pytest.approx(370 / 600)
    assert gp.steps_redone(t) == 20


def test_redone_steps_are_priced_without_their_data_wait_which_is_data_wait_once():
    # test_hang_then_restart's a2, but 24 s of its 240 s of steps waited for data: the 20 redone
    # steps cost (240 - 24) / 120 = 1.8 s each of compute, 36 s of lost work; the 24 s are data
    # wait (once); inside 330..600 = 270: stall 10, data wait 24, lost 36, productive 200
    a2 = Attempt(
        2,
        created=290,
        train_start=330,
        last_heartbeat=590,
        resume_step=80,
        last_step=200,
        steps=120,
        step_seconds=240,
        checkpoint_blocking_seconds=10,
        data_wait_seconds=24,
    )
    a1 = Attempt(1, created=10, end=290, end_reason="Failed", train_start=40, last_heartbeat=290, last_step=100)
    check(
        Timeline(start=0.0, attempts=(a1, a2)),
        600.0,
        expect(queued=10, starting=30 + 40, productive=250 + 200, checkpointStall=10, dataWait=24, lostWork=36),
    )


def test_failure_tail_is_restarting_and_success_tail_is_the_final_save():
    # a1 fails: last step 100, the PyTorchJob Failed seen at 130 → tail 30 restarting; next at 150 (20 more)
    # a2 succeeds: last step 400, completion 420 → tail 20 checkpoint stall (the final save)
    a1 = Attempt(
        1,
        created=0,
        end=130,
        end_reason="Failed",
        train_start=20,
        last_heartbeat=100,
        last_step=10,
        resume_step=0,
        steps=10,
        step_seconds=80,
    )
    a2 = Attempt(
        2,
        created=150,
        end=420,
        end_reason="Succeeded",
        train_start=160,
        last_heartbeat=400,
        resume_step=10,
        last_step=30,
        steps=20,
        step_seconds=240,
    )
    check(
        Timeline(start=0.0, attempts=(a1, a2)),
        420.0,
        expect(starting=30, productive=80 + 240, restarting=50, checkpointStall=20),
    )


# --- in-place restarts: one attempt, several worker processes (trainer restarts.py) --------------


def _in_place_attempt(**over) -> Attempt:
    # PyTorchJob 0, first process's loop 20; it reached step 60 at 140 (2 s a step), then died.
    # torchrun restarted the workers in place; the next process's loop began at 155 (a 15 s gap),
    # resumed from the checkpoint at step 50, redid 51..60 (10 steps, 20.5 s measured) and reached
    # step 100 at 255 (50 steps, 100 s). The trainer's attempt-wide counters: 110 steps, 220 s of
    # step time (of which 20.5 s redone), 4 s checkpoint stall, 1 s data wait, 15 s restarting.
    kw: dict = {
        "created": 0,
        "train_start": 20,
        "last_heartbeat": 255,
        "resume_step": 0,
        "last_step": 100,
        "steps": 110,
        "step_seconds": 220,
        "checkpoint_blocking_seconds": 4,
        "data_wait_seconds": 1,
        "in_place_restarts": 1,
        "in_place_restart_seconds": 15,
        "in_place_redone_steps": 10,
        "in_place_redone_seconds": 20.5,
    }
    kw.update(over)
    return Attempt(1, **kw)


def test_in_place_restart_gap_is_restarting_and_redone_steps_are_lost_work():
    # 0..20 starting; 20..255 = 235 s: stall 4, data wait 1, lost 20.5, restarting 15, productive
    # 194.5; 255..260 of the current attempt counts as its steps go (productive)
    t = Timeline(start=0.0, attempts=(_in_place_attempt(),))
    got = check(
        t, 260.0, expect(starting=20, checkpointStall=4, dataWait=1, lostWork=20.5, restarting=15, productive=199.5)
    )
    # dropped, the gap would pass for productive time; counted twice, productive would be 184.5
    assert got["productive"] == pytest.approx(260 - 20 - 4 - 1 - 20.5 - 15)
    assert gp.steps_redone(t) == 10


def test_in_place_restarts_and_a_later_attempt_each_count_their_own_redone_steps():
    # a1 as above but failed at 270 (its last in-place restart spent: the pod failed) → tail 15
    # restarting; a2: PyTorchJob 300, loop 330, resumed from step 90 (a1 reached 100), 30 steps of
    # 3 s to step 120 at 420; now 420: lost (100 - 90) × 3 = 30 s, productive 60
    a1 = _in_place_attempt(end=270, end_reason="Failed")
    a2 = Attempt(
        2, created=300, train_start=330, last_heartbeat=420, resume_step=90, last_step=120, steps=30, step_seconds=90
    )
    t = Timeline(start=0.0, attempts=(a1, a2))
    check(
        t,
        420.0,
        expect(
            starting=20 + 30,
            checkpointStall=4,
            dataWait=1,
            lostWork=20.5 + 30,
            restarting=15 + 15 + 30,
            productive=194.5 + 60,
        ),
    )
    assert gp.steps_redone(t) == 10 + 10


def test_in_place_counters_go_through_status_progress_into_the_attempt_record():
    progress = {
        "attempt": 1,
        "trainStartTime": gp.stamp(20),
        "heartbeatTime": gp.stamp(255),
        "resumeStep": 0,
        "step": 100,
        "attemptSteps": 110,
        "stepSeconds": 220.0,
        "checkpointBlockingSeconds": 4.0,
        "dataWaitSeconds": 1.0,
        "inPlaceRestarts": 1,
        "inPlaceRestartSeconds": 15.0,
        "inPlaceRedoneSteps": 10,
        "inPlaceRedoneSeconds": 20.5,
    }
    g = gp.opened({}, 1, 0.0, job_created=0.0)
    live = gp.timeline_of(g, 0.0, progress)
    g = gp.closed(g, 1, 270.0, "Failed", progress)
    assert g["attempts"][0]["inPlaceRestarts"] == 1 and g["attempts"][0]["inPlaceRestartSeconds"] == 15.0
    # the record keeps exactly what the live attempt was computed from
    assert live.attempts[0] == replace(gp.timeline_of(g, 0.0).attempts[0], end=None, end_reason=None)
    assert gp.buckets(gp.timeline_of(g, 0.0), 270.0) == pytest.approx(
        expect(starting=20, checkpointStall=4, dataWait=1, lostWork=20.5, restarting=15 + 15, productive=194.5)
    )


def test_attempt_that_never_began_its_loop_is_all_starting():
    a1 = Attempt(1, created=5, end=305, end_reason="StartupTimeout")
    a2 = Attempt(2, created=320)
    check(Timeline(start=0.0, attempts=(a1, a2)), 400.0, expect(queued=5, starting=300 + 80, restarting=15))


def test_suspended_spans_are_left_out_of_the_ratio():
    # created suspended 0..50; attempt 1 at 60; suspended at 200 (last step 190: tail 10 = the
    # SIGTERM save); resumed 500 → attempt 2 at 500, loop 520; now 600
    a1 = Attempt(1, created=60, end=200, end_reason="Suspended", train_start=80, last_heartbeat=190)
    a2 = Attempt(2, created=500, train_start=520)
    t = Timeline(start=0.0, attempts=(a1, a2), suspensions=((0, 50), (200, 500)))
    got = check(
        t, 600.0, expect(suspended=50 + 300, queued=10, starting=20 + 20, checkpointStall=10, productive=110 + 80)
    )
    assert gp.ratio(got) == pytest.approx(190 / 250)


def test_still_suspended_counts_to_now():
    a1 = Attempt(1, created=0, end=100, end_reason="Suspended", train_start=10, last_heartbeat=100)
    got = check(
        Timeline(start=0.0, attempts=(a1,), suspensions=((100, None),)),
        1000.0,
        expect(starting=10, productive=90, suspended=900),
    )
    assert gp.ratio(got) == pytest.approx(90 / 100)


def test_counters_beyond_the_span_are_clamped_not_double_counted():
    # a stale or hostile scrape: more blocking + data wait than the attempt ran
    a = Attempt(
        1,
        created=0,
        end=100,
        end_reason="Failed",
        train_start=10,
        last_heartbeat=90,
        checkpoint_blocking_seconds=70,
        data_wait_seconds=70,
    )
    check(
        Timeline(start=0.0, attempts=(a,)), 100.0, expect(starting=10, checkpointStall=70, dataWait=10, restarting=10)
    )


def test_clock_skew_never_makes_negative_time():
    # the next attempt "created" before the previous one ended, a loop start after the end
    a1 = Attempt(1, created=10, end=100, end_reason="Failed")
    a2 = Attempt(2, created=90, train_start=500)
    check(Timeline(start=0.0, attempts=(a1, a2)), 200.0, expect(queued=10, starting=90 + 100))


# --- the status form: what decide writes and what the report reads -------------------------------


def _records(n: int, keep: int = gp.MAX_ATTEMPTS) -> tuple[dict, float]:
    """n attempts of 100 s each (20 s starting, 70 s steps, 10 s tail), 15 s apart, each redoing
    5 steps; the last one running."""
    g: dict = {}
    t = 5.0
    for i in range(1, n + 1):
        g = gp.opened(g, i, t, job_created=0.0, keep=keep)
        prog = {
            "attempt": i,
            "trainStartTime": gp.stamp(t + 20),
            "heartbeatTime": gp.stamp(t + 90),
            "resumeStep": (i - 1) * 10,
            "step": i * 10 + 5,
            "attemptSteps": 15,
            "stepSeconds": 70.0,
            "checkpointBlockingSeconds": 2.0,
        }
        if i < n:
            g = gp.closed(g, i, t + 100, "Failed", prog)
        t += 115
    return g, t


def test_folding_old_attempts_keeps_the_buckets():
    folded, now = _records(40)
    assert len(folded["attempts"]) == gp.MAX_ATTEMPTS and folded["earlierUntil"]
    plain, _ = _records(40, keep=1000)
    assert len(plain["attempts"]) == 40
    a = gp.buckets(gp.timeline_of(folded, 0.0), now)
    b = gp.buckets(gp.timeline_of(plain, 0.0), now)
    assert a == pytest.approx(b, abs=0.01)  # the folded buckets are kept to the millisecond
    # attempts 2..39 redid 5 steps each (the 40th: no scrape given)
    assert b["queued"] == pytest.approx(5) and b["lostWork"] == pytest.approx(38 * 5 * 70 / 15)
    assert gp.steps_redone(gp.timeline_of(folded, 0.0)) <= gp.steps_redone(gp.timeline_of(plain, 0.0)) == 38 * 5


def test_status_round_trip_uses_the_current_attempts_live_counters_only():
    g = gp.opened({}, 1, 10.0, job_created=0.0)
    stale = {"attempt": 0, "trainStartTime": gp.stamp(20), "checkpointBlockingSeconds": 50.0}
    t = gp.timeline_of(g, 0.0, stale)
    assert gp.buckets(t, 100.0) == pytest.approx(expect(queued=10, starting=90))
    live = {**stale, "attempt": 1}
    assert gp.buckets(gp.timeline_of(g, 0.0, live), 100.0) == pytest.approx(
        expect(queued=10, starting=10, checkpointStall=50, productive=30)
    )
    s = gp.summary(gp.timeline_of(g, 0.0, live), 100.0)
    assert s["wallSeconds"] == 100.0 and s["ratio"] == 0.3


def test_suspend_and_resume_records():
    g = gp.suspended({}, 0.0)
    g = gp.suspended(g, 5.0)  # already suspended: one span
    g = gp.resumed(g, 50.0)
    assert g["suspensions"] == [{"startTime": gp.stamp(0), "endTime": gp.stamp(50)}]
    g = gp.opened(g, 1, 60.0, job_created=0.0)
    assert gp.buckets(gp.timeline_of(g, 0.0), 100.0) == pytest.approx(expect(suspended=50, queued=10, starting=40))


def test_time_a_queue_held_the_attempt_is_queued_not_starting():
    # attempt 1 created at 10 suspended for a queue, admitted at 70, loop at 100; attempt 2 admitted at once
    a1 = Attempt(1, created=10, admitted=70, end=200, end_reason="Failed", train_start=100, last_heartbeat=200)
    a2 = Attempt(2, created=210, admitted=250, train_start=260)
    check(
        Timeline(start=0.0, attempts=(a1, a2)),
        300.0,
        expect(queued=10 + 60 + 40, starting=30 + 10, productive=100 + 40, restarting=10),
    )
    g = gp.admitted(gp.opened({}, 1, 10.0, job_created=0.0), 1, 70.0)
    assert gp.timeline_of(g, 0.0).attempts[0].admitted == 70.0
    assert gp.admitted(g, 1, 90.0) == g  # the first admission counts


# --- slow: the time lost to a straggler (status.straggler's verdict spans) -----------------------


def test_a_standing_straggler_verdict_takes_its_share_of_the_productive_time():
    # test_one_running_attempt's attempt (loop 40 → now 160: 120 s, 112 s of it productive), with a
    # straggler verdict standing since 100 at slowdown 2: its 60 s hold 60 × 112/120 = 56 s of
    # productive time, of which a job twice as slow as it would be loses half: 28 s
    a = Attempt(
        1,
        created=10,
        train_start=40,
        last_heartbeat=150,
        resume_step=0,
        last_step=50,
        steps=50,
        step_seconds=110,
        checkpoint_blocking_seconds=5,
        data_wait_seconds=3,
        slow_since=100,
        slowdown=2.0,
    )
    got = check(
        Timeline(start=0.0, attempts=(a,)),
        160.0,
        expect(queued=10, starting=30, checkpointStall=5, dataWait=3, slow=28, productive=84),
    )
    assert gp.ratio(got) == pytest.approx(84 / 160)
    assert "slow" in gp.BADPUT  # the gauge llmtrain_job_badput_seconds{kind="slow"}


def test_ended_verdicts_of_an_ended_attempt_keep_their_lost_seconds():
    # loop 20 → last step 180 (160 s, no counters), the final save 180 → 200; the verdicts that
    # stood lost 40 s (slowSeconds): a quarter of the 160 s
    a = Attempt(1, created=0, end=200, end_reason=gp.SUCCEEDED, train_start=20, last_heartbeat=180, slow_seconds=40)
    check(
        Timeline(start=0.0, attempts=(a,)),
        200.0,
        expect(starting=20, slow=40, productive=120, checkpointStall=20),
    )


def test_a_verdict_span_opens_changes_figures_and_closes_in_the_record():
    g = gp.opened({}, 1, 10.0, job_created=0.0)
    g1 = gp.slow_began(g, 1, 100.0, 2.0)
    rec = g1["attempts"][0]
    assert (rec["slowSince"], rec["slowdown"], rec.get("slowSeconds")) == (gp.stamp(100.0), 2.0, None)
    assert gp.slow_began(g1, 1, 110.0, 2.0) == g1  # the same figures: the span goes on
    g2 = gp.slow_began(g1, 1, 130.0, 4.0)  # new figures: 30 s at 2× lost 15 s; from 130 at 4×
    rec = g2["attempts"][0]
    assert (rec["slowSince"], rec["slowdown"], rec["slowSeconds"]) == (gp.stamp(130.0), 4.0, 15.0)
    g3 = gp.slow_ended(g2, 1, 150.0)  # 20 s at 4×: 15 s more
    rec = g3["attempts"][0]
    assert rec["slowSeconds"] == 30.0 and "slowSince" not in rec and "slowdown" not in rec
    assert gp.slow_ended(g3, 1, 170.0) == g3
    # the attempt ends while the verdict stands: the span closes with it, and nothing reopens it
    ended = gp.closed(g2, 1, 150.0, "Failed", None)
    assert ended["attempts"][0]["slowSeconds"] == 30.0 and "slowSince" not in ended["attempts"][0]
    assert gp.slow_began(ended, 1, 160.0, 3.0) == ended
    # the report's form: loop 40 → now 160 (120 s, no counters), 30 s of it lost
    progress = {"attempt": 1, "trainStartTime": gp.stamp(40.0)}
    b = gp.buckets(gp.timeline_of(g3, 0.0, progress), 160.0)
    assert b == pytest.approx(expect(queued=10, starting=30, slow=30, productive=90))


@settings(max_examples=200, deadline=None)
@given(
    stall=st.integers(0, 200),
    edits=st.lists(st.tuples(st.integers(1, 120), st.sampled_from((None, 1.05, 1.5, 2.0, 4.0))), max_size=12),
)
def test_slow_never_goes_down_and_the_buckets_still_sum(stall, edits):
    """A running attempt (counters as scraped: `stall` s of checkpoint stall) whose straggler
    verdict comes (a slowdown), changes and goes (None) at random times: at every edit and between
    them the buckets sum to the wall time, slow never goes down, and it never exceeds what the
    verdicts' spans could lose, nor what the other cuts leave."""
    progress = {"attempt": 1, "trainStartTime": gp.stamp(50.0), "checkpointBlockingSeconds": float(stall)}
    g = gp.opened({}, 1, 10.0, job_created=0.0)
    now, last, bound, since = 50, 0.0, 0.0, None
    for dt_, slowdown in edits:
        for t in (now + dt_ // 2, now + dt_):  # between the edits, and at the next one (before it)
            b = gp.buckets(gp.timeline_of(g, 0.0, progress), float(t))
            assert sum(b.values()) == pytest.approx(t)
            assert b["slow"] >= last - 1e-3, (b["slow"], last)
            open_part = gp.lost_to_slowness(since[1], t - since[0]) if since else 0.0
            assert b["slow"] <= bound + open_part + 1e-3
            assert b["slow"] + b["productive"] == pytest.approx(max(0.0, t - 50 - stall), abs=1e-6)
            last = b["slow"]
        now += dt_
        if since is not None and (slowdown is None or slowdown != since[1]):
            bound += gp.lost_to_slowness(since[1], now - since[0])
            since = None
        if slowdown is None:
            g = gp.slow_ended(g, 1, float(now))
        else:
            g = gp.slow_began(g, 1, float(now), slowdown)
            since = since or (now, slowdown)
