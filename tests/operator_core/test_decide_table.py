"""decide() as a table, no cluster: one case per lifecycle situation and per row of the README's
"When things fail" table. Expected values come from that table and from the cluster tests'
assertions (phase/reason names, budget, backoff 10 s doubling to 300 s, free preflight and resume
restarts, the pods' own words while Pending), not from running decide.

Each case: a snapshot (decide_world.snap) and what the plan must say:
  situation  the rule that applies; need: the extra read it asks for first
  status     a subset of the status update (ABSENT: the key must not be written)
  create     the PyTorchJob to create (its name), or None
  delete     the PyTorchJobs to delete; events: [(warning, reason)]; restart: the metric's reason
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import pytest

from llmtrain.controller.policy.progress import Progress, timestamp
from llmtrain.controller.policy.sicknodes import SickNode
from llmtrain.controller.policy.snapshot import CreateResult, Workload
from llmtrain.status import LLMTrainingJobStatus, Reason, wire_fields
from llmtrain.stragglers import RankScore, Window

from .decide_world import (
    NOW,
    ago,
    decide_,
    failure,
    gpu,
    later,
    pending,
    pod,
    preflight_failure,
    ptj,
    running,
    snap,
    tiny,
)

ABSENT = object()


@dataclass
class Case:
    id: str
    observed: object
    situation: str
    status: dict | None = None  # None: no status write
    create: str | None = None
    delete: tuple | None = None  # None: not checked (a restart deletes the attempt it ends)
    events: list = field(default_factory=list)
    need: str | None = None
    restart: Reason | None = None
    requeue: float | None = None
    outcome: str | None = None
    check: object = None  # any further assertion on the plan


def cond(update, type_):
    return next((c for c in update.get("conditions") or [] if c["type"] == type_), None)


def ready_is(status: str, reason: str):
    def check(plan):
        c = cond(plan.status, "Ready")
        assert (c["status"], c["reason"]) == (status, reason), c

    return check


def healthy_is(status: str, reason: str):
    def check(plan):
        c = cond(plan.status, "TrainingHealthy")
        assert (c["status"], c["reason"]) == (status, reason), c

    return check


def message_has(*parts):
    def check(plan):
        for part in parts:
            assert part in plan.status["message"], (part, plan.status["message"])

    return check


def all_of(*checks):
    def check(plan):
        for c in checks:
            c(plan)

    return check


BUDGET1 = tiny(resilience={"maxRestarts": 1})
# the demo's 40-step job as the monitor last scraped it, three steps before its end
AT_37 = {
    "attempt": 1,
    "step": 37,
    "loss": 2.5,
    "tokensPerSecond": 1400.0,
    "mfu": 0.1351,
    "mfuPercent": "13.51%",
    "lossMedian": 2.6,
    "heartbeatTime": ago(seconds=9),
    "attemptSteps": 37,
    "stepSeconds": 74.0,
    "estimatedRemainingSeconds": 6,
    "estimatedCompletionTime": later(seconds=6),
}
# ... and the final summary its pods left when it ended at step 40
FINAL_40 = Progress(
    step=40,
    loss=2.25,
    tokens_per_second=1500.0,
    mfu=0.1085,
    heartbeat=NOW.timestamp() - 3,
    attempt_steps=40,
    attempt_step_seconds=80.0,
    last_checkpoint_step=40,
)


def progress_is(**expected):
    """status.progress in the plan's write: these keys set to these values (None: removed)."""

    def check(plan):
        written = plan.status["progress"]
        for key, value in expected.items():
            assert key in written and written[key] == value, (key, written.get(key, "<not written>"), value)

    return check


def only_the_eta_removed(plan):
    """The write touches no key of status.progress but the ETA's (merge patch: the rest stays)."""
    assert set(plan.status["progress"]) == {"estimatedRemainingSeconds", "estimatedCompletionTime"}


def goodput_closed_at(**expected):
    def check(plan):
        (record,) = plan.status["goodput"]["attempts"]
        assert record.get("endTime") == timestamp(NOW)
        for key, value in expected.items():
            assert record.get(key) == value, (key, record.get(key), value)

    return check


