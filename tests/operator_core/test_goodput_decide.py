"""status.goodput through decide(): what each transition adds to the timeline, in the same plan
(one conditional status write), and that the figures are recomputed from what status stores."""

from __future__ import annotations

import datetime as dt

import pytest

from llmtrain import goodput as gp
from llmtrain.controller.policy.progress import Progress
from llmtrain.controller.policy.snapshot import CreateResult
from llmtrain.stragglers import RankScore, Window

from .decide_world import NOW, ago, decide_, gpu, pending, ptj, running, snap, tiny

CREATED = NOW - dt.timedelta(minutes=20)


def at(**kw) -> str:
    return gp.stamp((NOW - dt.timedelta(**kw)).timestamp())


def test_new_attempt_opens_a_record_and_counts_the_queue():
    o = snap(created=CreateResult("j-a1", "created", rendezvous_id="r"), creation_time=NOW - dt.timedelta(seconds=30))
    plan = decide_(o)
    g = plan.status["goodput"]
    assert g["attempts"] == [{"attempt": 1, "createdTime": gp.stamp(NOW.timestamp())}]
    assert g["seconds"]["queued"] == 30.0 and g["wallSeconds"] == 30.0 and g["ratio"] == 0.0


def test_hang_closes_the_attempt_with_the_trainers_last_counters():
    progress = {
        "attempt": 1,
        "step": 50,
        "heartbeatTime": ago(minutes=40),
        "trainStartTime": at(minutes=55),
        "resumeStep": 0,
        "attemptSteps": 50,
        "stepSeconds": 800.0,
        "checkpointBlockingSeconds": 30.0,
        "dataWaitSeconds": 10.0,
    }
    goodput = {"attempts": [{"attempt": 1, "createdTime": at(minutes=58)}], "updateTime": at(seconds=10)}
    st = running(progress=progress, goodput=goodput, attemptStartTime=at(minutes=56))
    plan = decide_(snap(st, children=[ptj(1, "Running")], creation_time=NOW - dt.timedelta(hours=1)))
    assert plan.situation == "unhealthy" and plan.status["reason"].value == "Hang"
    g = plan.status["goodput"]
    rec = g["attempts"][0]
    assert rec["endTime"] == gp.stamp(NOW.timestamp()) and rec["endReason"] == "Hang"
    assert rec["checkpointBlockingSeconds"] == 30.0 and rec["heartbeatTime"] == progress["heartbeatTime"]
    # queued 2 min, starting 3 min, steps 15 min (30 s stall, 10 s data wait), hang 40 min
    assert g["seconds"] == pytest.approx(
        {
            **gp.zero(),
            "queued": 120,
            "starting": 180,
            "checkpointStall": 30,
            "dataWait": 10,
            "productive": 900 - 40,
            "hang": 2400,
        }
    )
    assert g["wallSeconds"] == 3600


def test_goodput_is_refreshed_only_when_due():
    goodput = {"attempts": [{"attempt": 1, "createdTime": at(minutes=12)}], "updateTime": at(seconds=10)}
    o = snap(running(goodput=goodput), children=[ptj(1, "Running")], creation_time=CREATED)
    assert decide_(o).status is None
    stale = {**goodput, "updateTime": at(minutes=6)}
    plan = decide_(snap(running(goodput=stale), children=[ptj(1, "Running")], creation_time=CREATED))
    assert plan.situation == "steady" and set(plan.status) == {"goodput"}
    assert plan.status["goodput"]["updateTime"] == gp.stamp(NOW.timestamp())


def test_suspend_and_resume_mark_a_suspension():
    goodput = {"attempts": [{"attempt": 1, "createdTime": at(minutes=12)}]}
    o = snap(
        running(goodput=goodput),
        spec={**snap().raw_spec, "suspend": True},
        children=[ptj(1, "Running")],
        creation_time=CREATED,
    )
    plan = decide_(o)
    assert plan.situation == "suspend"
    g = plan.status["goodput"]
    assert g["suspensions"] == [{"startTime": gp.stamp(NOW.timestamp())}]
    assert g["attempts"][0]["endReason"] == "Suspended"
    later = NOW + dt.timedelta(minutes=5)
    st = {**running(), "phase": "Suspended", "goodput": g}
    resumed = decide_(snap(st, creation_time=CREATED, now=later))
    assert resumed.situation == "resumed"
    g2 = resumed.status["goodput"]
    assert g2["suspensions"] == [{"startTime": gp.stamp(NOW.timestamp()), "endTime": gp.stamp(later.timestamp())}]
    assert g2["seconds"]["suspended"] == 300.0


def test_a_hang_that_spends_the_last_restart_is_still_a_hang():
    progress = {"attempt": 1, "step": 50, "heartbeatTime": ago(minutes=40), "trainStartTime": at(minutes=55)}
    goodput = {"attempts": [{"attempt": 1, "createdTime": at(minutes=58)}], "updateTime": at(seconds=10)}
    st = running(progress=progress, goodput=goodput, attemptStartTime=at(minutes=56), restarts=10)
    plan = decide_(snap(st, children=[ptj(1, "Running")], creation_time=NOW - dt.timedelta(hours=1)))
    assert plan.status["phase"].value == "Failed" and plan.status["reason"].value == "RestartBudgetExhausted"
    g = plan.status["goodput"]
    assert g["attempts"][0]["endReason"] == "Hang" and g["seconds"]["hang"] == 2400


