"""decide(observed, config) -> Plan: the job's state machine, as one pure function.

No I/O, no clock (the snapshot's `now`), no globals, no kopf or kubernetes: the only code that sets
status.phase, attempt, restarts, reason and the conditions. It is a table of situations, each a
small function that returns a Plan when it applies (None otherwise), tried in order; the first one
that applies decides. A new situation (a Kueue admission, a goodput fact) is a new function and
a row in SITUATIONS, and the state diagram (docs/reference/state-machine.md) is generated from
the rows' `Transition`s (scripts/gen-state-diagram.py).

Invariants (tests/operator_core/test_decide_properties.py checks them over random histories):
  * status.attempt and status.restarts never go down; a restart raises attempt by one;
  * restarts never exceed spec.resilience.maxRestarts: beyond it the job is Failed;
  * a terminal phase (Succeeded, Failed) stays;
  * attempt N's PyTorchJob is created only from a snapshot that says attempt N and has none.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..render import pytorchjob_name
from ..spec import model_summary
from ..status import Phase, Reason
from . import accounting, cadence, forensics, health
from .config import OperatorConfig
from .snapshot import Event, Observed, Plan
from .status import PHASE_OF, parse_time, startup_problem, timestamp
from .transitions import (
    READY,
    SPEC_ACCEPTED,
    SPEC_HASH,
    cond,
    conds_of,
    create_attempt,
    fail,
    needs_ready_nodes,
    plan_status,
    resilience_of,
    restart,
    restart_backoff,
    restart_stuck,
    spec_hash,
    validated_conditions,
)

__all__ = ["SITUATIONS", "SPEC_HASH", "Transition", "decide", "restart_backoff", "spec_hash"]
WATCH_WAIT = 1.0  # seconds between looks while the watch may still bring a recorded PyTorchJob
# Kueue says why a Workload waits (QuotaReserved=False) a moment after the PyTorchJob is created,
# and no watch tells the operator when: look again this often for KUEUE_WORDS_WINDOW seconds after
# the attempt's creation, then at the progress interval (one Workload LIST per look).
KUEUE_WORDS_WAIT, KUEUE_WORDS_WINDOW = 2.0, 60.0


@dataclass(frozen=True)
class Transition:
    """One edge a situation can take, for the state diagram: from phases → to phase, with reason."""

    frm: tuple[str, ...]
    to: str
    reason: Reason | None


Situation = Callable[[Observed, OperatorConfig], "Plan | None"]


def situation(*edges: Transition):
    def mark(fn):
        fn.transitions = edges
        return fn

    return mark


# --- situations, in the order they are tried -----------------------------------------------------

ANY_ACTIVE = ("Pending", "Running", "Restarting")
LIVE = (*ANY_ACTIVE, "Suspended")


@situation()
def terminal(o: Observed, cfg) -> Plan | None:
    """Succeeded and Failed are final: nothing is written again."""
    if o.status.phase is not None and o.status.phase.terminal:
        return Plan("terminal", outcome="unchanged" if o.first_sight else None)
    return None


@situation(Transition(("[*]",), "Failed", Reason.INVALID_SPEC))
def new_invalid(o: Observed, cfg) -> Plan | None:
    """A new job whose spec does not validate: Failed with the validation's message, no PyTorchJob."""
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
    Transition(("[*]",), "Failed", Reason.PYTORCHJOB_REJECTED),
    Transition(("[*]",), "Failed", Reason.NAME_CONFLICT),
)
def new_job(o: Observed, cfg) -> Plan | None:
    """A new job: create (or adopt) attempt 1's PyTorchJob, then Pending."""
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
    current = o.child(o.status.pytorch_job)
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


def _current(o: Observed):
    c = o.child(pytorchjob_name(o.name, o.attempt))
    return c if c is not None and c.owned else None


@situation()
def awaiting_watch(o: Observed, cfg) -> Plan | None:
    """Right after an operator start the jobs' events come before their PyTorchJobs': a recorded
    PyTorchJob not seen yet is waited for a little (its event queues the job) before one GET."""
    if o.awaiting_watch and _current(o) is None:
        return Plan("awaiting_watch", requeue=WATCH_WAIT, waiting=True)
    return None


