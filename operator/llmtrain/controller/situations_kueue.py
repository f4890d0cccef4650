"""The decide table's Kueue situations: the attempt's PyTorchJob is suspended until Kueue admits it
(controller/kueue.py). Queued (with Kueue's own words), admitted (the start-up deadline counts from
then), preempted (back to Pending, no restart spent)."""

from __future__ import annotations

from ..status import Phase, Reason
from .situation import Transition, current_child, situation
from .snapshot import Event, Observed, Plan
from .status import parse_time, timestamp
from .transitions import READY, cond, conds_of

# Kueue says why a Workload waits (QuotaReserved=False) a moment after the PyTorchJob is created,
# and no watch tells the operator when: look again this often for KUEUE_WORDS_WINDOW seconds after
# the attempt's creation, then at the progress interval (one Workload LIST per look).
KUEUE_WORDS_WAIT, KUEUE_WORDS_WINDOW = 2.0, 60.0


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


def awaiting_kueue_words(o: Observed) -> bool:
    """A new attempt's PyTorchJob waits suspended and Kueue has not said why yet (no Workload, or
    one without a message), within KUEUE_WORDS_WINDOW of the attempt's creation."""
    current = current_child(o)
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
    current = current_child(o)
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
    current = current_child(o)
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
    current = current_child(o)
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
