"""One reconcile of one job: observe → decide → act, until nothing is left to do.

The work queue (workqueue.py) runs one reconcile per job at a time. Each step is decided on one
snapshot (observe.py) and its status write is conditional on the snapshot's resourceVersion; on a
conflict the job is read again and decided again, so two triggers never both act on one attempt,
and across processes only the Lease holder runs at all (leader.py).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .adapters import act
from .adapters.observe import more, observe
from .policy.decide import decide

if TYPE_CHECKING:
    from .operator import Operator

MAX_STEPS = 12


class Run:
    def __init__(self, op: Operator, namespace: str, name: str, first_sight: bool):
        self.op, self.namespace, self.name, self.first_sight = op, namespace, name, first_sight
        self.created: list[tuple[str, str]] = []  # (backend, name) of the children this run created
        self.outcome: str | None = None
        self.waiting = False  # for the watch to show a recorded child
        self.held = False  # in the pacer's line, woken when its turn comes
        self.settled_on: dict | None = None  # the object on which nothing was left to do
        self.final: dict | None = None  # the job's status as last read or written

    def run(self, job: dict) -> float | None:
        op, key = self.op, (self.namespace, self.name)
        try:
            self.final = job.get("status") or {}
            o = observe(op, job, self.first_sight)
            for _ in range(MAX_STEPS):
                plan = decide(o, op.config)
                if plan.need is not None:
                    o = more(op, o, plan.need)
                    continue
                self.outcome = self.outcome or plan.outcome
                self.waiting = self.waiting or plan.waiting
                if plan.create is not None:
                    result = act.create(op, o, plan.create)
                    if result is None:  # held: the backend's controller is behind (pacing.py)
                        self.outcome, self.held = self.outcome or "held", True
                        return op.pacer.recheck_in(key)
                    if result.outcome == "created":
                        self.created.append((o.backend, result.name))
                    o = o.with_(created=result)
                    continue
                if plan.status is None:
                    act.finish(op, o, plan, job)
                    self.settled_on = job
                    return plan.requeue
                written = act.write_status(op, o, plan.status)
                if written == act.GONE:
                    self.final = None
                    return None
                if written == act.CONFLICT:  # someone wrote since our read: read again, decide again
                    job = op.kube.get_job(self.namespace, self.name)
                    if job is None:
                        self.final = None
                        return None
                    op.queue.observe(key, job)
                else:
                    assert isinstance(written, dict)  # not GONE, not CONFLICT: the written job
                    act.finish(op, o, plan, written)
                    job = written
                self.final = job.get("status") or {}
                o = observe(op, job, self.first_sight and self.outcome is None)
            return 0.0  # still moving: run again (after any other key that waits)
        finally:
            if not self.held:
                op.pacer.leave(key)
            act.drop_superseded(op, self.namespace, self.created, self.final)


def reconcile(op: Operator, key: tuple[str, str], job: dict | None) -> float | None:
    """The work queue's handler: returns when to look again (seconds), or None."""
    if job is None:
        return None
    namespace, name = key
    first = not op.seen(key)
    started = time.perf_counter()
    run = Run(op, namespace, name, first)
    try:
        requeue = run.run(job)
        if not run.waiting:
            op.mark_seen(key)
        # The watch's echo of this run's own status write (and any older event) then queues
        # nothing: one reconcile per new job instead of two.
        op.queue.settle(key, run.settled_on)
        return requeue
    except Exception:
        run.outcome = "error"
        raise
    finally:
        if run.outcome:
            op.metrics.reconciles.labels(run.outcome).inc()
            op.metrics.reconcile_seconds.observe(time.perf_counter() - started)