@situation(
    Transition(("Suspended",), "Pending", Reason.RESUMED), Transition(("Suspended",), "Restarting", Reason.RESUMED)
)
def suspended(o: Observed, cfg) -> Plan | None:
    """Suspended: keep the PyTorchJob deleted; spec.suspend false again resumes as a new attempt
    that spends no restart."""
    if o.status.phase != Phase.SUSPENDED:
        return None
    current = _current(o)
    if o.raw_spec.get("suspend"):
        return Plan("suspended", delete=(current.name,) if current is not None and not current.deleting else ())
    if not o.status.pytorch_job:  # created suspended: attempt 1 never started
        return Plan(
            "resumed",
            outcome="resumed",
            status={
                "phase": Phase.PENDING,
                "reason": Reason.RESUMED,
                "message": "spec.suspend is false: starting",
                "conditions": cond(o, conds_of(o), READY, False, Reason.PENDING, "waiting for the PyTorchJob to run"),
            },
        )
    return restart(o, "resumed", Reason.RESUMED, "spec.suspend is false", spend=False, outcome="resumed")


@situation(Transition(ANY_ACTIVE, "Suspended", Reason.SUSPENDED))
def suspend(o: Observed, cfg) -> Plan | None:
    """spec.suspend true: Suspended, the attempt's PyTorchJob deleted (its pods get their grace
    period, the trainer checkpoints on SIGTERM); the restart budget is kept."""
    if not o.raw_spec.get("suspend"):
        return None
    current = _current(o)
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
    if _current(o) is not None:
        return None
    due = parse_time(o.status.next_attempt_time)
    if due is not None and due > o.now:
        return Plan("backoff", requeue=(due - o.now).total_seconds() + 0.05)
    return None


@situation(
    Transition(ANY_ACTIVE, "=", Reason.CREATED),
    Transition(ANY_ACTIVE, "Failed", Reason.INVALID_SPEC),
    Transition(ANY_ACTIVE, "Failed", Reason.RENDER_FAILED),
    Transition(ANY_ACTIVE, "Failed", Reason.PYTORCHJOB_REJECTED),
    Transition(ANY_ACTIVE, "Failed", Reason.NAME_CONFLICT),
)
def missing_child(o: Observed, cfg) -> Plan | None:
    """Status names attempt N but its PyTorchJob does not exist (a restart, a crash between two
    steps, a PyTorchJob deleted by hand): create attempt N's."""
    if _current(o) is not None:
        return None
    if o.spec is None:
        return fail(o, "missing_child", Reason.INVALID_SPEC, o.spec_error or "invalid spec")
    return create_attempt(o, cfg, o.attempt, "missing_child")


@situation()
def child_deleting(o: Observed, cfg) -> Plan | None:
    """The current PyTorchJob is being deleted: wait for its DELETED event."""
    current = _current(o)
    if current is not None and current.deleting:
        return Plan("child_deleting")  # its DELETED event brings us back
    return None


@situation(
    Transition(ANY_ACTIVE, "Restarting", Reason.FAILED),
    Transition(ANY_ACTIVE, "Restarting", Reason.PREFLIGHT_FAILED),
    Transition(ANY_ACTIVE, "Failed", Reason.RESTART_BUDGET_EXHAUSTED),
)
def attempt_failed(o: Observed, cfg) -> Plan | None:
    """The current attempt's PyTorchJob failed: the next attempt, or Failed when the budget is
    spent. Its pods' failures (caught by the pod watch before the training-operator deleted the
    pods) say which nodes to blame and whether it was the preflight check."""
    current = _current(o)
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


# --- Kueue: the attempt's PyTorchJob is suspended until Kueue admits it (controller/kueue.py) ---


def _queue_words(o: Observed) -> str:
    w = o.workload
    queue = o.spec.cluster.queue_name if o.spec is not None else None
    where = f"LocalQueue {queue}" if queue else "its queue"
    if w is None:
        priority = o.spec.cluster.workload_priority_class if o.spec is not None else None
        hint = (
            (
                f"; if it stays so, check that spec.cluster.workloadPriorityClass {priority!r} names a "
                "WorkloadPriorityClass: Kueue makes no Workload until it does"
            )
            if priority
            else ""
        )
        return f"waiting for Kueue to admit the PyTorchJob ({where}; no Kueue Workload for it yet{hint})"
    words = f"waiting in {where} for Kueue to admit Workload {w.name}: {w.message or 'not admitted yet'}"
    if queue and f"LocalQueue {queue} doesn't exist" in w.message:
        words += " (spec.cluster.queueName names no LocalQueue in this namespace)"
    return words


