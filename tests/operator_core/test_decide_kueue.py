"""The decide table's Kueue stage (situations_kueue.py): a queued attempt's child waits suspended
(queued is not stuck), is admitted, or is preempted."""

from __future__ import annotations

import pytest

from llmtrain.controller.policy.progress import timestamp
from llmtrain.controller.policy.snapshot import Workload

from .decide_cases import ABSENT, RESTARTING, Case, all_of, assert_decision, message_has, ready_is
from .decide_world import NOW, ago, pending, ptj, running, snap, tiny

# --- Kueue (controller/adapters/kueue.py): a queued PyTorchJob waits suspended; queued is not stuck ---
QUEUED_SPEC = tiny(cluster={"instanceType": "cpu", "nodes": 1, "queueName": "team-a"})
NO_QUOTA = Workload(
    "pytorchjob-j-a1-1a2b3",
    message="couldn't assign flavors to pod set worker: "
    "insufficient unused quota for nvidia.com/gpu in flavor p5-48xlarge, 8 more needed",
)
EVICTED = Workload(
    "pytorchjob-j-a1-1a2b3",
    evicted="Preempted",
    evicted_message=("Preempted to accommodate a workload (UID: 42) due to prioritization in the ClusterQueue"),
)


def queued_ptj(attempt: int = 1, state: str | None = None, suspended: bool = True):
    return ptj(attempt, state, raw_spec=QUEUED_SPEC, suspended=suspended)


