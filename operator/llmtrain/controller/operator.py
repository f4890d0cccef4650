"""The `Operator`: everything the reconciler shares, built once in `__main__` (nothing at import):
config, metrics, the work queue, the watch-fed caches, the Kubernetes client calls and the
monitor. kopf is only the watch layer (watch.py puts events into these)."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time

from .adapters import kube as kube_calls
from .adapters import nodes, rejections
from .adapters.caches import AttemptCache, NodeHealth, PhaseGauge, PodCache, ProgressFacts, SpecCache
from .adapters.companions import Companions
from .adapters.metrics import OperatorMetrics
from .adapters.monitor import Monitor
from .adapters.observe import unseen_child
from .adapters.owners import PodOwners
from .adapters.pacing import CreatePacer
from .adapters.reliability import FleetReliability
from .adapters.retired import RetiredJobs
from .policy.config import OperatorConfig
from .policy.situations_start import WATCH_WAIT
from .reconciler import reconcile
from .workqueue import WorkQueue

log = logging.getLogger("llmtrain.operator")

UNSEEN_GRACE = 5.0  # seconds after the watch starts in which a recorded child is waited for


class Operator:
    def __init__(self, config: OperatorConfig, metrics: OperatorMetrics | None = None, kube=kube_calls):
        self.config = config
        self.metrics = metrics if metrics is not None else OperatorMetrics()
        self.kube = kube
        self.phases = PhaseGauge(self.metrics.jobs)
        self.attempts, self.pods, self.progress = AttemptCache(), PodCache(), ProgressFacts()
        self.node_health = NodeHealth()  # watched node conditions False, per node (sicknodes.py)
        self.specs = SpecCache(config.default_etcd_endpoint, enabled=config.backends)
        self.owners = PodOwners(kube)  # which objects' pods are an attempt's (owners.py)
        self.companions = Companions(kube)  # the objects made beside a child (companions.py)
        self.failures = nodes.PodFailures(kube)  # what the pod watch saw fail, and where pods ran
        self.rejections = rejections.Refusals()  # refused creates per job (when one is final)
        self.monitor = Monitor(self)
        self.queue = WorkQueue(
            lambda key, job: reconcile(self, key, job),  # type: ignore[arg-type]  # keys are (ns, name)
            workers=config.workers,
        )
        # creates held while a paced backend's controller is behind (pacing.py); woken through the queue
        self.pacer = CreatePacer(config.max_children_untaken, wake=self.queue.add)
        self.metrics.children_untaken.set_function(lambda: self.pacer.counts()[0])
        self.metrics.creates_held.set_function(lambda: self.pacer.counts()[1])
        # node MTBF per instance type, from the cached jobs' statuses and the deleted ones'
        # (intervalMinutes auto)
        where = config.reliability_configmap
        self.retired = RetiredJobs(where[0], where[1], kube) if where else None
        self.reliability = FleetReliability(self.queue.objects, retired=self.retired.of if self.retired else None)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._watch_started = 0.0
        self._seen: set[tuple[str, str]] = set()  # jobs this process reconciled at least once
        self._seen_lock = threading.Lock()

    def start_workers(self) -> None:
        """On the first watch event, from kopf's context: the monitor runs on this loop."""
        if not self.queue.started:
            self._watch_started = time.monotonic()
            self.loop = asyncio.get_running_loop()
            self.queue.start([contextvars.copy_context() for _ in range(self.config.workers)])

    def saw_job(self, namespace: str, name: str, job: dict) -> None:
        """A job's watch event: queue it. Right after the watch starts, a job whose recorded child
        the watch has not brought yet is kept (not run) until that child's event queues it, or
        WATCH_WAIT passes: run now, it would only find the child missing and wait
        (awaiting_watch), and after a restart that was most jobs' first run, a second reconcile per
        job. The run then replaces this timer with its own requeue (workqueue.py)."""
        key = (namespace, name)
        fresh = self.watch_is_fresh() and not self.seen(key)
        if fresh and unseen_child(job.get("status") or {}, name, self.attempts.of(namespace, name)):
            self.queue.observe(key, job)
            self.queue.add_after(key, WATCH_WAIT)
        else:
            self.queue.add(key, job)

    def watch_is_fresh(self) -> bool:
        return self.loop is not None and time.monotonic() - self._watch_started < UNSEEN_GRACE

    def seen(self, key: tuple[str, str]) -> bool:
        with self._seen_lock:
            return key in self._seen

    def mark_seen(self, key: tuple[str, str]) -> None:
        with self._seen_lock:
            self._seen.add(key)

    def retire(self, job: dict) -> None:
        """A deleted job's node faults and node-hours into the ledger (retired.py); on a thread."""
        if self.retired is None:
            return
        try:
            if self.retired.retire(job):
                instance = ((job.get("spec") or {}).get("cluster") or {}).get("instanceType")
                self.reliability.forget(instance)
        except Exception:  # logged: the ledger is evidence, the deletion goes on
            name = (job.get("metadata") or {}).get("name")
            log.exception("could not add the deleted job %s to the reliability ledger", name)

    def forget(self, namespace: str, name: str, uid: str | None) -> None:
        """The job is gone: drop what is known of it."""
        key = (namespace, name)
        self.phases.track(namespace, name, None)
        self.queue.forget(key)
        self.failures.forget(namespace, name)
        self.monitor.forget(key)
        self.progress.forget(namespace, name)
        self.specs.forget(uid)
        self.metrics.forget_job(namespace, name)  # a deleted job's own series go with it
        self.rejections.forget(namespace, name)
        self.pacer.forget(key)
        with self._seen_lock:
            self._seen.discard(key)
