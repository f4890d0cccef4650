"""The decide table's node stage (situations_nodes.py): a sick node under the attempt moves it, and a
straggler rank 0 reports is told of, and replaced when that pays."""

from __future__ import annotations

import pytest

from llmtrain.controller.policy.progress import Progress
from llmtrain.controller.policy.sicknodes import SickNode
from llmtrain.status import Reason
from llmtrain.stragglers import RankScore, Window

from .decide_cases import ABSENT, Case, all_of, assert_decision, cond, message_has
from .decide_world import ago, gpu, later, pending, ptj, running, snap

# --- a sick node under the attempt (controller/policy/sicknodes.py: a watched node condition False) ---
GPU_SICK = SickNode("n1", "AcceleratedHardwareReady", "NvidiaXID79Error", "GPU has fallen off the bus")
GPU2 = gpu()  # 2 nodes


def moved(*nodes):
    def check(plan):
        assert [b["node"] for b in plan.status["badNodes"]] == list(nodes)
        assert plan.status["badNodes"][0]["reason"] == "AcceleratedHardwareReady=False"
        assert [b["node"] for b in plan.blamed] == list(nodes) and plan.taint == ()  # the cluster marked it

    return check


SICK_CASES = [
    Case(
        "a sick node under a running attempt needs the Ready nodes to plan avoidance",
        snap(running(), spec=GPU2, children=[ptj(1, "Running", raw_spec=GPU2)], sick_nodes=(GPU_SICK,)),
        "sick_node",
        need="ready_nodes",
    ),
    Case(
        "a sick node → attempt 2 at once, away from it, no restart spent, the reason names node and condition",
        snap(
            running(),
            spec=GPU2,
            children=[ptj(1, "Running", raw_spec=GPU2)],
            sick_nodes=(GPU_SICK,),
            ready_nodes_read=True,
            ready_nodes=frozenset({"n1", "n2", "n3"}),
        ),
        "sick_node",
        status={
            "phase": "Restarting",
            "reason": "NodeUnhealthy",
            "attempt": 2,
            "restarts": 0,
            "nodeMoves": 1,
            "avoidNodes": ["n1"],
            "nextAttemptTime": None,
        },
        delete=("j-a1",),
        events=[(True, "Restarting")],
        restart=Reason.NODE_UNHEALTHY,
        check=all_of(
            moved("n1"),
            message_has("node n1 has AcceleratedHardwareReady=False (NvidiaXID79Error: GPU has fallen off the bus)"),
            message_has("avoiding n1"),
        ),
    ),
    Case(
        "a sick node under a Pending attempt's placed pod moves it too",
        snap(
            pending(),
            spec=GPU2,
            children=[ptj(1, "Created", raw_spec=GPU2)],
            sick_nodes=(GPU_SICK,),
            ready_nodes_read=True,
            ready_nodes=frozenset({"n1", "n2", "n3"}),
        ),
        "sick_node",
        status={"phase": "Restarting", "attempt": 2, "restarts": 0, "avoidNodes": ["n1"]},
        restart=Reason.NODE_UNHEALTHY,
    ),
    Case(
        "a sick node with too few Ready nodes left: moved, the node stays in play, the message says why",
        snap(
            running(),
            spec=GPU2,
            children=[ptj(1, "Running", raw_spec=GPU2)],
            sick_nodes=(GPU_SICK,),
            ready_nodes_read=True,
            ready_nodes=frozenset({"n1", "n2"}),
        ),
        "sick_node",
        status={"attempt": 2, "restarts": 0, "avoidNodes": []},
        restart=Reason.NODE_UNHEALTHY,
        check=message_has("not avoiding n1"),
    ),
    Case(
        "a flapping node: past the free moves a move spends the restart budget, with its backoff",
        snap(
            running(nodeMoves=3),
            spec=GPU2,
            children=[ptj(1, "Running", raw_spec=GPU2)],
            sick_nodes=(GPU_SICK,),
            ready_nodes_read=True,
            ready_nodes=frozenset({"n1", "n2"}),
        ),
        "sick_node",
        status={"attempt": 2, "restarts": 1, "nodeMoves": 4, "nextAttemptTime": later(seconds=10)},
        restart=Reason.NODE_UNHEALTHY,
        check=message_has("3 moves off sick nodes already made without spending a restart"),
    ),
    Case(
        "...and with the budget spent the job fails, its pods leave the sick node",
        snap(
            running(restarts=3, nodeMoves=5),
            spec=gpu(resilience={"maxRestarts": 3}),
            children=[ptj(1, "Running", raw_spec=gpu(resilience={"maxRestarts": 3}))],
            sick_nodes=(GPU_SICK,),
        ),
        "sick_node",
        status={"phase": "Failed", "reason": "RestartBudgetExhausted", "restarts": ABSENT},
        delete=("j-a1",),
        events=[(True, "RestartBudgetExhausted")],
        check=moved("n1"),
    ),
    Case(
        "a failed child on a sick node is judged by its pods' failures first",
        snap(running(), spec=GPU2, children=[ptj(1, "Failed", raw_spec=GPU2)], sick_nodes=(GPU_SICK,)),
        "attempt_failed",
        need="failures",
    ),
    Case(
        "a child Kueue holds suspended has no pods on the sick node to move",
        snap(pending(), spec=GPU2, children=[ptj(1, "Created", raw_spec=GPU2, suspended=True)], sick_nodes=(GPU_SICK,)),
        "queued",
        need="workload",
    ),
]
# --- a straggler rank 0 reports (controller/policy/slownodes.py) ---
SLOW = Window((RankScore(5, "n2", 1.5, 1.5), RankScore(0, "n1", 1.0, 1.0)))
NODES = frozenset({"n1", "n2"})
CKPT = {"uri": "s3://bucket/ckpt/"}
REPORT = gpu(checkpoint=CKPT)
REPLACE = gpu(checkpoint=CKPT, resilience={"stragglers": {"action": "replace", "durationMinutes": 10}})
FOUND = "rank 5 on node n2 computes 1.50× the other ranks' median; the job runs 1.50× slower"