GPU_FILE = {
    **gpu(checkpoint={"uri": "file:///mnt/fsx/ckpt/j/"}),
    "cluster": {
        "instanceType": "p5.48xlarge",
        "nodes": 2,
        "volumes": [{"name": "fsx", "claimName": "fsx", "mountPath": "/mnt/fsx"}],
    },
}
NAN = Progress(
    step=60,
    heartbeat=NOW.timestamp() - 5,
    nonfinite_loss_steps=3,
    nonfinite_loss_max_steps=3,
    nonfinite_loss_first_step=41,
)
SPIKE = Progress(step=300, heartbeat=NOW.timestamp() - 5, loss_spike_step=290, loss_spike_ratio=5.0)
XID = {**failure("n1", "XID 79", "NVRM: Xid (PCI:0000:53:00): 79, GPU has fallen off the bus"), "xid": 79}
VICTIM = failure(
    "n2", "NCCL error", "NCCL error: remote process exited or there was a network error", pod="j-a1-worker-1"
)
STUCK_POD = pod(unschedulable="0/16 nodes are available: 16 Insufficient vpc.amazonaws.com/efa.")
PULL_POD = pod(waiting=("pytorch", "ImagePullBackOff", 'Back-off pulling image "nope:1"'))
# what a real kubelet says for imagePullPolicy Never and an image the node does not hold
NEVER_PULL_POD = pod(
    waiting=("pytorch", "ErrImageNeverPull", 'Container image "nope:1" is not present with pull policy of Never')
)
RESTARTING = {
    "phase": "Restarting",
    "attempt": 2,
    "restarts": 1,
    "child": "j-a2",
    "observedGeneration": 1,
    "attemptCreationTime": later(seconds=10),
    "nextAttemptTime": later(seconds=10),
}