def test_the_scrape_decide_judges_is_the_one_recorded():
    """The record keeps the monitor's newest scrape of the attempt (the snapshot's fact), over
    what status.progress held before it."""
    from llmtrain.controller.policy.progress import Progress

    old = {
        "attempt": 1,
        "step": 40,
        "attemptSteps": 40,
        "heartbeatTime": at(minutes=40),
        "trainStartTime": at(minutes=55),
    }
    goodput = {"attempts": [{"attempt": 1, "createdTime": at(minutes=58)}], "updateTime": at(seconds=10)}
    st = running(progress=old, goodput=goodput, attemptStartTime=at(minutes=56))
    scrape = Progress(step=50, heartbeat=(NOW - dt.timedelta(minutes=40)).timestamp(), step_seconds_count=50)
    plan = decide_(snap(st, children=[ptj(1, "Running")], creation_time=NOW - dt.timedelta(hours=1), progress=scrape))
    assert plan.status["reason"].value == "Hang"
    rec = plan.status["goodput"]["attempts"][0]
    assert (rec["step"], rec["attemptSteps"], rec["heartbeatTime"]) == (50, 50, at(minutes=40))
    assert plan.status["goodput"]["seconds"]["hang"] == 2400


def test_kueues_admission_moves_the_wait_from_starting_to_queued():
    """A PyTorchJob created suspended for Kueue and admitted two hours later: those two hours were
    queued (the cluster's choice), not starting (ours)."""
    spec = tiny(cluster={"instanceType": "cpu", "nodes": 1, "queueName": "team-a"})
    goodput = {"attempts": [{"attempt": 1, "createdTime": at(hours=2)}], "updateTime": at(minutes=1)}
    st = pending(attemptCreationTime=ago(hours=2), reason="Queued", goodput=goodput)
    o = snap(st, spec=spec, children=[ptj(1, raw_spec=spec)], creation_time=NOW - dt.timedelta(hours=2, minutes=1))
    plan = decide_(o)
    assert plan.situation == "admitted"
    g = plan.status["goodput"]
    assert g["attempts"][0]["admittedTime"] == gp.stamp(NOW.timestamp())
    assert g["seconds"]["queued"] == pytest.approx(2 * 3600 + 60) and g["seconds"]["starting"] == 0


def test_in_place_restarts_spend_no_restart_and_close_into_the_attempt_record():
    """torchrun restarted the workers in place twice (the pods and the PyTorchJob kept running):
    nothing for decide to restart, status.restarts stays; when the attempt ends anyway (here a
    hang), its record keeps the in-place figures and the goodput counts them."""
    from llmtrain.controller.policy.progress import Progress

    live = {
        "attempt": 1,
        "step": 50,
        "heartbeatTime": ago(seconds=20),
        "trainStartTime": at(minutes=9),
        "resumeStep": 0,
        "attemptSteps": 60,
        "stepSeconds": 400.0,
        "inPlaceRestarts": 2,
        "inPlaceRestartSeconds": 45.0,
        "inPlaceRedoneSteps": 10,
        "inPlaceRedoneSeconds": 60.0,
    }
    goodput = {"attempts": [{"attempt": 1, "createdTime": at(minutes=12)}], "updateTime": at(seconds=10)}
    scrape = Progress(
        step=50,
        heartbeat=(NOW - dt.timedelta(seconds=20)).timestamp(),
        in_place_restarts=2,
        in_place_restart_seconds=45.0,
    )
    st = running(progress=live, goodput=goodput, restarts=1)
    plan = decide_(snap(st, children=[ptj(1, "Running")], creation_time=CREATED, progress=scrape))
    assert plan.situation == "steady" and plan.restart is None
    assert plan.status is None or "restarts" not in plan.status

    hung = {**live, "heartbeatTime": ago(minutes=40), "trainStartTime": at(minutes=55)}
    goodput = {"attempts": [{"attempt": 1, "createdTime": at(minutes=58)}], "updateTime": at(seconds=10)}
    st = running(progress=hung, goodput=goodput, attemptStartTime=at(minutes=56), restarts=1)
    plan = decide_(snap(st, children=[ptj(1, "Running")], creation_time=NOW - dt.timedelta(hours=1)))
    assert plan.status["reason"].value == "Hang" and plan.status["restarts"] == 2  # the hang's, one
    rec = plan.status["goodput"]["attempts"][0]
    assert (rec["inPlaceRestarts"], rec["inPlaceRestartSeconds"], rec["inPlaceRedoneSeconds"]) == (2, 45.0, 60.0)
    s = plan.status["goodput"]["seconds"]
    # steps 55 → 40 min ago = 900 s: restarting 45, lost work 60, productive the rest
    assert (s["restarting"], s["lostWork"], s["productive"]) == (45.0, 60.0, 795.0)
    assert plan.status["goodput"]["stepsRedone"] == 10


