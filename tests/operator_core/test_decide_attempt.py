"""The decide table's attempt stage (situations_attempt.py): a failed attempt's child (the budget, the
restart backoff, bad-node forensics, preflight), a missing child created, suspend and resume."""

from __future__ import annotations

import pytest

from llmtrain.controller.policy.progress import timestamp
from llmtrain.controller.policy.snapshot import CreateResult
from llmtrain.status import Reason

from .decide_cases import (
    ABSENT,
    AT_37,
    BUDGET1,
    GPU_FILE,
    RESTARTING,
    Case,
    all_of,
    assert_decision,
    message_has,
    only_the_eta_removed,
    progress_is,
    ready_is,
)
from .decide_world import NOW, ago, failure, gpu, later, preflight_failure, ptj, running, snap, tiny

XID = {**failure("n1", "XID 79", "NVRM: Xid (PCI:0000:53:00): 79, GPU has fallen off the bus"), "xid": 79}
VICTIM = failure(
    "n2", "NCCL error", "NCCL error: remote process exited or there was a network error", pod="j-a1-worker-1"
)

ATTEMPT_CASES = [
    # --- README: a worker process dies ---
    Case(
        "the attempt failed: read its pods' failures first",
        snap(running(), children=[ptj(1, "Failed")]),
        "attempt_failed",
        need="failures",
    ),
    Case(
        "a worker died → Restarting attempt 2 after 10 s, restarts 1, attempt 1 deleted",
        snap(running(), children=[ptj(1, "Failed", message="replica worker failed")], failures=()),
        "attempt_failed",
        status={
            "phase": "Restarting",
            "attempt": 2,
            "restarts": 1,
            "reason": "Failed",
            "child": "j-a2",
            "rendezvousId": "ns..j-01234567-a2",
            "nextAttemptTime": later(seconds=10),
            "attemptCreationTime": later(seconds=10),
        },
        delete=("j-a1",),
        events=[(True, "Restarting")],
        restart=Reason.FAILED,
        outcome="restarted",
        check=all_of(
            ready_is("False", "Restarting"),
            message_has("attempt 1 failed: replica worker failed", "starting attempt 2"),
        ),
    ),
    Case(
        "an OOMKilled worker names its pod and node in the message",
        snap(
            running(),
            children=[ptj(1, "Failed", message="replica worker failed")],
            failures=(failure("n1", "OOMKilled"),),
            ready_nodes_read=True,
            ready_nodes=frozenset({"n1", "n2"}),
        ),
        "attempt_failed",
        status={"attempt": 2, "reason": "Failed"},
        check=message_has("pod j-a1-worker-0 on node n1: OOMKilled"),
    ),
    Case(
        "the budget is spent → Failed RestartBudgetExhausted, the failed PyTorchJob kept",
        snap(running(restarts=1), spec=BUDGET1, children=[ptj(1, "Failed", raw_spec=BUDGET1)], failures=()),
        "attempt_failed",
        status={"phase": "Failed", "reason": "RestartBudgetExhausted", "attempt": ABSENT, "restarts": ABSENT},
        delete=(),
        events=[(True, "RestartBudgetExhausted")],
        check=message_has("1 of 1 restarts used"),
    ),
    Case(
        "a job that fails has no ETA either; its last scrape stays",
        snap(
            running(restarts=1, progress=AT_37),
            spec=BUDGET1,
            children=[ptj(1, "Failed", raw_spec=BUDGET1)],
            failures=(),
        ),
        "attempt_failed",
        status={"phase": "Failed", "reason": "RestartBudgetExhausted"},
        check=all_of(
            progress_is(estimatedRemainingSeconds=None, estimatedCompletionTime=None),
            only_the_eta_removed,
        ),
    ),
    Case(
        "maxRestarts 0: the first failure ends the job",
        snap(
            running(),
            spec=tiny(resilience={"maxRestarts": 0}),
            failures=(),
            children=[ptj(1, "Failed", raw_spec=tiny(resilience={"maxRestarts": 0}))],
        ),
        "attempt_failed",
        status={"phase": "Failed", "reason": "RestartBudgetExhausted"},
    ),
    # --- README: a crash loop (restart backoff) ---
    Case(
        "backoff doubles per restart spent: 3rd restart waits 40 s",
        snap(running(attempt=3, restarts=2), children=[ptj(3, "Failed")], failures=()),
        "attempt_failed",
        status={"attempt": 4, "restarts": 3, "nextAttemptTime": later(seconds=40)},
    ),
    Case(
        "backoff is capped at maxRestartBackoffSeconds (300)",
        snap(running(attempt=8, restarts=7), children=[ptj(8, "Failed")], failures=()),
        "attempt_failed",
        status={"attempt": 9, "restarts": 8, "nextAttemptTime": later(seconds=300)},
    ),
    Case(
        "restartBackoffSeconds 0 still waits the operator's floor (--min-restart-backoff-seconds 5)",
        snap(
            running(),
            spec=tiny(resilience={"restartBackoffSeconds": 0}),
            failures=(),
            children=[ptj(1, "Failed", raw_spec=tiny(resilience={"restartBackoffSeconds": 0}))],
        ),
        "attempt_failed",
        status={"attempt": 2, "nextAttemptTime": later(seconds=5)},
    ),
    Case(
        "restartBackoffSeconds 0 with the floor at 0: the next attempt starts at once",
        snap(
            running(),
            spec=tiny(resilience={"restartBackoffSeconds": 0}),
            failures=(),
            children=[ptj(1, "Failed", raw_spec=tiny(resilience={"restartBackoffSeconds": 0}))],
        ),
        "attempt_failed",
        status={"attempt": 2, "nextAttemptTime": None, "attemptCreationTime": timestamp(NOW)},
        check=message_has("starting attempt 2 now"),
    ),
    Case(
        "Restarting within the backoff: nothing created, look again when it is due",
        snap(RESTARTING),
        "backoff",
        requeue=10.05,
    ),
    Case(
        "Restarting, backoff passed: create attempt 2",
        snap({**RESTARTING, "nextAttemptTime": ago(seconds=1)}),
        "missing_child",
        create="j-a2",
    ),
    Case(
        "Restarting, attempt 2 created: recorded, restarts kept, phase stays Restarting",
        snap(
            {**RESTARTING, "nextAttemptTime": ago(seconds=1)},
            created=CreateResult("j-a2", "created", rendezvous_id="ns-j-01234567-a2"),
        ),
        "missing_child",
        status={"attempt": 2, "restarts": 1, "child": "j-a2", "nextAttemptTime": None, "phase": ABSENT},
        events=[(False, "Created")],
    ),
    # --- README: a node keeps failing (bad-node forensics) ---
    Case(
        "an XID failure needs the Ready nodes to plan avoidance",
        snap(running(), spec=gpu(), children=[ptj(1, "Failed", raw_spec=gpu())], failures=(XID,)),
        "attempt_failed",
        need="ready_nodes",
    ),
    Case(
        "an XID failure → badNodes, attempt 2 avoids the node while enough remain",
        snap(
            running(),
            spec=gpu(),
            children=[ptj(1, "Failed", raw_spec=gpu())],
            failures=(XID,),
            ready_nodes_read=True,
            ready_nodes=frozenset({"n1", "n2", "n3"}),
        ),
        "attempt_failed",
        status={"attempt": 2, "avoidNodes": ["n1"]},
        check=all_of(
            lambda p: p.status["badNodes"][0]["node"] == "n1" and p.status["badNodes"][0]["xid"] == 79,
            lambda p: [b["node"] for b in p.blamed] == ["n1"] and [b["node"] for b in p.taint] == ["n1"],
            message_has("avoiding n1"),
        ),
    ),
    Case(
        "an XID failure with too few Ready nodes left: the node stays in play, and the message says why",
        snap(
            running(),
            spec=gpu(),
            children=[ptj(1, "Failed", raw_spec=gpu())],
            failures=(XID,),
            ready_nodes_read=True,
            ready_nodes=frozenset({"n1", "n2"}),
        ),
        "attempt_failed",
        status={"avoidNodes": []},
        check=message_has("not avoiding n1"),
    ),
    Case(
        "nodes that cannot be counted are not avoided",
        snap(
            running(),
            spec=gpu(),
            children=[ptj(1, "Failed", raw_spec=gpu())],
            failures=(XID,),
            ready_nodes_read=True,
            ready_nodes=None,
        ),
        "attempt_failed",
        status={"avoidNodes": []},
        check=message_has("could not be counted"),
    ),
    Case(
        "peers that only lost the failed rank are not blamed",
        snap(
            running(),
            spec=gpu(),
            children=[ptj(1, "Failed", raw_spec=gpu())],
            failures=(VICTIM, XID),
            ready_nodes_read=True,
            ready_nodes=frozenset({"n1", "n2", "n3", "n4"}),
        ),
        "attempt_failed",
        status={"avoidNodes": ["n1"]},
        check=lambda p: [b["node"] for b in p.status["badNodes"]] == ["n1"],
    ),
    Case(
        "a collective timeout on GPUs names the flight recorder's dumps",
        snap(
            running(),
            spec=GPU_FILE,
            children=[ptj(1, "Failed", raw_spec=GPU_FILE, message="NCCL watchdog caught collective operation timeout")],
            failures=(),
        ),
        "attempt_failed",
        check=lambda p: (
            p.status["flightRecorder"]["reason"] == "collective-timeout"
            and p.status["flightRecorder"]["persistent"] is True
        ),
    ),
    # --- README: preflight ---
    Case(
        "a failed preflight → attempt 2 at once, no restart spent, the slow node avoided",
        snap(
            running(),
            spec=gpu(),
            children=[ptj(1, "Failed", raw_spec=gpu())],
            failures=(preflight_failure("n2"),),
            ready_nodes_read=True,
            ready_nodes=frozenset({"n1", "n2", "n3"}),
        ),
        "attempt_failed",
        status={
            "phase": "Restarting",
            "attempt": 2,
            "restarts": 0,
            "reason": "PreflightFailed",
            "nextAttemptTime": None,
            "preflightFailures": 1,
            "avoidNodes": ["n2"],
        },
        restart=Reason.PREFLIGHT_FAILED,
        check=lambda p: p.status["preflight"]["busBandwidthGBps"] == 12.5 and p.preflight_busbw == 12.5,
    ),
    Case(
        "after 3 free preflight retries the 4th spends a restart",
        snap(
            running(attempt=4, preflightFailures=3),
            spec=gpu(),
            children=[ptj(4, "Failed", raw_spec=gpu())],
            failures=(preflight_failure("n2", pod="j-a4-worker-1"),),
            ready_nodes_read=True,
            ready_nodes=frozenset({"n1", "n2", "n3"}),
        ),
        "attempt_failed",
        status={"attempt": 5, "restarts": 1, "preflightFailures": 4, "nextAttemptTime": later(seconds=10)},
    ),
    Case(
        "a failed preflight with the budget spent is free: it does not fail the job",
        snap(
            running(restarts=1),
            spec={**gpu(), "resilience": {"maxRestarts": 1}},
            children=[ptj(1, "Failed", raw_spec={**gpu(), "resilience": {"maxRestarts": 1}})],
            failures=(preflight_failure("n2"),),
            ready_nodes_read=True,
            ready_nodes=frozenset({"n1", "n2", "n3"}),
        ),
        "attempt_failed",
        status={"phase": "Restarting", "restarts": 1},
    ),
    # --- README: you need the GPUs back (suspend) ---
    Case(
        "suspend while Running → Suspended, the PyTorchJob deleted, budget kept",
        snap(running(restarts=3), spec=tiny(suspend=True), children=[ptj(1, "Running")]),
        "suspend",
        status={"phase": "Suspended", "reason": "Suspended", "nextAttemptTime": None, "restarts": ABSENT},
        delete=("j-a1",),
        events=[(False, "Suspended")],
        outcome="suspended",
    ),
    Case(
        "suspend during a restart backoff → Suspended, nothing to delete",
        snap(RESTARTING, spec=tiny(suspend=True)),
        "suspend",
        status={"phase": "Suspended", "nextAttemptTime": None},
    ),
    Case(
        "Suspended and still suspended: a PyTorchJob left over is deleted",
        snap(
            {"phase": "Suspended", "attempt": 1, "child": "j-a1", "observedGeneration": 1},
            spec=tiny(suspend=True),
            children=[ptj(1, "Running")],
        ),
        "suspended",
        delete=("j-a1",),
    ),
    Case(
        "resume → Restarting attempt+1 at once, no restart spent",
        snap({"phase": "Suspended", "attempt": 1, "restarts": 2, "child": "j-a1", "observedGeneration": 1}),
        "resumed",
        status={"phase": "Restarting", "attempt": 2, "restarts": 2, "reason": "Resumed", "nextAttemptTime": None},
        restart=Reason.RESUMED,
        outcome="resumed",
    ),
    Case(
        "resume with the budget spent still resumes (a resume is free)",
        snap(
            {"phase": "Suspended", "attempt": 1, "restarts": 1, "child": "j-a1", "observedGeneration": 1},
            spec=BUDGET1,
        ),
        "resumed",
        status={"phase": "Restarting", "attempt": 2, "restarts": 1},
    ),
    Case(
        "resume of a job created suspended → Pending, attempt 1 is yet to start",
        snap({"phase": "Suspended", "attempt": 1, "restarts": 0, "observedGeneration": 1}),
        "resumed",
        status={"phase": "Pending", "reason": "Resumed", "attempt": ABSENT},
        outcome="resumed",
    ),
]


@pytest.mark.parametrize("case", ATTEMPT_CASES, ids=[c.id for c in ATTEMPT_CASES])
def test_decide(case: Case):
    assert_decision(case)
