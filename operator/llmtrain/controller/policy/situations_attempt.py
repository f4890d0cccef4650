"""The decide table's situations about the current attempt's child (PyTorchJob, JobSet) itself, in
the order decide.py tries them: spec.suspend deletes it (and resumes as a new attempt), the restart
backoff waits, a missing one is created, a deleting one is waited for, and a failed one is judged
(forensics.py) into the next attempt or Failed when the restart budget is spent."""

from __future__ import annotations

from ...status import Phase, Reason
from . import forensics
from .child_status import parse_time
from .progress import timestamp
from .situation import ANY_ACTIVE, Transition, current_child, kind, situation
from .snapshot import Event, Observed, Plan
from .writes import READY, cond, conds_of, create_attempt, fail, needs_ready_nodes, resilience_of, restart


@situation(
    Transition(("Suspended",), "Pending", Reason.RESUMED), Transition(("Suspended",), "Restarting", Reason.RESUMED)
)
def suspended(o: Observed, cfg) -> Plan | None:
    """Suspended: keep the child deleted; spec.suspend false again resumes as a new attempt that
    spends no restart."""
    if o.status.phase != Phase.SUSPENDED:
        return None
    current = current_child(o)
    if o.raw_spec.get("suspend"):
        return Plan("suspended", delete=(current.name,) if current is not None and not current.deleting else ())
    if not o.status.current_child:  # created suspended: attempt 1 never started
        return Plan(
            "resumed",
            outcome="resumed",
            status={
                "phase": Phase.PENDING,
                "reason": Reason.RESUMED,
                "message": "spec.suspend is false: starting",
                "conditions": cond(o, conds_of(o), READY, False, Reason.PENDING, f"waiting for the {kind(o)} to run"),
            },
        )
    return restart(o, "resumed", Reason.RESUMED, "spec.suspend is false", spend=False, outcome="resumed")


@situation(Transition(ANY_ACTIVE, "Suspended", Reason.SUSPENDED))
def suspend(o: Observed, cfg) -> Plan | None:
    """spec.suspend true: Suspended, the attempt's child deleted (its pods get their grace period,
    the trainer checkpoints on SIGTERM); the restart budget is kept."""
    if not o.raw_spec.get("suspend"):
        return None
    current = current_child(o)
    msg = (
        f"spec.suspend is true: attempt {o.attempt} stopped (the trainer checkpoints on SIGTERM); "
        "the restart budget is kept; set it to false to resume from the newest checkpoint"
    )
    return Plan(
        "suspend",
        status={
            "phase": Phase.SUSPENDED,
            "reason": Reason.SUSPENDED,
            "message": msg,
            "nextAttemptTime": None,
            "conditions": cond(o, conds_of(o), READY, False, Reason.SUSPENDED, msg),
        },
        delete=(current.name,) if current is not None else (),
        events=(Event(False, Reason.SUSPENDED, msg),),
        outcome="suspended",
    )


@situation(Transition(("Restarting",), "=", None))
def backoff(o: Observed, cfg) -> Plan | None:
    """The next attempt is due at status.nextAttemptTime (restart backoff): look again then."""
    if current_child(o) is not None:
        return None
    due = parse_time(o.status.next_attempt_time)
    if due is not None and due > o.now:
        return Plan("backoff", requeue=(due - o.now).total_seconds() + 0.05)
    return None


@situation(
    Transition(ANY_ACTIVE, "=", Reason.CREATED),
    Transition(ANY_ACTIVE, "Failed", Reason.INVALID_SPEC),
    Transition(ANY_ACTIVE, "Failed", Reason.RENDER_FAILED),
    Transition(ANY_ACTIVE, "Failed", Reason.ATTEMPT_REJECTED),
    Transition(ANY_ACTIVE, "Failed", Reason.BACKEND_NOT_INSTALLED),
    Transition(ANY_ACTIVE, "Failed", Reason.NAME_CONFLICT),
)
def missing_child(o: Observed, cfg) -> Plan | None:
    """Status names attempt N but its child does not exist (a restart, a crash between two steps, a
    child deleted by hand): create attempt N's."""
    if current_child(o) is not None:
        return None
    if o.spec is None:
        return fail(o, "missing_child", Reason.INVALID_SPEC, o.spec_error or "invalid spec")
    return create_attempt(o, cfg, o.attempt, "missing_child")


@situation()
def child_deleting(o: Observed, cfg) -> Plan | None:
    """The current child is being deleted: wait for its DELETED event."""
    current = current_child(o)
    if current is not None and current.deleting:
        return Plan("child_deleting")  # its DELETED event brings us back
    return None


@situation(
    Transition(ANY_ACTIVE, "Restarting", Reason.FAILED),
    Transition(ANY_ACTIVE, "Restarting", Reason.PREFLIGHT_FAILED),
    Transition(ANY_ACTIVE, "Failed", Reason.RESTART_BUDGET_EXHAUSTED),
)
def attempt_failed(o: Observed, cfg) -> Plan | None:
    """The current attempt's child failed: the next attempt, or Failed when the budget is spent. Its
    pods' failures (caught by the pod watch before the backend's controller deleted the pods) say
    which nodes to blame and whether it was the preflight check."""
    current = current_child(o)
    if current is None or current.state != "Failed":
        return None
    if o.failures is None:
        return Plan("attempt_failed", need="failures")
    st = o.status
    failed = forensics.failed_attempt(o.failures, current.failure_message, st.preflight_failures or 0, o.ran_nodes)
    spent = failed.spend and (st.restarts or 0) >= resilience_of(o).max_restarts
    if not spent and needs_ready_nodes(o, failed.blamed):
        return Plan("attempt_failed", need="ready_nodes")

    def amend(update: dict) -> dict:
        avoid = forensics.amend_failed(
            update,
            failed,
            spec=o.spec,
            attempt=o.attempt,
            bad_nodes=o.raw_status.get("badNodes") or [],
            preflight_failures=st.preflight_failures or 0,
            ready=o.ready_nodes,
            when=timestamp(o.now),
        )
        busbw = (failed.verdict or {}).get("busBandwidthGBps")
        return {
            "blamed": failed.blamed,
            "taint": tuple(b for b in failed.blamed if b["node"] in avoid),
            "preflight_busbw": busbw if isinstance(busbw, (int, float)) else None,
        }

    return restart(
        o,
        "attempt_failed",
        failed.reason,
        failed.message,
        spend=failed.spend,
        amend=amend,
        floor=cfg.min_restart_backoff,
    )