def _awaiting_kueue_words(o: Observed) -> bool:
    """A new attempt's PyTorchJob waits suspended and Kueue has not said why yet (no Workload, or
    one without a message), within KUEUE_WORDS_WINDOW of the attempt's creation."""
    current = _current(o)
    if current is None or not current.suspended or not o.workload_read:
        return False
    if o.workload is not None and o.workload.message:
        return False
    created = parse_time(o.status.attempt_creation_time)
    return created is not None and (o.now - created).total_seconds() < KUEUE_WORDS_WINDOW


@situation(Transition(("Running",), "Pending", Reason.PREEMPTED))
def preempted(o: Observed, cfg) -> Plan | None:
    """Kueue suspended the running attempt's PyTorchJob again (preempted by a higher priority, or
    evicted): its pods get their grace period and the trainer saves on SIGTERM. Pending, no restart
    spent: the same PyTorchJob (the same Workload, in its place in the queue) runs again once
    re-admitted, from the newest checkpoint."""
    current = _current(o)
    if o.status.phase != Phase.RUNNING or current is None or not current.suspended:
        return None
    if not o.workload_read:
        return Plan("preempted", need="workload")
    w = o.workload
    why = f"{w.evicted}: {w.evicted_message}" if w is not None and w.evicted else "its PyTorchJob was suspended"
    msg = f"attempt {o.attempt} preempted by Kueue ({why}); no restart spent, queued again"
    return Plan(
        "preempted",
        status={
            "phase": Phase.PENDING,
            "reason": Reason.PREEMPTED,
            "message": msg,
            "admissionTime": None,
            "conditions": cond(o, conds_of(o), READY, False, Reason.QUEUED, msg),
        },
        events=(Event(True, Reason.PREEMPTED, msg),),
        outcome="preempted",
    )


@situation(Transition(("Pending", "Restarting"), "Pending", Reason.QUEUED))
def queued(o: Observed, cfg) -> Plan | None:
    """The attempt's PyTorchJob waits suspended for Kueue: Pending, reason Queued (Preempted stays,
    until re-admission, for one that was taken back), Kueue's own words in status.message and an
    event when they change. No start-up deadline runs while queued."""
    current = _current(o)
    if o.status.phase not in (Phase.PENDING, Phase.RESTARTING) or current is None or not current.suspended:
        return None
    if not o.workload_read:
        return Plan("queued", need="workload")
    reason = Reason.PREEMPTED if o.status.reason == Reason.PREEMPTED.value else Reason.QUEUED
    words = _queue_words(o)
    msg = f"attempt {o.attempt} was preempted (no restart spent); {words}" if reason == Reason.PREEMPTED else words
    if (o.status.phase, o.status.reason, o.status.message) == (Phase.PENDING, reason.value, msg):
        return None
    return Plan(
        "queued",
        status={
            "phase": Phase.PENDING,
            "reason": reason,
            "message": msg,
            "admissionTime": None,
            "conditions": cond(o, conds_of(o), READY, False, Reason.QUEUED, msg),
        },
        events=(Event(False, Reason.QUEUED, msg),),
    )


@situation(Transition(("Pending", "Restarting"), "=", Reason.ADMITTED))
def admitted(o: Observed, cfg) -> Plan | None:
    """Kueue admitted the attempt (unsuspended its PyTorchJob): record when, since the start-up
    deadline counts from admission, not from creation."""
    current = _current(o)
    if (
        o.status.phase not in (Phase.PENDING, Phase.RESTARTING)
        or current is None
        or current.suspended
        or o.status.admission_time is not None
        or not (
            o.status.reason in (Reason.QUEUED.value, Reason.PREEMPTED.value)
            or (o.spec is not None and o.spec.cluster.queue_name)
        )
    ):
        return None
    msg = f"admitted by Kueue: PyTorchJob {current.name} unsuspended, its pods start"
    return Plan(
        "admitted",
        status={
            "reason": Reason.ADMITTED,
            "message": msg,
            "admissionTime": timestamp(o.now),
            "conditions": cond(o, conds_of(o), READY, False, Reason.ADMITTED, msg),
        },
        events=(Event(False, Reason.ADMITTED, msg),),
    )