def recorded(minutes: float, score: float = 1.5, slowdown: float = 1.5, node: str = "n2", attempt: int = 1) -> dict:
    return {
        "attempt": attempt,
        "rank": 5,
        "node": node,
        "score": score,
        "slowdown": slowdown,
        "since": ago(minutes=minutes),
    }


def slow_status(minutes: float, eta: float | None = 36000.0, reason: str = "Straggler", **more) -> dict:
    """Running with a straggler recorded `minutes` ago; the ETA, 5 min of start-up in goodput over 1
    attempt, the newest checkpoint 60 s ago."""
    status = running(straggler=recorded(minutes), goodput={"seconds": {"starting": 300.0}}, **more)
    status["progress"] = {**status["progress"], "lastCheckpointTime": ago(seconds=60)}
    if eta is not None:
        status["progress"]["estimatedRemainingSeconds"] = eta
    status["conditions"] = [
        *status["conditions"],
        {
            "type": "StragglerDetected",
            "status": "True",
            "reason": reason,
            "message": FOUND,
            "lastTransitionTime": ago(minutes=minutes),
        },
    ]
    return status


def slow(status: dict, spec: dict = REPORT, window: Window = SLOW, **facts):
    return snap(
        status,
        spec=spec,
        children=[ptj(1, "Running", raw_spec=spec)],
        progress=Progress(step=50, stragglers=window),
        pod_nodes=NODES,
        **facts,
    )


def straggler_cond(status: str, reason: str, *parts: str):
    def check(plan):
        c = cond(plan.status, "StragglerDetected")
        assert (c["status"], c["reason"]) == (status, reason), c
        for part in parts:
            assert part in c["message"], (part, c["message"])

    return check


def event_has(reason: str, *parts: str):
    def check(plan):
        (e,) = [e for e in plan.events if e.reason.value == reason]
        for part in parts:
            assert part in e.message, (part, e.message)

    return check