KUEUE_CASES = [
    Case(
        "a suspended PyTorchJob (Kueue has not admitted it): read its Workload first",
        snap(pending(), spec=QUEUED_SPEC, children=[queued_ptj()]),
        "queued",
        need="workload",
    ),
    Case(
        "not admitted → Pending, reason Queued, Kueue's own words in the message and an event",
        snap(pending(), spec=QUEUED_SPEC, children=[queued_ptj()], workload=NO_QUOTA, workload_read=True),
        "queued",
        status={"phase": "Pending", "reason": "Queued", "restarts": ABSENT, "attempt": ABSENT},
        events=[(False, "Queued")],
        check=all_of(
            ready_is("False", "Queued"),
            message_has("LocalQueue team-a", "insufficient unused quota for nvidia.com/gpu"),
        ),
    ),
    Case(
        "queued with no Workload to read yet (20 s in): still Queued, saying so",
        snap(
            pending(attemptCreationTime=ago(seconds=20)), spec=QUEUED_SPEC, children=[queued_ptj()], workload_read=True
        ),
        "queued",
        status={"phase": "Pending", "reason": "Queued"},
        events=[(False, "Queued")],
        check=message_has("no Kueue Workload"),
    ),
    Case(
        "THE DEFECT (Kueue's default integrations): queued, no Workload after the wait (60 s) → NoKueueWorkload, "
        "a Warning naming the framework to add; still Pending, nothing deleted, no restart",
        snap(
            pending(attemptCreationTime=ago(seconds=61)), spec=QUEUED_SPEC, children=[queued_ptj()], workload_read=True
        ),
        "queued",
        status={"phase": "Pending", "reason": "NoKueueWorkload", "restarts": ABSENT, "attempt": ABSENT},
        delete=(),
        events=[(True, "NoKueueWorkload")],
        check=all_of(
            ready_is("False", "NoKueueWorkload"),
            message_has(
                "PyTorchJob j-a1", "kubeflow.org/pytorchjob", "integrations.frameworks", "spec.cluster.queueName"
            ),
        ),
    ),
    Case(
        "THE DEFECT: queued two hours with startupTimeoutMinutes 30 → Queued, no StartupTimeout restart",
        snap(
            pending(attemptCreationTime=ago(hours=2)),
            spec=QUEUED_SPEC,
            children=[queued_ptj()],
            workload=NO_QUOTA,
            workload_read=True,
        ),
        "queued",
        status={"reason": "Queued", "restarts": ABSENT, "attempt": ABSENT},
        delete=(),
    ),
    Case(
        "still queued, Kueue's words unchanged: nothing to write, no deadline",
        snap(
            pending(
                attemptCreationTime=ago(hours=2),
                reason="Queued",
                message="waiting in LocalQueue team-a for Kueue to admit Workload pytorchjob-j-a1-1a2b3: "
                + NO_QUOTA.message,
            ),
            spec=QUEUED_SPEC,
            children=[queued_ptj()],
            workload=NO_QUOTA,
            workload_read=True,
        ),
        "steady",
    ),
    Case(
        "queued 20 s, Kueue has not said why yet (a Workload without QuotaReserved): look again in 2 s",
        snap(
            pending(
                attemptCreationTime=ago(seconds=20),
                reason="Queued",
                message="waiting in LocalQueue team-a for Kueue to admit Workload w: not admitted yet",
            ),
            spec=QUEUED_SPEC,
            children=[queued_ptj()],
            workload=Workload("w"),
            workload_read=True,
        ),
        "steady",
        requeue=2.0,
    ),
    Case(
        "queued 20 s with Kueue's words already shown: back to the progress interval",
        snap(
            pending(
                attemptCreationTime=ago(seconds=20),
                reason="Queued",
                message="waiting in LocalQueue team-a for Kueue to admit Workload pytorchjob-j-a1-1a2b3: "
                + NO_QUOTA.message,
            ),
            spec=QUEUED_SPEC,
            children=[queued_ptj()],
            workload=NO_QUOTA,
            workload_read=True,
        ),
        "steady",
        requeue=30.0,
    ),
    Case(
        "the next attempt's PyTorchJob waits in the queue too → Pending Queued, restarts kept",
        snap(
            {**RESTARTING, "nextAttemptTime": None, "attemptCreationTime": ago(minutes=1)},
            spec=QUEUED_SPEC,
            children=[queued_ptj(2)],
            workload=NO_QUOTA,
            workload_read=True,
        ),
        "queued",
        status={"phase": "Pending", "reason": "Queued", "restarts": ABSENT},
    ),
    Case(
        "Kueue admitted it (unsuspended): Admitted, and the start-up deadline counts from now",
        snap(
            pending(attemptCreationTime=ago(hours=2), reason="Queued"),
            spec=QUEUED_SPEC,
            children=[queued_ptj(suspended=False)],
        ),
        "admitted",
        status={"reason": "Admitted", "admissionTime": timestamp(NOW), "phase": ABSENT},
        events=[(False, "Admitted")],
        check=ready_is("False", "Admitted"),
    ),
    Case(
        "admitted 5 minutes ago, created 2 hours ago: within startupTimeoutMinutes 30, no restart",
        snap(
            pending(attemptCreationTime=ago(hours=2), admissionTime=ago(minutes=5), reason="Admitted"),
            spec=QUEUED_SPEC,
            children=[queued_ptj(state="Created", suspended=False)],
        ),
        "steady",
    ),
    Case(
        "admitted 31 minutes ago and the pods still not started → StartupTimeout",
        snap(
            pending(attemptCreationTime=ago(hours=2), admissionTime=ago(minutes=31), reason="Admitted"),
            spec=QUEUED_SPEC,
            children=[queued_ptj(state="Created", suspended=False)],
        ),
        "startup_timeout",
        status={"phase": "Restarting", "reason": "StartupTimeout", "restarts": 1, "admissionTime": None},
    ),
    Case(
        "Kueue suspended the running attempt: read its Workload first",
        snap(running(), spec=QUEUED_SPEC, children=[queued_ptj(state="Running")]),
        "preempted",
        need="workload",
    ),
    Case(
        "preempted → Pending, reason Preempted in Kueue's words, no restart spent, queued again",
        snap(running(), spec=QUEUED_SPEC, children=[queued_ptj(state="Running")], workload=EVICTED, workload_read=True),
        "preempted",
        status={
            "phase": "Pending",
            "reason": "Preempted",
            "restarts": ABSENT,
            "attempt": ABSENT,
            "child": ABSENT,
            "admissionTime": None,
        },
        delete=(),
        events=[(True, "Preempted")],
        outcome="preempted",
        check=all_of(ready_is("False", "Queued"), message_has("Preempted to accommodate", "no restart spent")),
    ),
    Case(
        "preempted, waiting to be admitted again: Preempted stays, with Kueue's queue words",
        snap(
            pending(reason="Preempted", message="attempt 1 preempted by Kueue"),
            spec=QUEUED_SPEC,
            children=[queued_ptj(state="Suspended")],
            workload=NO_QUOTA,
            workload_read=True,
        ),
        "queued",
        status={"phase": "Pending", "reason": "Preempted"},
        delete=(),
        check=message_has("was preempted", "insufficient unused quota"),
    ),
    Case(
        "re-admitted after preemption: the same PyTorchJob runs again (from the newest checkpoint)",
        snap(pending(reason="Preempted"), spec=QUEUED_SPEC, children=[queued_ptj(state="Suspended", suspended=False)]),
        "admitted",
        status={"reason": "Admitted", "admissionTime": timestamp(NOW)},
        create=None,
        delete=(),
    ),
    Case(
        "no Workload and a priority class set: the message names the field to check",
        snap(
            pending(attemptCreationTime=ago(seconds=20)),
            spec=tiny(
                cluster={"instanceType": "cpu", "nodes": 1, "queueName": "team-a", "workloadPriorityClass": "nope"}
            ),
            children=[queued_ptj()],
            workload_read=True,
        ),
        "queued",
        status={"reason": "Queued"},
        check=message_has("spec.cluster.workloadPriorityClass 'nope'"),
    ),
    Case(
        "a LocalQueue that does not exist: Kueue's words, and the field",
        snap(
            pending(),
            spec=QUEUED_SPEC,
            children=[queued_ptj()],
            workload_read=True,
            workload=Workload("w", message="LocalQueue team-a doesn't exist"),
        ),
        "queued",
        status={"reason": "Queued"},
        check=message_has("LocalQueue team-a doesn't exist", "spec.cluster.queueName"),
    ),
    Case(
        "a job without a queue whose PyTorchJob runs is never 'admitted'",
        snap(pending(), children=[ptj(1, "Created")]),
        "steady",
    ),
]


@pytest.mark.parametrize("case", KUEUE_CASES, ids=[c.id for c in KUEUE_CASES])
def test_decide(case: Case):
    assert_decision(case)