@situation(
    Transition(("Running", "Restarting"), "Pending", Reason.CREATED),
    Transition(("Pending", "Restarting"), "Running", Reason.RUNNING),
    Transition(("Pending", "Running"), "Restarting", Reason.RESTARTING),
    Transition(ANY_ACTIVE, "Succeeded", Reason.SUCCEEDED),
)
def follow(o: Observed, cfg) -> Plan | None:
    """Copy the PyTorchJob's (non-failed) state into the job's phase."""
    current = _current(o)
    if current is None or current.state is None or PHASE_OF[current.state] == o.status.phase:
        return None
    if current.suspended:  # Kueue holds it (queued, preempted): its conditions may still say Running
        return None
    phase = PHASE_OF[current.state]
    message = f"PyTorchJob {current.name} is {current.state}"
    update: dict = {
        "phase": phase,
        "reason": current.state,
        "message": message,
        "conditions": cond(o, conds_of(o), READY, phase in (Phase.RUNNING, Phase.SUCCEEDED), current.state, message),
    }
    if phase == Phase.RUNNING:
        update["startTime"] = o.status.start_time or timestamp(o.now)
        update["attemptStartTime"] = timestamp(o.now)
    if phase == Phase.SUCCEEDED:
        update["completionTime"] = timestamp(o.now)
    return Plan("follow", status=update, events=(Event(False, Reason(phase.value), message),))


@situation(
    Transition(("Pending", "Restarting"), "Restarting", Reason.STARTUP_TIMEOUT),
    Transition(("Pending", "Restarting"), "Failed", Reason.RESTART_BUDGET_EXHAUSTED),
)
def startup_timeout(o: Observed, cfg) -> Plan | None:
    """The attempt's pods did not all start within spec.resilience.startupTimeoutMinutes of its
    creation (or of Kueue's admission, when later): the next attempt (restart spent), its message in
    the pods' own words."""
    current = _current(o)
    if o.status.phase not in (Phase.PENDING, Phase.RESTARTING) or current is None or current.suspended:
        return None  # suspended: queued in Kueue, no deadline runs
    # from creation, or from Kueue's admission when it came later
    since = max(
        (t for t in (parse_time(o.status.attempt_creation_time), parse_time(o.status.admission_time)) if t is not None),
        default=None,
    )
    timeout = dt.timedelta(minutes=resilience_of(o).startup_timeout_minutes)
    if since is None or o.now - since <= timeout:
        return None
    problem = startup_problem(list(o.pods))
    why = problem[1] if problem else "no worker pod started"
    msg = f"the pods did not start within startupTimeoutMinutes {timeout.total_seconds() / 60:.0f}: {why}"
    return restart_stuck(o, "startup_timeout", Reason.STARTUP_TIMEOUT, msg, floor=cfg.min_restart_backoff)


@situation(
    Transition(("Pending", "Restarting"), "=", Reason.UNSCHEDULABLE),
    Transition(("Pending", "Restarting"), "=", Reason.IMAGE_PULL_BACK_OFF),
)
def pods_stuck(o: Observed, cfg) -> Plan | None:
    """Pending: why the pods do not start, in their own words (status.message, a Warning event)."""
    if o.status.phase not in (Phase.PENDING, Phase.RESTARTING) or _current(o) is None:
        return None
    problem = startup_problem(list(o.pods))
    if problem is None or (o.status.reason, o.status.message) == problem:
        return None
    reason, message = problem
    return Plan(
        "pods_stuck",
        status={
            "reason": reason,
            "message": message,
            "conditions": cond(o, conds_of(o), READY, False, reason, message),
        },
        events=(Event(True, Reason(reason), message),),
    )


def _verdict(o: Observed) -> health.Verdict | None:
    if o.status.phase != Phase.RUNNING or _current(o) is None or o.spec is None:
        return None
    return health.evaluate(o.spec, o.raw_status, o.progress, o.now)


