"""The decide table's last situations, once the attempt's child exists and runs: its state is
followed into the job's phase, pods that do not start are explained or time out, the health rules
(health.py) restart an unhealthy attempt or change its conditions, and `steady` (always applies)
changes nothing but says when to look again."""

from __future__ import annotations

import datetime as dt

from ...status import Phase, Reason
from . import checkpoint_status, health
from .child_status import IMAGE_WAITING, PHASE_OF, parse_time, startup_problem
from .progress import timestamp
from .situation import ANY_ACTIVE, Transition, current_child, kind, situation
from .situations_kueue import kueue_look_again
from .snapshot import Event, Observed, Plan
from .writes import READY, cond, conds_of, fail, resilience_of, restart_stuck


@situation(
    Transition(("Restarting",), "Pending", Reason.CREATED),
    Transition(("Pending", "Restarting"), "Running", Reason.RUNNING),
    Transition(("Pending", "Running"), "Restarting", Reason.RESTARTING),
    Transition(ANY_ACTIVE, "Succeeded", Reason.SUCCEEDED),
)
def follow(o: Observed, cfg) -> Plan | None:
    """Copy the child's (non-failed) state into the job's phase. Running does not go back to
    Pending: a child whose pods turn unready for a moment (a node's kubelet late with its
    heartbeat: a JobSet counts ready pods) still trains; what ends an attempt is its failure,
    Kueue's suspension (preempted) or the health rules."""
    current = current_child(o)
    if current is None or current.state is None or PHASE_OF[current.state] == o.status.phase:
        return None
    if current.suspended:  # Kueue holds it (queued, preempted): its conditions may still say Running
        return None
    phase = PHASE_OF[current.state]
    if o.status.phase == Phase.RUNNING and phase == Phase.PENDING:
        return None
    message = f"{kind(o)} {current.name} is {current.state}"
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
    *(Transition(("Pending", "Restarting"), "Failed", Reason(r)) for r in sorted(IMAGE_WAITING)),
)
def startup_timeout(o: Observed, cfg) -> Plan | None:
    """The attempt's pods did not all start within spec.resilience.startupTimeoutMinutes of its
    creation (or of Kueue's admission, when later): the next attempt (restart spent), its message in
    the pods' own words. Unless they wait for their image: a new attempt would wait for the same
    one, so the job fails in the kubelet's words, with no restart spent, and its child is deleted
    (its nodes or quota freed)."""
    current = current_child(o)
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
    if problem and problem[0] in IMAGE_WAITING:
        msg += (
            "; a new attempt would wait for the same image, so none is started: fix spec.cluster.image (or make "
            "it pullable from the nodes), then delete and re-apply the job"
        )
        return fail(o, "startup_timeout", Reason(problem[0]), msg, outcome=None, delete=(current.name,))
    return restart_stuck(o, "startup_timeout", Reason.STARTUP_TIMEOUT, msg, floor=cfg.min_restart_backoff)


@situation(
    Transition(("Pending", "Restarting"), "=", Reason.UNSCHEDULABLE),
    Transition(("Pending", "Restarting"), "=", Reason.IMAGE_PULL_BACK_OFF),
)
def pods_stuck(o: Observed, cfg) -> Plan | None:
    """Pending: why the pods do not start, in their own words (status.message, a Warning event)."""
    if o.status.phase not in (Phase.PENDING, Phase.RESTARTING) or current_child(o) is None:
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
    if o.status.phase != Phase.RUNNING or current_child(o) is None or o.spec is None:
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
    """A health rule (controller/policy/health.py) calls for a restart of the Running attempt."""
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
    """Nothing to change but the figures that follow the trainer: with intervalMinutes auto, its
    latest checkpoint interval (checkpoint_status.refreshed), and status.goodput's every goodput_interval
    (`periodic`: accounting.py). On first sight (an operator restart) say once what was adopted."""
    phase = o.status.phase
    active = phase is not None and phase.active and current_child(o) is not None
    requeue = cfg.progress_interval if active else None
    sooner = kueue_look_again(o, cfg) if active else None
    if sooner is not None:
        requeue = min(cfg.progress_interval, sooner)
    checkpoint = checkpoint_status.refreshed(o)
    status = {"checkpoint": checkpoint} if checkpoint is not None else None
    plan = Plan("steady", status=status, requeue=requeue, monitor=active and phase == Phase.RUNNING, periodic=True)
    if not o.first_sight:
        return plan
    exists = o.child(o.status.current_child) is not None
    events = (
        (Event(False, Reason.ADOPTED, f"Adopted {kind(o)} {o.status.current_child} (attempt {o.attempt})"),)
        if exists and phase is not None and phase.active
        else ()
    )
    return Plan(
        "steady",
        status=plan.status,
        requeue=plan.requeue,
        monitor=plan.monitor,
        events=events,
        outcome="adopted" if exists else "unchanged",
        periodic=True,
    )
