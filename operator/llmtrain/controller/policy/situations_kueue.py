"""The decide table's Kueue situations: the attempt's child (PyTorchJob, JobSet) is suspended until
Kueue admits it (controller/adapters/kueue.py). Queued (with Kueue's own words), admitted (the start-up
deadline counts from then), preempted (back to Pending, no restart spent).

A queued child for which Kueue makes no Workload is one Kueue does not manage: its kind is not in
Kueue's `integrations.frameworks` (Kueue v0.19 and later leave PyTorchJob out of their defaults;
each backend says, `Backend.kueue_note`). Nothing would ever admit it, so once
`--kueue-workload-wait-seconds` (config.kueue_workload_wait) have passed since the attempt's
creation the job says so (reason NoKueueWorkload, a Warning event naming the framework to add),
and keeps waiting: the child is Kueue's to admit as soon as Kueue manages its kind."""

from __future__ import annotations

from ...backends import BACKENDS
from ...status import Phase, Reason
from .child_status import parse_time
from .progress import timestamp
from .situation import Transition, current_child, kind, situation
from .snapshot import Event, Observed, Plan
from .writes import READY, cond, conds_of

# Kueue says why a Workload waits (QuotaReserved=False) a moment after the child is created,
# and no watch tells the operator when: look again this often for KUEUE_WORDS_WINDOW seconds after
# the attempt's creation, then at the progress interval (one Workload LIST per look).
KUEUE_WORDS_WAIT, KUEUE_WORDS_WINDOW = 2.0, 60.0


def _waited(o: Observed) -> float | None:
    """Seconds since the current attempt's child was created (None: not recorded)."""
    created = parse_time(o.status.attempt_creation_time)
    return (o.now - created).total_seconds() if created is not None else None


def _queue_words(o: Observed, cfg, child: str) -> tuple[Reason, str]:
    """(Queued or NoKueueWorkload, why the attempt's child `child` waits)."""
    w = o.workload
    queue = o.spec.cluster.queue_name if o.spec is not None else None
    where = f"LocalQueue {queue}" if queue else "its queue"
    what = kind(o)
    if w is None:
        priority = o.spec.cluster.workload_priority_class if o.spec is not None else None
        waited = _waited(o)
        if waited is not None and waited >= cfg.kueue_workload_wait:
            backend = BACKENDS.get(o.backend)
            framework = backend.kueue_framework if backend is not None else "its kind"
            note = f" ({backend.kueue_note})" if backend is not None and backend.kueue_note else ""
            also = (
                f"; or spec.cluster.workloadPriorityClass {priority!r} names no WorkloadPriorityClass (Kueue "
                "makes no Workload until it does)"
                if priority
                else ""
            )
            return Reason.NO_KUEUE_WORKLOAD, (
                f"Kueue made no Workload for {what} {child} ({where}) within "
                f"{cfg.kueue_workload_wait:.0f} s, so nothing will admit it: Kueue does not manage {what}s here. "
                f"Add {framework} to Kueue's Configuration integrations.frameworks{note}, or run the job "
                f"without spec.cluster.queueName"
                f"{also}; it waits suspended until Kueue admits it"
            )
        hint = (
            (
                f"; if it stays so, check that spec.cluster.workloadPriorityClass {priority!r} names a "
                "WorkloadPriorityClass: Kueue makes no Workload until it does"
            )
            if priority
            else ""
        )
        return Reason.QUEUED, f"waiting for Kueue to admit the {what} ({where}; no Kueue Workload for it yet{hint})"
    words = f"waiting in {where} for Kueue to admit Workload {w.name}: {w.message or 'not admitted yet'}"
    if queue and f"LocalQueue {queue} doesn't exist" in w.message:
        words += " (spec.cluster.queueName names no LocalQueue in this namespace)"
    return Reason.QUEUED, words


def kueue_look_again(o: Observed, cfg) -> float | None:
    """When to look at a queued attempt's Workload again, if sooner than the progress interval: a
    new attempt's child waits suspended and Kueue has not said why yet (no Workload, or one
    without a message), within KUEUE_WORDS_WINDOW of the attempt's creation; or it has no
    Workload and the wait for one ends later (then: its end)."""
    current = current_child(o)
    if current is None or not current.suspended or not o.workload_read:
        return None
    if o.workload is not None and o.workload.message:
        return None
    waited = _waited(o)
    if waited is None:
        return None
    if waited < KUEUE_WORDS_WINDOW:
        return KUEUE_WORDS_WAIT
    if o.workload is None and waited < cfg.kueue_workload_wait:
        return cfg.kueue_workload_wait - waited + 0.05
    return None


@situation(Transition(("Running",), "Pending", Reason.PREEMPTED))
def preempted(o: Observed, cfg) -> Plan | None:
    """Kueue suspended the running attempt's child again (preempted by a higher priority, or
    evicted): its pods get their grace period and the trainer saves on SIGTERM. Pending, no restart
    spent: the same child (the same Workload, in its place in the queue) runs again once
    re-admitted, from the newest checkpoint."""
    current = current_child(o)
    if o.status.phase != Phase.RUNNING or current is None or not current.suspended:
        return None
    if not o.workload_read:
        return Plan("preempted", need="workload")
    w = o.workload
    why = f"{w.evicted}: {w.evicted_message}" if w is not None and w.evicted else f"its {kind(o)} was suspended"
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


@situation(
    Transition(("Pending", "Restarting"), "Pending", Reason.QUEUED),
    Transition(("Pending", "Restarting"), "Pending", Reason.NO_KUEUE_WORKLOAD),
)
def queued(o: Observed, cfg) -> Plan | None:
    """The attempt's child waits suspended for Kueue: Pending, reason Queued (Preempted stays,
    until re-admission, for one that was taken back), Kueue's own words in status.message and an
    event when they change; NoKueueWorkload (a Warning) once Kueue has made no Workload for it in
    config.kueue_workload_wait. No start-up deadline runs while queued."""
    current = current_child(o)
    if o.status.phase not in (Phase.PENDING, Phase.RESTARTING) or current is None or not current.suspended:
        return None
    if not o.workload_read:
        return Plan("queued", need="workload")
    said, words = _queue_words(o, cfg, current.name)
    reason = Reason.PREEMPTED if o.status.reason == Reason.PREEMPTED.value else said
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
            "conditions": cond(o, conds_of(o), READY, False, said, msg),
        },
        events=(Event(said == Reason.NO_KUEUE_WORKLOAD, said, msg),),
    )


@situation(Transition(("Pending", "Restarting"), "=", Reason.ADMITTED))
def admitted(o: Observed, cfg) -> Plan | None:
    """Kueue admitted the attempt (unsuspended its child): record when, since the start-up deadline
    counts from admission, not from creation."""
    current = current_child(o)
    if (
        o.status.phase not in (Phase.PENDING, Phase.RESTARTING)
        or current is None
        or current.suspended
        or o.status.admission_time is not None
        or not (
            o.status.reason in (Reason.QUEUED.value, Reason.PREEMPTED.value, Reason.NO_KUEUE_WORKLOAD.value)
            or (o.spec is not None and o.spec.cluster.queue_name)
        )
    ):
        return None
    msg = f"admitted by Kueue: {kind(o)} {current.name} unsuspended, its pods start"
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