@situation(
    Transition(("Running",), "Restarting", Reason.HANG),
    Transition(("Running",), "Restarting", Reason.NO_FIRST_STEP),
    Transition(("Running",), "Restarting", Reason.NON_FINITE_LOSS),
    Transition(("Running",), "Restarting", Reason.LOSS_SPIKE),
    Transition(("Running",), "Failed", Reason.RESTART_BUDGET_EXHAUSTED),
)
def unhealthy(o: Observed, cfg) -> Plan | None:
    """A health rule (controller/health.py) calls for a restart of the Running attempt."""
    verdict = _verdict(o)
    if verdict is None or verdict.restart is None:
        return None
    r = verdict.restart
    return restart_stuck(
        o,
        "unhealthy",
        r.reason,
        r.message,
        then=lambda update: r.amend(o.generation, update, o.now),
        floor=cfg.min_restart_backoff,
    )


@situation(
    Transition(("Running",), "=", Reason.NO_RECENT_CHECKPOINT), Transition(("Running",), "=", Reason.ROLLED_BACK)
)
def health_conditions(o: Observed, cfg) -> Plan | None:
    """The verdict's conditions changed, or the attempt applied the rollback it was asked for."""
    verdict = _verdict(o)
    if verdict is None:
        return None
    changed = health.changed_conditions(conds_of(o), verdict)
    applied = verdict.rollback_applied is not None and o.status.resume_before_step == verdict.rollback_applied
    if not changed and not applied:
        return None
    conds = conds_of(o)
    for c in changed:
        conds = cond(o, conds, c.type, c.status, c.reason, c.message)
    events = [Event(True, c.reason, c.message) for c in changed if c.warn and c.status]
    update: dict = {"conditions": conds}
    if applied:
        update["resumeBeforeStep"] = None
        events.append(
            Event(
                False,
                Reason.ROLLED_BACK,
                (
                    f"attempt {o.attempt} resumed from the newest checkpoint before step {verdict.rollback_applied}; "
                    f"the later ones are kept under <checkpoint.uri>/quarantine/"
                ),
            )
        )
    return Plan("health_conditions", status=update, events=tuple(events))


@situation()
def steady(o: Observed, cfg) -> Plan:
    """Nothing to change. On first sight (an operator restart) say once what was adopted."""
    phase = o.status.phase
    active = phase is not None and phase.active and _current(o) is not None
    requeue = cfg.progress_interval if active else None
    if active and _awaiting_kueue_words(o):
        requeue = min(cfg.progress_interval, KUEUE_WORDS_WAIT)
    plan = Plan("steady", requeue=requeue, monitor=active and phase == Phase.RUNNING)
    if not o.first_sight:
        return plan
    exists = o.child(o.status.pytorch_job) is not None
    events = (
        (Event(False, Reason.ADOPTED, f"Adopted PyTorchJob {o.status.pytorch_job} (attempt {o.attempt})"),)
        if exists and phase is not None and phase.active
        else ()
    )
    return Plan(
        "steady",
        requeue=plan.requeue,
        monitor=plan.monitor,
        events=events,
        outcome="adopted" if exists else "unchanged",
    )


SITUATIONS: tuple[Situation, ...] = (
    terminal,
    new_invalid,
    new_suspended,
    new_job,
    spec_changed,
    awaiting_watch,
    suspended,
    suspend,
    backoff,
    missing_child,
    child_deleting,
    attempt_failed,
    preempted,
    queued,
    admitted,
    follow,
    startup_timeout,
    pods_stuck,
    unhealthy,
    health_conditions,
    steady,
)


def decide(o: Observed, cfg: OperatorConfig) -> Plan:
    for rule in SITUATIONS:
        plan = rule(o, cfg)
        if plan is not None:
            if plan.need is not None or plan.create is not None:
                return plan
            plan = accounting.amend(o, plan, cfg)
            if plan.situation == "steady":  # intervalMinutes auto: the trainer's new choice, if any
                status = cadence.amend(o, plan.status)
                if status is not plan.status:
                    plan = replace(plan, status=status)
            return plan
    raise AssertionError("steady always applies")
