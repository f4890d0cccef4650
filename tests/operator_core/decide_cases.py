"""The decide table's cases, shared by its stage files (tests/operator_core/test_decide_<stage>.py):
decide() with no cluster, one case per lifecycle situation and per row of the README's "When things
fail" table. Expected values come from that table and from the cluster tests' assertions
(phase/reason names, budget, backoff 10 s doubling to 300 s, free preflight and resume restarts, the
pods' own words while Pending), not from running decide.

Each case: a snapshot (decide_world.snap) and what the plan must say:
  situation  the rule that applies; need: the extra read it asks for first
  status     a subset of the status update (ABSENT: the key must not be written)
  create     the PyTorchJob to create (its name), or None
  delete     the PyTorchJobs to delete; events: [(warning, reason)]; restart: the metric's reason
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from llmtrain.status import LLMTrainingJobStatus, Reason, wire_fields

from .decide_world import ago, decide_, gpu, later, tiny

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


GPU_FILE = {
    **gpu(checkpoint={"uri": "file:///mnt/fsx/ckpt/j/"}),
    "cluster": {
        "instanceType": "p5.48xlarge",
        "nodes": 2,
        "volumes": [{"name": "fsx", "claimName": "fsx", "mountPath": "/mnt/fsx"}],
    },
}
RESTARTING = {
    "phase": "Restarting",
    "attempt": 2,
    "restarts": 1,
    "child": "j-a2",
    "observedGeneration": 1,
    "attemptCreationTime": later(seconds=10),
    "nextAttemptTime": later(seconds=10),
}


def _config(case: Case):
    from dataclasses import replace

    from .decide_world import CFG

    if case.id.startswith("the render cannot"):
        return replace(CFG, default_etcd_endpoint="etcd:notaport")
    if "floor at 0" in case.id:
        return replace(CFG, min_restart_backoff=0.0)
    return CFG


def assert_decision(case: Case):
    """What test_decide asserts of every case: the plan decide() makes of `case.observed`."""
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