CASES = [
    # --- a new job ---
    Case("new job: render attempt 1 and create it", snap(), "new_job", create="j-a1"),
    Case(
        "new job: created → Pending, attempt 1, restarts 0",
        snap(created=CreateResult("j-a1", "created", rendezvous_id="ns-j-01234567-a1")),
        "new_job",
        status={
            "phase": "Pending",
            "attempt": 1,
            "restarts": 0,
            "child": "j-a1",
            "rendezvousId": "ns-j-01234567-a1",
            "observedGeneration": 1,
            "model": "tiny",
            "attemptCreationTime": timestamp(NOW),
            "nextAttemptTime": None,
        },
        events=[(False, "Created")],
        outcome="created",
        check=all_of(ready_is("False", "Pending"), lambda p: cond(p.status, "Validated")["status"] == "True"),
    ),
    Case(
        "new job: the create found it (409) → adopted, not duplicated",
        snap(created=CreateResult("j-a1", "adopted", rendezvous_id="ns-j-01234567-a1")),
        "new_job",
        status={"phase": "Pending", "attempt": 1},
        events=[(False, "Adopted")],
        outcome="adopted",
    ),
    Case(
        "new job: its PyTorchJob already in the cache → adopted without a create",
        snap(children=[ptj(1)]),
        "new_job",
        status={"phase": "Pending", "child": "j-a1"},
        events=[(False, "Adopted")],
        outcome="adopted",
    ),
    Case(
        "new job: a PyTorchJob of that name owned by another → Failed NameConflict",
        snap(children=[ptj(1, owned=False)]),
        "new_job",
        status={"phase": "Failed", "reason": "NameConflict"},
        events=[(True, "NameConflict")],
        outcome="invalid",
    ),
    Case(
        "new job: the create answered a PyTorchJob owned by another → NameConflict",
        snap(created=CreateResult("j-a1", "not-owned")),
        "new_job",
        status={"phase": "Failed", "reason": "NameConflict"},
        events=[(True, "NameConflict")],
    ),
    Case(
        "new job: the API server refused the PyTorchJob → Failed AttemptRejected",
        snap(created=CreateResult("j-a1", "rejected", "admission webhook denied")),
        "new_job",
        status={"phase": "Failed", "reason": "AttemptRejected"},
        events=[(True, "AttemptRejected")],
        check=message_has("refused PyTorchJob j-a1", "admission webhook denied"),
    ),
    Case(
        "new job: invalid spec → Failed InvalidSpec, no PyTorchJob",
        snap(spec=tiny(model={"preset": "no-such-model"})),
        "new_invalid",
        status={"phase": "Failed", "reason": "InvalidSpec", "observedGeneration": 1, "completionTime": timestamp(NOW)},
        events=[(True, "InvalidSpec")],
        outcome="invalid",
        check=ready_is("False", "InvalidSpec"),
    ),
    Case(
        "new job created suspended → Suspended, attempt 1, no PyTorchJob",
        snap(spec=tiny(suspend=True)),
        "new_suspended",
        status={"phase": "Suspended", "attempt": 1, "restarts": 0, "reason": "Suspended"},
        events=[(False, "Suspended")],
        outcome="suspended",
    ),
    # --- terminal ---
    Case(
        "Succeeded stays Succeeded",
        snap({"phase": "Succeeded", "attempt": 1}, children=[ptj(1, "Succeeded")]),
        "terminal",
    ),
    Case(
        "Failed stays Failed, whatever its PyTorchJob does",
        snap({"phase": "Failed", "attempt": 2}, children=[ptj(2, "Running")]),
        "terminal",
    ),
    Case(
        "a terminal job on first sight is counted unchanged",
        snap({"phase": "Failed", "attempt": 1}, first_sight=True),
        "terminal",
        outcome="unchanged",
    ),
    # --- following the PyTorchJob ---
    Case(
        "Pending while the PyTorchJob is only Created",
        snap(pending(), children=[ptj(1, "Created")]),
        "steady",
        requeue=30.0,
    ),
    Case(
        "Pending → Running when the PyTorchJob runs",
        snap(pending(), children=[ptj(1, "Running")]),
        "follow",
        status={
            "phase": "Running",
            "reason": "Running",
            "attemptStartTime": timestamp(NOW),
            "startTime": timestamp(NOW),
        },
        events=[(False, "Running")],
        check=ready_is("True", "Running"),
    ),
    Case(
        "Running → Succeeded: first the trainer's final summary from the pods",
        snap(running(), children=[ptj(1, "Succeeded")]),
        "follow",
        need="final",
    ),
    Case(
        "Running → Succeeded",
        snap(running(), children=[ptj(1, "Succeeded")], final_read=True),
        "follow",
        status={"phase": "Succeeded", "completionTime": timestamp(NOW)},
        events=[(False, "Succeeded")],
        check=ready_is("True", "Succeeded"),
    ),
    Case(
        "Succeeded with the trainer's final summary: its step, loss, tokens/s and MFU, no ETA, "
        "and the attempt's goodput record closed with its counters",
        snap(running(progress=AT_37), children=[ptj(1, "Succeeded")], final=FINAL_40, final_read=True),
        "follow",
        status={"phase": "Succeeded", "completionTime": timestamp(NOW)},
        events=[(False, "Succeeded")],
        check=all_of(
            progress_is(
                step=40,
                loss=2.25,
                tokensPerSecond=1500.0,
                mfu=0.1085,
                mfuPercent="10.85%",
                attemptSteps=40,
                stepSeconds=80.0,
                heartbeatTime=ago(seconds=3),
                lastCheckpointStep=40,
                updateTime=timestamp(NOW),
                estimatedRemainingSeconds=None,
                estimatedCompletionTime=None,
            ),
            goodput_closed_at(step=40, attemptSteps=40, stepSeconds=80.0, endReason="Succeeded"),
        ),
    ),
    Case(
        "Succeeded without a final summary (an older trainer, pods gone): the last scrape stays, no ETA",
        snap(running(progress=AT_37), children=[ptj(1, "Succeeded")], final_read=True),
        "follow",
        status={"phase": "Succeeded"},
        check=all_of(
            progress_is(estimatedRemainingSeconds=None, estimatedCompletionTime=None),
            only_the_eta_removed,
        ),
    ),
    Case(
        "the final summary replaces an earlier attempt's scrape, not mixed into it",
        snap(
            running(attempt=2, restarts=1, progress={**AT_37, "attempt": 1}),
            children=[ptj(2, "Succeeded")],
            final=FINAL_40,
            final_read=True,
        ),
        "follow",
        status={"phase": "Succeeded"},
        check=progress_is(step=40, attempt=2, lossMedian=None, estimatedCompletionTime=None),
    ),
    Case(
        "Running → Restarting while the training-operator restarts a pod",
        snap(running(), children=[ptj(1, "Restarting")]),
        "follow",
        status={"phase": "Restarting"},
    ),
    Case("a suspended PyTorchJob (Kueue) is Pending", snap(pending(), children=[ptj(1, "Suspended")]), "steady"),
    Case(
        "a second Running keeps the first startTime",
        snap(pending(attempt=2, restarts=1, startTime=ago(hours=3)), children=[ptj(2, "Running")]),
        "follow",
        status={"startTime": ago(hours=3), "attemptStartTime": timestamp(NOW)},
    ),
    Case(
        "Running and healthy: look again after the progress interval, scrape rank 0",
        snap(running(), children=[ptj(1, "Running")]),
        "steady",
        requeue=30.0,
        check=lambda p: p.monitor,
    ),
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
    # --- README: the pods never start ---
    Case(
        "Pending, a pod unschedulable → the scheduler's words in status and a Warning",
        snap(pending(), children=[ptj(1, "Created")], pods=(STUCK_POD,)),
        "pods_stuck",
        status={
            "reason": "Unschedulable",
            "message": "pod j-a1-worker-0: 0/16 nodes are available: 16 Insufficient vpc.amazonaws.com/efa.",
        },
        events=[(True, "Unschedulable")],
        check=ready_is("False", "Unschedulable"),
    ),
    Case(
        "Pending, image pull failing → the kubelet's reason",
        snap(pending(), children=[ptj(1, "Created")], pods=(PULL_POD,)),
        "pods_stuck",
        status={"reason": "ImagePullBackOff"},
        events=[(True, "ImagePullBackOff")],
        check=message_has('container pytorch: ImagePullBackOff: Back-off pulling image "nope:1"'),
    ),
    Case(
        "Pending, pull policy Never and the image not on the node → the kubelet's reason, naming the image",
        snap(pending(), children=[ptj(1, "Created")], pods=(NEVER_PULL_POD,)),
        "pods_stuck",
        status={"reason": "ErrImageNeverPull"},
        events=[(True, "ErrImageNeverPull")],
        check=message_has('ErrImageNeverPull: Container image "nope:1" is not present'),
    ),
    Case(
        "start-up timeout waiting for an image → Failed in the kubelet's words, no restart spent, child deleted",
        snap(pending(attemptCreationTime=ago(minutes=31)), children=[ptj(1, "Created")], pods=(PULL_POD,)),
        "startup_timeout",
        status={"phase": "Failed", "reason": "ImagePullBackOff"},
        delete=("j-a1",),
        events=[(True, "ImagePullBackOff")],
        check=all_of(
            message_has('Back-off pulling image "nope:1"', "a new attempt would wait for the same image"),
            lambda p: p.restart is None and "restarts" not in p.status and "attempt" not in p.status,
        ),
    ),
    Case(
        "...and the same for an image the node may never pull",
        snap(pending(attemptCreationTime=ago(minutes=31)), children=[ptj(1, "Created")], pods=(NEVER_PULL_POD,)),
        "startup_timeout",
        status={"phase": "Failed", "reason": "ErrImageNeverPull"},
        delete=("j-a1",),
    ),
    Case(
        "the same start-up problem already recorded: nothing to write",
        snap(
            pending(
                reason="Unschedulable",
                message="pod j-a1-worker-0: 0/16 nodes are available: 16 Insufficient vpc.amazonaws.com/efa.",
            ),
            children=[ptj(1, "Created")],
            pods=(STUCK_POD,),
        ),
        "steady",
    ),
    Case(
        "a pod merely creating its container is no problem",
        snap(pending(), children=[ptj(1, "Created")], pods=(pod(waiting=("pytorch", "ContainerCreating", "")),)),
        "steady",
    ),
    Case(
        "startupTimeoutMinutes passed → Restarting StartupTimeout, restart spent, attempt 1 deleted",
        snap(pending(attemptCreationTime=ago(minutes=31)), children=[ptj(1, "Created")]),
        "startup_timeout",
        status={"phase": "Restarting", "attempt": 2, "restarts": 1, "reason": "StartupTimeout"},
        delete=("j-a1",),
        restart=Reason.STARTUP_TIMEOUT,
        check=message_has("did not start within startupTimeoutMinutes 30: no worker pod started"),
    ),
    Case(
        "the start-up timeout names the pods' own reason",
        snap(pending(attemptCreationTime=ago(minutes=31)), children=[ptj(1, "Created")], pods=(STUCK_POD,)),
        "startup_timeout",
        status={"reason": "StartupTimeout"},
        check=message_has("Insufficient vpc.amazonaws.com/efa"),
    ),
    Case(
        "not yet at the start-up deadline: no restart",
        snap(pending(attemptCreationTime=ago(minutes=29)), children=[ptj(1, "Created")]),
        "steady",
    ),
    Case(
        "the start-up timeout with the budget spent → Failed, the stuck PyTorchJob deleted",
        snap(
            pending(restarts=1, attemptCreationTime=ago(minutes=31)),
            spec=BUDGET1,
            children=[ptj(1, "Created", raw_spec=BUDGET1)],
        ),
        "startup_timeout",
        status={"phase": "Failed", "reason": "RestartBudgetExhausted"},
        delete=("j-a1",),
    ),
    Case(
        "a start-up timeout of a GPU job names the flight recorder (beside a file:// checkpoint)",
        snap(
            pending(attemptCreationTime=ago(minutes=31)), spec=GPU_FILE, children=[ptj(1, "Created", raw_spec=GPU_FILE)]
        ),
        "startup_timeout",
        check=lambda p: (
            p.status["flightRecorder"]
            == {
                "attempt": 1,
                "reason": "startup-timeout",
                "persistent": True,
                "note": "beside the checkpoints",
                "path": "/mnt/fsx/ckpt/j/flight-recorder/attempt-1/rank_<rank>",
            }
        ),
    ),
    Case(
        "a stuck attempt with bad nodes plans avoidance again (needs the Ready nodes)",
        snap(
            pending(
                attempt=2,
                restarts=1,
                attemptCreationTime=ago(minutes=31),
                badNodes=[{"node": "n1", "reason": "XID 79", "attempt": 1}],
                avoidNodes=["n1"],
            ),
            spec=gpu(),
            children=[ptj(2, "Created", raw_spec=gpu())],
        ),
        "startup_timeout",
        need="ready_nodes",
    ),
    Case(
        "...and gives the avoided node back when too few are Ready",
        snap(
            pending(
                attempt=2,
                restarts=1,
                attemptCreationTime=ago(minutes=31),
                badNodes=[{"node": "n1", "reason": "XID 79", "attempt": 1}],
                avoidNodes=["n1"],
            ),
            spec=gpu(),
            children=[ptj(2, "Created", raw_spec=gpu())],
            ready_nodes_read=True,
            ready_nodes=frozenset({"n1", "n2"}),
        ),
        "startup_timeout",
        status={"attempt": 3, "avoidNodes": []},
    ),
    # --- README: the job hangs ---
    Case(
        "no step for hangTimeoutMinutes → Restarting Hang, TrainingHealthy False",
        snap(
            running(attemptStartTime=ago(minutes=40), progress={"heartbeatTime": ago(minutes=31), "step": 50}),
            children=[ptj(1, "Running")],
        ),
        "unhealthy",
        status={"phase": "Restarting", "attempt": 2, "restarts": 1, "reason": "Hang"},
        delete=("j-a1",),
        restart=Reason.HANG,
        check=all_of(healthy_is("False", "Hang"), message_has("no training step completed")),
    ),
    Case(
        "a step 29 minutes ago is no hang (hangTimeoutMinutes 30)",
        snap(running(progress={"heartbeatTime": ago(minutes=29), "step": 50}), children=[ptj(1, "Running")]),
        "steady",
    ),
    Case(
        "a hang with the budget spent → Failed, the hung PyTorchJob deleted",
        snap(
            running(restarts=1, attemptStartTime=ago(minutes=40), progress={"heartbeatTime": ago(minutes=31)}),
            spec=BUDGET1,
            children=[ptj(1, "Running", raw_spec=BUDGET1)],
        ),
        "unhealthy",
        status={"phase": "Failed", "reason": "RestartBudgetExhausted"},
        delete=("j-a1",),
        check=healthy_is("False", "Hang"),
    ),
    Case(
        "a hang of a GPU job names where the NCCL flight recorder dumped",
        snap(
            running(attemptStartTime=ago(minutes=40), progress={"heartbeatTime": ago(minutes=31)}),
            spec=GPU_FILE,
            children=[ptj(1, "Running", raw_spec=GPU_FILE)],
        ),
        "unhealthy",
        check=lambda p: (
            p.status["flightRecorder"]["reason"] == "hang" and "flight-recorder/attempt-1" in p.status["message"]
        ),
    ),
    Case(
        "no first step within firstStepTimeoutMinutes → NoFirstStep",
        snap(
            running(attemptStartTime=ago(minutes=46), progress={}),
            spec=tiny(resilience={"firstStepTimeoutMinutes": 45}),
            children=[ptj(1, "Running", raw_spec=tiny(resilience={"firstStepTimeoutMinutes": 45}))],
        ),
        "unhealthy",
        status={"reason": "NoFirstStep", "attempt": 2},
        restart=Reason.NO_FIRST_STEP,
        check=healthy_is("False", "NoFirstStep"),
    ),
    # --- README: loss NaN/Inf, loss spike, stale checkpoint ---
    Case(
        "3 NaN losses in a row → NonFiniteLoss, resume before the first bad step",
        snap(running(), children=[ptj(1, "Running")], progress=NAN),
        "unhealthy",
        status={"reason": "NonFiniteLoss", "attempt": 2, "resumeBeforeStep": 41},
        restart=Reason.NON_FINITE_LOSS,
        check=healthy_is("False", "NonFiniteLoss"),
    ),
    Case(
        "NaN losses with the budget spent → Failed, nothing left to roll back",
        snap(running(restarts=1), spec=BUDGET1, children=[ptj(1, "Running", raw_spec=BUDGET1)], progress=NAN),
        "unhealthy",
        status={"phase": "Failed", "resumeBeforeStep": ABSENT},
        delete=("j-a1",),
    ),
    Case(
        "a loss spike is ignored while lossSpikeFactor is unset (the default)",
        snap(running(), children=[ptj(1, "Running")], progress=SPIKE),
        "steady",
    ),
    Case(
        "a loss spike with lossSpikeFactor → LossSpike, roll back before the spike",
        snap(
            running(),
            spec=tiny(resilience={"lossSpikeFactor": 3.0}, checkpoint={"uri": "file:///ck/"}),
            children=[
                ptj(1, "Running", raw_spec=tiny(resilience={"lossSpikeFactor": 3.0}, checkpoint={"uri": "file:///ck/"}))
            ],
            progress=SPIKE,
        ),
        "unhealthy",
        status={"reason": "LossSpike", "resumeBeforeStep": 290},
        restart=Reason.LOSS_SPIKE,
    ),
    Case(
        "no checkpoint for 2 × intervalMinutes → CheckpointStale and a Warning, no restart",
        snap(
            running(attemptStartTime=ago(minutes=11), progress={"heartbeatTime": ago(seconds=5)}),
            spec=tiny(checkpoint={"uri": "file:///ck/", "intervalMinutes": 5}),
            children=[ptj(1, "Running", raw_spec=tiny(checkpoint={"uri": "file:///ck/", "intervalMinutes": 5}))],
            progress=Progress(step=9, heartbeat=NOW.timestamp() - 5),
        ),
        "health_conditions",
        events=[(True, "NoRecentCheckpoint")],
        check=lambda p: cond(p.status, "CheckpointStale")["status"] == "True" and "phase" not in p.status,
    ),
    Case(
        "the attempt applied the rollback → resumeBeforeStep cleared, RolledBack event",
        snap(
            running(
                attempt=2,
                restarts=1,
                resumeBeforeStep=41,
                conditions=[{"type": "TrainingHealthy", "status": "True", "reason": "StepsCompleting"}],
            ),
            children=[ptj(2, "Running")],
            progress=Progress(step=45, heartbeat=NOW.timestamp() - 5, resumed_before_step=41),
        ),
        "health_conditions",
        status={"resumeBeforeStep": None},
        events=[(False, "RolledBack")],
    ),
    Case(
        "steps completing again after a NaN restart → TrainingHealthy True",
        snap(
            running(
                attempt=2,
                restarts=1,
                conditions=[{"type": "TrainingHealthy", "status": "False", "reason": "NonFiniteLoss"}],
            ),
            children=[ptj(2, "Running")],
        ),
        "health_conditions",
        check=healthy_is("True", "StepsCompleting"),
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
    # --- spec changes ---
    Case(
        "a mutable field changed → SpecAccepted True, observedGeneration moves",
        snap(running(), spec=tiny(resilience={"maxRestarts": 3}), generation=2, children=[ptj(1, "Running")]),
        "spec_changed",
        status={"observedGeneration": 2},
        events=[(False, "SpecUpdated")],
        outcome="updated",
        check=lambda p: cond(p.status, "SpecAccepted")["reason"] == "Applied",
    ),
    Case(
        "an immutable field changed (no CEL) → refused, observedGeneration stays",
        snap(running(), spec=tiny(training={"maxSteps": 99}), generation=2, children=[ptj(1, "Running")]),
        "spec_changed",
        status={"observedGeneration": ABSENT},
        events=[(True, "SpecChangeRejected")],
        outcome="invalid",
        check=lambda p: cond(p.status, "SpecAccepted")["reason"] == "ImmutableFieldChanged",
    ),
    Case(
        "a mutable change that makes the spec invalid → refused InvalidSpec",
        snap(
            running(),
            spec=tiny(resilience={"maxRestarts": -1}),
            generation=2,
            children=[ptj(1, "Running", raw_spec=tiny(resilience={"maxRestarts": -1}))],
        ),
        "spec_changed",
        check=lambda p: cond(p.status, "SpecAccepted")["reason"] == "InvalidSpec",
    ),
    Case(
        "a refused generation is not judged again",
        snap(
            running(
                conditions=[
                    {
                        "type": "SpecAccepted",
                        "status": "False",
                        "reason": "ImmutableFieldChanged",
                        "observedGeneration": 2,
                    },
                    {"type": "TrainingHealthy", "status": "True", "reason": "StepsCompleting"},
                ]
            ),
            spec=tiny(training={"maxSteps": 99}),
            generation=2,
            children=[ptj(1, "Running")],
        ),
        "steady",
    ),
    # --- README: the operator dies (restart, failover): nothing twice, nothing back ---
    Case(
        "first sight after an operator restart: adopt, say so once, write nothing",
        snap(running(), children=[ptj(1, "Running")], first_sight=True),
        "steady",
        events=[(False, "Adopted")],
        outcome="adopted",
    ),
    Case(
        "right after the start, a recorded PyTorchJob not seen yet is waited for, not created",
        snap(running(), first_sight=True, awaiting_watch=True),
        "awaiting_watch",
        requeue=1.0,
        check=lambda p: p.waiting,
    ),
    Case(
        "the recorded PyTorchJob is really gone (deleted by hand): attempt N is created again",
        snap(running(attempt=2, restarts=1)),
        "missing_child",
        create="j-a2",
    ),
    Case(
        "its PyTorchJob is being deleted: wait for the DELETED event",
        snap(running(), children=[ptj(1, "Running", deleting=True)]),
        "child_deleting",
    ),
    Case(
        "an older attempt's failure is not this attempt's",
        snap(pending(attempt=2, restarts=1), children=[ptj(1, "Failed"), ptj(2, "Created")]),
        "steady",
    ),
    Case(
        "a PyTorchJob of the current name owned by another is not ours to follow",
        snap(running(), children=[ptj(1, "Failed", owned=False)]),
        "missing_child",
        status={"phase": "Failed", "reason": "NameConflict"},
    ),
    Case(
        "the render cannot handle the operator's default etcd endpoint → Failed RenderFailed",
        snap(),
        "new_job",
        status={"phase": "Failed", "reason": "RenderFailed"},
        events=[(True, "RenderFailed")],
        check=message_has("cannot render the PyTorchJob of attempt 1"),
    ),
]

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
CASES = CASES + KUEUE_CASES + SICK_CASES + SLOW_CASES


def _config(case: Case):
    from dataclasses import replace

    from .decide_world import CFG

    if case.id.startswith("the render cannot"):
        return replace(CFG, default_etcd_endpoint="etcd:notaport")
    if "floor at 0" in case.id:
        return replace(CFG, min_restart_backoff=0.0)
    return CFG


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_decide(case: Case):
    plan = decide_(case.observed, _config(case))
    assert plan.situation == case.situation, plan
    assert plan.need == case.need
    if case.need is not None:
        assert not plan.writes
        return
    assert (plan.create["metadata"]["name"] if plan.create else None) == case.create
    if case.status is None and case.check is None:
        assert plan.status is None, plan.status
    for key, value in (case.status or {}).items():
        if value is ABSENT:
            assert key not in plan.status, (key, plan.status[key])
        else:
            assert key in plan.status and plan.status[key] == value, (key, plan.status.get(key), value)
    if case.delete is not None:
        assert tuple(plan.delete) == case.delete
    elif plan.status is None:
        assert plan.delete == ()
    if case.events or plan.status is not None:
        assert [(e.warning, e.reason.value) for e in plan.events] == case.events or not case.events
    if case.restart is not None:
        assert plan.restart == case.restart
    elif plan.situation != "follow" and plan.status is not None and plan.status.get("phase") == "Restarting":
        assert plan.restart == plan.status["reason"]
    else:
        assert plan.restart is None
    if case.requeue is not None:
        assert plan.requeue == pytest.approx(case.requeue)
    if case.outcome is not None:
        assert plan.outcome == case.outcome
    if case.check is not None:
        case.check(plan)
    if plan.status is not None:  # whatever decide writes is in the typed status (the CRD prunes the rest)
        assert set(plan.status) <= wire_fields(), set(plan.status) - wire_fields()
        from llmtrain.controller.adapters.act import wire

        LLMTrainingJobStatus.model_validate({k: v for k, v in wire(plan.status).items() if v is not None})


def test_the_table_covers_every_situation_and_has_60_cases():
    from llmtrain.controller.policy.decide import SITUATIONS

    covered = {c.situation for c in CASES}
    named = {s.__name__ for s in SITUATIONS} | {"resumed"}
    assert named - covered == set(), named - covered
    assert len(CASES) >= 60


def test_decide_reads_no_clock():
    """The same snapshot decides the same, whenever: `now` comes from the snapshot."""
    o = snap(pending(attemptCreationTime=ago(minutes=31)), children=[ptj(1, "Created")])
    assert decide_(o) == decide_(o)
    later_o = o.with_(now=NOW + dt.timedelta(minutes=5))
    assert decide_(later_o).status["attemptCreationTime"] != decide_(o).status["attemptCreationTime"]


def test_a_phase_this_version_cannot_read_is_not_a_new_job():
    """A status written by a newer operator (a phase added later) must never restart the job at
    attempt 1: the snapshot reads what it can, and no new-job situation applies."""
    o = snap(
        {"phase": "Queued", "attempt": 3, "restarts": 2, "child": "j-a3", "observedGeneration": 1},
        children=[ptj(3, "Created")],
    )
    plan = decide_(o)
    assert plan.situation not in ("new_job", "new_invalid", "new_suspended") and plan.create is None
    assert not plan.status or plan.status.get("attempt", 3) >= 3