SLOW_CASES = [
    Case(
        "a straggler on one of the attempt's nodes: condition and event name the node and the slowdown",
        slow(running(), REPORT),
        "slow_node",
        status={
            "straggler": {"attempt": 1, "rank": 5, "node": "n2", "score": 1.5, "slowdown": 1.5, "since": ago(seconds=0)}
        },
        events=[(True, "Straggler")],
        check=all_of(straggler_cond("True", "Straggler", FOUND), event_has("Straggler", FOUND)),
    ),
    Case("the same straggler again: nothing to write", slow(slow_status(3), REPORT), "steady"),
    Case(
        "its figures drift: status.straggler follows, since kept, no new event",
        slow(slow_status(3), REPORT, Window((RankScore(5, "n2", 1.9, 1.7),))),
        "slow_node",
        status={"straggler": {**recorded(3), "score": 1.9, "slowdown": 1.7}, "conditions": ABSENT},
    ),
    Case(
        "a node none of the attempt's pods runs on (the tenant's text): no verdict",
        slow(running(), REPORT, Window((RankScore(5, "someone-elses-node", 3.0, 2.0),))),
        "steady",
    ),
    Case(
        "below the threshold (a healthy window) after a straggler: the condition turns False",
        slow(slow_status(3), REPORT, Window((RankScore(5, "n2", 1.1, 1.05),))),
        "slow_node",
        status={"straggler": None},
        events=[(False, "NoStraggler")],
        check=straggler_cond("False", "NoStraggler", "the last was rank 5 on node n2"),
    ),
    Case("report: however long it lasts, nothing restarts", slow(slow_status(600), REPORT), "steady"),
    Case("replace, slow for less than durationMinutes: not yet", slow(slow_status(9), REPLACE), "steady"),
    Case(
        "replace, slow for durationMinutes, and it pays: the Ready nodes first",
        slow(slow_status(12), REPLACE),
        "slow_node",
        need="ready_nodes",
    ),
    Case(
        "replace when it pays: attempt 2 away from the node, no restart spent, the event says the sums",
        slow(slow_status(12), REPLACE, ready_nodes_read=True, ready_nodes=frozenset({"n1", "n2", "n3"})),
        "slow_node",
        # 10 h left at 1.5× slow: 10 h × (1 − 1/1.5) = 3.3 h saved; 300 s start-up + 60 s since the checkpoint
        status={
            "phase": "Restarting",
            "reason": "Straggler",
            "attempt": 2,
            "restarts": 0,
            "stragglerReplacements": 1,
            "avoidNodes": ["n2"],
            "straggler": None,
            "nextAttemptTime": None,
        },
        delete=("j-a1",),
        events=[(True, "Restarting")],
        restart=Reason.STRAGGLER,
        check=all_of(
            message_has(
                "replacing node n2: 3.3 h saved vs 6 min restart (5 min start-up + 60 s since the newest checkpoint)"
            ),
            message_has(FOUND, "for 12 min", "avoiding n2"),
            straggler_cond("False", "Straggler", "attempt 1 moved off node n2"),
            lambda p: (
                p.status["badNodes"][-1]["node"] == "n2" and [b["node"] for b in p.blamed] == ["n2"] and p.taint == ()
            ),
        ),
    ),
    Case(
        "replace when it does not pay: declined, and the event says the sums",
        # 600 s left: 600 × (1 − 1/1.5) = 200 s saved, against 360 s
        slow(slow_status(12, eta=600.0), REPLACE),
        "slow_node",
        events=[(False, "ReplaceDeclined")],
        check=all_of(
            event_has(
                "ReplaceDeclined", "not replacing node n2: 3 min saved vs 6 min restart (5 min start-up + 60 s since"
            ),
            straggler_cond("True", "ReplaceDeclined", FOUND, "not replacing node n2"),
        ),
    ),
    Case("declined once: said once", slow(slow_status(15, eta=600.0, reason="ReplaceDeclined"), REPLACE), "steady"),
    Case(
        "replace at its cap: declined, naming the cap",
        slow(slow_status(12, stragglerReplacements=2), REPLACE),
        "slow_node",
        events=[(False, "ReplaceDeclined")],
        check=event_has("ReplaceDeclined", "not replacing node n2: 2 of maxReplacements 2 made"),
    ),
    Case(
        "replace without an ETA: nothing to weigh, declined",
        slow(slow_status(12, eta=None), REPLACE),
        "slow_node",
        events=[(False, "ReplaceDeclined")],
        check=event_has("ReplaceDeclined", "no estimate of the time remaining"),
    ),
]


@pytest.mark.parametrize("case", SICK_CASES + SLOW_CASES, ids=[c.id for c in SICK_CASES + SLOW_CASES])
def test_decide(case: Case):
    assert_decision(case)
