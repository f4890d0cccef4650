"""The decide table's first situations (decide.py tries them in this order): a terminal job stays,
a new job is judged and its attempt 1 created (or it starts suspended, or fails on its spec), an
edited spec is accepted or refused, and right after an operator start a recorded child is awaited
from the watch."""

from __future__ import annotations

from typing import Any

from ...spec import model_summary
from ...status import Phase, Reason
from .situation import LIVE, Transition, current_child, situation
from .snapshot import Event, Observed, Plan
from .writes import (
    READY,
    SPEC_ACCEPTED,
    cond,
    conds_of,
    create_attempt,
    fail,
    plan_status,
    spec_hash,
    validated_conditions,
)

WATCH_WAIT = 1.0  # seconds between looks while the watch may still bring a recorded child


@situation()
def terminal(o: Observed, cfg) -> Plan | None:
    """Succeeded and Failed are final: nothing is written again."""
    if o.status.phase is not None and o.status.phase.terminal:
        return Plan("terminal", outcome="unchanged" if o.first_sight else None)
    return None


@situation(Transition(("[*]",), "Failed", Reason.INVALID_SPEC))
def new_invalid(o: Observed, cfg) -> Plan | None:
    """A new job whose spec does not validate: Failed with the validation's message, no child."""
    if not o.is_new or o.spec is not None:
        return None
    return fail(o, "new_invalid", Reason.INVALID_SPEC, o.spec_error or "invalid spec")


@situation(Transition(("[*]",), "Suspended", Reason.SUSPENDED))
def new_suspended(o: Observed, cfg) -> Plan | None:
    """A new job created with spec.suspend true: Suspended, attempt 1 not started."""
    if not o.is_new or not o.raw_spec.get("suspend"):
        return None
    conds = cond(o, validated_conditions(o, []), READY, False, Reason.SUSPENDED, "spec.suspend is true")
    assert o.spec is not None  # a valid spec: new_job returned for an invalid one
    return Plan(
        "new_suspended",
        status={
            "phase": Phase.SUSPENDED,
            "backend": o.backend,  # decided now: a default changed while it is suspended does not move it
            "attempt": 1,
            "restarts": 0,
            "observedGeneration": o.generation,
            "model": model_summary(o.spec.model),
            "plan": plan_status(o.spec),
            "conditions": conds,
            "reason": Reason.SUSPENDED,
            "message": "created suspended: spec.suspend is true",
        },
        events=(Event(False, Reason.SUSPENDED, "created suspended (spec.suspend is true)"),),
        outcome="suspended",
    )


@situation(
    Transition(("[*]",), "Pending", Reason.CREATED),
    Transition(("[*]",), "Failed", Reason.RENDER_FAILED),
    Transition(("[*]",), "Failed", Reason.ATTEMPT_REJECTED),
    Transition(("[*]",), "Failed", Reason.BACKEND_NOT_INSTALLED),
    Transition(("[*]",), "Failed", Reason.NAME_CONFLICT),
)
def new_job(o: Observed, cfg) -> Plan | None:
    """A new job: create (or adopt) attempt 1's child, then Pending."""
    if not o.is_new:
        return None
    return create_attempt(o, cfg, 1, "new_job")


def _spec_answered(o: Observed) -> bool:
    """The current generation was already judged (and refused: observedGeneration stays)."""
    c = o.status.condition(SPEC_ACCEPTED)
    return c is not None and c.observed_generation == o.generation


@situation(
    Transition(LIVE, "=", Reason.SPEC_APPLIED),
    Transition(LIVE, "=", Reason.IMMUTABLE_FIELD_CHANGED),
    Transition(LIVE, "=", Reason.INVALID_SPEC),
)
def spec_changed(o: Observed, cfg) -> Plan | None:
    """metadata.generation moved: only resilience, suspend and the checkpoint cadence may change
    (condition SpecAccepted; observedGeneration moves only when the change is accepted)."""
    if o.generation == o.status.observed_generation or _spec_answered(o):
        return None
    current = o.child(o.status.current_child)
    if current is not None and current.spec_hash != spec_hash(o.raw_spec):
        # The CRD's CEL rules normally stop this at the API server; this catches a CRD without them.
        msg = (
            "only spec.resilience, spec.suspend and spec.checkpoint.intervalMinutes/keep may "
            "change while the job exists; the running attempt keeps its original spec"
        )
        reason, ok = Reason.IMMUTABLE_FIELD_CHANGED, False
    elif o.spec is not None:
        msg, reason, ok = (
            "spec update applied (resilience and suspend now, checkpoint cadence from the next attempt)",
            Reason.SPEC_APPLIED,
            True,
        )
    else:
        msg, reason, ok = o.spec_error or "invalid spec", Reason.INVALID_SPEC, False
    update: dict[str, Any] = {"conditions": cond(o, conds_of(o), SPEC_ACCEPTED, ok, reason, msg)}
    if ok:
        update["observedGeneration"] = max(o.generation or 0, o.status.observed_generation or 0)
    event = Event(False, Reason.SPEC_UPDATED, msg) if ok else Event(True, Reason.SPEC_CHANGE_REJECTED, msg)
    return Plan("spec_changed", status=update, events=(event,), outcome="updated" if ok else "invalid")


@situation()
def awaiting_watch(o: Observed, cfg) -> Plan | None:
    """Right after an operator start the jobs' events come before their children's: a recorded child
    not seen yet is waited for a little (its event queues the job) before one GET."""
    if o.awaiting_watch and current_child(o) is None:
        return Plan("awaiting_watch", requeue=WATCH_WAIT, waiting=True)
    return None