# --- slow: status.straggler's verdict spans move lost time from productive to slow ---------------

REPLACE = gpu(
    checkpoint={"uri": "s3://bucket/ckpt/"}, resilience={"stragglers": {"action": "replace", "durationMinutes": 10}}
)
SLOW = Window((RankScore(5, "n2", 1.5, 1.5), RankScore(0, "n1", 1.0, 1.0)))
HEALTHY = Window((RankScore(5, "n2", 1.05, 1.0),))


def _straggling(window: Window, status: dict, **facts):
    return snap(
        status,
        spec=REPLACE,
        children=[ptj(1, "Running", raw_spec=REPLACE)],
        progress=Progress(step=50, stragglers=window),
        pod_nodes=frozenset({"n1", "n2"}),
        creation_time=CREATED,
        **facts,
    )


def _verdict(minutes: float, slowdown: float = 1.5) -> dict:
    return {"attempt": 1, "rank": 5, "node": "n2", "score": 1.5, "slowdown": slowdown, "since": at(minutes=minutes)}


def test_a_straggler_verdict_opens_the_attempts_slow_span_and_its_end_closes_it():
    progress = {"attempt": 1, "step": 50, "heartbeatTime": ago(seconds=20), "trainStartTime": at(minutes=10)}
    rec = {"attempt": 1, "createdTime": at(minutes=12)}
    goodput = {"attempts": [rec], "updateTime": at(seconds=10)}
    plan = decide_(_straggling(SLOW, running(progress=progress, goodput=goodput)))
    assert plan.situation == "slow_node" and plan.status["straggler"]["slowdown"] == 1.5
    (opened,) = plan.status["goodput"]["attempts"]
    assert (opened["slowSince"], opened["slowdown"]) == (gp.stamp(NOW.timestamp()), 1.5)
    assert plan.status["goodput"]["seconds"]["slow"] == 0  # it has lasted no time yet

    # five minutes later its figures drift (1.5× → 3×): the span so far closes at 1.5×, lost 300 × 1/3
    drifted = Window((RankScore(5, "n2", 3.2, 3.0),))
    st = running(progress=progress, goodput={**goodput, "attempts": [{**rec, **_span(5, 1.5)}]}, straggler=_verdict(5))
    plan = decide_(_straggling(drifted, st))
    assert plan.situation == "slow_node" and plan.status["straggler"]["slowdown"] == 3.0
    (rec2,) = plan.status["goodput"]["attempts"]
    assert (rec2["slowSeconds"], rec2["slowSince"], rec2["slowdown"]) == (100.0, gp.stamp(NOW.timestamp()), 3.0)

    # no rank is one any more: the span closes; of the attempt's 10 min of steps (no stall or
    # wait counted), 5 min at 1.5× lost 100 s: queued 8 min, starting 2 min, the steps 10 min
    st = running(progress=progress, goodput={**goodput, "attempts": [{**rec, **_span(5, 1.5)}]}, straggler=_verdict(5))
    plan = decide_(_straggling(HEALTHY, st))
    assert plan.situation == "slow_node" and plan.status["straggler"] is None
    g = plan.status["goodput"]
    (closed,) = g["attempts"]
    assert closed["slowSeconds"] == 100.0 and "slowSince" not in closed
    assert g["seconds"] == pytest.approx({**gp.zero(), "queued": 480, "starting": 120, "slow": 100, "productive": 500})
    assert g["ratio"] == pytest.approx(500 / 1200, abs=1e-4)


def test_a_replacement_closes_the_attempt_with_the_time_the_straggler_cost():
    """replace: attempt 1 ends while its verdict stands (12 min at 1.5×: 240 s lost); its record keeps them."""
    progress = {
        "attempt": 1,
        "step": 50,
        "heartbeatTime": ago(seconds=0),
        "trainStartTime": at(minutes=14),
        "lastCheckpointTime": ago(seconds=60),
        "estimatedRemainingSeconds": 36000,
    }
    rec = {"attempt": 1, "createdTime": at(minutes=16), **_span(12, 1.5)}
    goodput = {"attempts": [rec], "updateTime": at(seconds=10), "seconds": {"starting": 120.0}}
    st = running(progress=progress, goodput=goodput, straggler=_verdict(12))
    plan = decide_(_straggling(SLOW, st, ready_nodes_read=True, ready_nodes=frozenset({"n1", "n2", "n3"})))
    assert plan.situation == "slow_node" and plan.status["attempt"] == 2 and plan.status["restarts"] == 0
    (ended,) = plan.status["goodput"]["attempts"]
    assert ended["endReason"] == "Straggler" and ended["slowSeconds"] == 240.0 and "slowSince" not in ended
    # queued 4 min, starting 2 min, steps 14 min of which 240 s lost
    s = plan.status["goodput"]["seconds"]
    assert s == pytest.approx({**gp.zero(), "queued": 240, "starting": 120, "slow": 240, "productive": 600})


def _span(minutes: float, slowdown: float) -> dict:
    return {"slowSince": at(minutes=minutes), "slowdown": slowdown}
