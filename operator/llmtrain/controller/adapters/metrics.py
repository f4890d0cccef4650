"""The operator's own Prometheus metrics (served by prometheus-client on --metrics-port).

Names are part of the product surface: dashboards and alert rules query them, and a test checks
that every metric a dashboard or rule names is registered here or by the trainer.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ...goodput import BADPUT
from ...status import Phase

RECONCILE_OUTCOMES = (
    "created",
    "adopted",
    "updated",
    "unchanged",
    "invalid",
    "restarted",
    "suspended",
    "resumed",
    "held",
    "error",
)


class _PerJobFamilies(Collector):
    """Gauge families with one entry per job, kept in a dict and turned into series only when
    Prometheus scrapes (`collect`): forgetting a deleted job is one dict pop. Subclasses give
    FAMILIES ((name, help, labels), ...), fill `_jobs` under `_lock` and write `collect`."""

    FAMILIES: tuple[tuple[str, str, tuple[str, ...]], ...] = ()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[tuple[str, str], Any] = {}

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._jobs.pop((namespace, name), None)

    def families(self) -> list[tuple[str, str, str, list[str]]]:
        """(name, type, help, labels) of each family, for the metrics reference."""
        return [(n, "gauge", doc, list(labels)) for n, doc, labels in self.FAMILIES]

    def describe(self) -> Iterator[GaugeMetricFamily]:
        for n, doc, labels in self.FAMILIES:
            yield GaugeMetricFamily(n, doc, labels=labels)


class JobGoodput(_PerJobFamilies):
    """``llmtrain_job_goodput_ratio`` and ``llmtrain_job_badput_seconds``: one series per job (and
    badput kind), from each job's status.goodput as last reconciled, rendered at scrape time.

    A collector rather than two Gauges: a Gauge validates its label names again for every new child,
    and these are 9 per job, so the first reconcile of each job in a process (every job, after a
    restart or failover) spent 0.17 ms of CPU in prometheus_client, and removing a deleted job's
    series scanned every job's: 27 s of CPU to delete 1,000 jobs. Now 7 µs and 10 µs a job."""

    FAMILIES = (
        (
            "llmtrain_job_goodput_ratio",
            "Productive seconds / (wall - suspended seconds) of a job since its creation",
            ("namespace", "llmtrain_job"),
        ),
        (
            "llmtrain_job_badput_seconds",
            "Seconds of a job's wall time that trained nothing, by kind (queued, starting, slow, lostWork, "
            "restarting, hang, checkpointStall, dataWait)",
            ("namespace", "llmtrain_job", "kind"),
        ),
    )

    _jobs: dict[tuple[str, str], tuple[float | None, tuple[float, ...]]]

    def set(self, namespace: str, name: str, ratio: float | None, seconds: dict) -> None:
        """A ratio of None keeps the job's last one (a summary without it says nothing new)."""
        values = tuple(float(seconds.get(kind, 0.0)) for kind in BADPUT)
        with self._lock:
            if ratio is None:
                ratio = (self._jobs.get((namespace, name)) or (None,))[0]
            self._jobs[(namespace, name)] = (ratio, values)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        (rn, rdoc, rlabels), (bn, bdoc, blabels) = self.FAMILIES
        ratio, badput = GaugeMetricFamily(rn, rdoc, labels=rlabels), GaugeMetricFamily(bn, bdoc, labels=blabels)
        with self._lock:
            jobs = list(self._jobs.items())
        for (namespace, name), (r, values) in jobs:
            if r is not None:
                ratio.add_metric([namespace, name], r)
            for kind, v in zip(BADPUT, values, strict=True):
                badput.add_metric([namespace, name, kind], v)
        yield ratio
        yield badput


class JobStragglers(_PerJobFamilies):
    """Each job's recorded straggler (status.straggler, controller/policy/slownodes.py) as series, for the
    training dashboard (the straggler's node) and the LLMTrainJobStraggler alert (slow for longer
    than the job's stragglers.durationMinutes, and nothing acted: a replacement clears it). One
    series per job and family while a straggler is recorded; none otherwise."""

    FAMILIES = (
        (
            "llmtrain_job_straggler_slowdown",
            "How many times slower a job runs because of its straggler rank (status.straggler)",
            ("namespace", "llmtrain_job", "node", "rank"),
        ),
        (
            "llmtrain_job_straggler_since_timestamp_seconds",
            "Since when the straggler's node has been slowing the job's current attempt (Unix seconds)",
            ("namespace", "llmtrain_job", "node", "rank"),
        ),
        (
            "llmtrain_job_straggler_act_after_seconds",
            "The job's spec.resilience.stragglers.durationMinutes, in seconds, while a straggler is recorded",
            ("namespace", "llmtrain_job"),
        ),
    )

    _jobs: dict[tuple[str, str], tuple[str, str, float, float, float]]

    def set(self, namespace: str, name: str, straggler: dict | None, act_after: float) -> None:
        """From the job's status.straggler (None or incomplete: no straggler, its series go)."""
        from ..policy.child_status import parse_time

        since = parse_time((straggler or {}).get("since")) if straggler else None
        slowdown = (straggler or {}).get("slowdown")
        with self._lock:
            if since is None or not isinstance(slowdown, (int, float)) or not straggler:
                self._jobs.pop((namespace, name), None)
                return
            self._jobs[(namespace, name)] = (
                str(straggler.get("node") or ""),
                str(straggler.get("rank") if straggler.get("rank") is not None else ""),
                float(slowdown),
                since.timestamp(),
                act_after,
            )

    def collect(self) -> Iterator[GaugeMetricFamily]:
        slow, since, act = (GaugeMetricFamily(n, doc, labels=labels) for n, doc, labels in self.FAMILIES)
        with self._lock:
            jobs = list(self._jobs.items())
        for (namespace, name), (node, rank, slowdown, at, act_after) in jobs:
            slow.add_metric([namespace, name, node, rank], slowdown)
            since.add_metric([namespace, name, node, rank], at)
            act.add_metric([namespace, name], act_after)
        yield slow
        yield since
        yield act


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        kw: dict[str, Any] = {"registry": registry} if registry is not None else {}
        self.reconciles = Counter(
            "llmtrain_operator_reconciles", "Reconciles of LLMTrainingJobs by outcome", ["outcome"], **kw
        )
        self.reconcile_seconds = Histogram(
            "llmtrain_operator_reconcile_duration_seconds",
            "Time spent in one reconcile",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            **kw,
        )
        self.jobs = Gauge("llmtrain_operator_jobs", "LLMTrainingJobs this operator owns, by phase", ["phase"], **kw)
        # creates paced by the child's controller (controller/adapters/pacing.py); set_function by the Operator
        self.children_untaken = Gauge(
            "llmtrain_operator_children_untaken",
            "Children this operator created that their controller has not taken up yet (paced backends)",
            **kw,
        )
        self.creates_held = Gauge(
            "llmtrain_operator_creates_held",
            "Jobs whose child create waits for their backend's controller to take up earlier ones",
            **kw,
        )
        self.restarts = Counter(
            "llmtrain_operator_job_restarts",
            "Attempts started after a failure or hang",
            ["namespace", "llmtrain_job", "reason"],
            **kw,
        )
        # failure forensics and preflight (controller/policy/forensics.py)
        self.preflight_busbw = Gauge(
            "llmtrain_operator_preflight_bus_bandwidth_gbps",
            "All-reduce bus bandwidth the last failed preflight health check of a job measured (GB/s)",
            ["namespace", "llmtrain_job"],
            **kw,
        )
        self.bad_nodes = Counter(
            "llmtrain_operator_bad_nodes", "Nodes blamed for a failed attempt, by reason", ["reason"], **kw
        )
        # goodput (llmtrain/goodput.py), from each job's status.goodput whenever it is reconciled
        self.goodput = JobGoodput()
        (registry if registry is not None else REGISTRY).register(self.goodput)
        # the straggler each job's status records (controller/policy/slownodes.py)
        self.stragglers = JobStragglers()
        (registry if registry is not None else REGISTRY).register(self.stragglers)
        for outcome in RECONCILE_OUTCOMES:
            self.reconciles.labels(outcome)
        for phase in Phase:
            self.jobs.labels(phase.value)

    def set_goodput(self, namespace: str, name: str, summary: dict) -> None:
        self.goodput.set(namespace, name, summary.get("ratio"), summary.get("seconds") or {})

    def forget_job(self, namespace: str, name: str) -> None:
        """Drop a deleted job's own series: with one series per job (and restart reason), an
        operator that outlives many jobs would otherwise grow /metrics (and its memory) forever."""
        self.goodput.forget(namespace, name)
        self.stragglers.forget(namespace, name)
        for metric in (self.restarts, self.preflight_busbw):
            names = metric._labelnames
            for family in metric.collect():
                for sample in family.samples:
                    labels = sample.labels
                    if labels.get("namespace") == namespace and labels.get("llmtrain_job") == name:
                        try:
                            metric.remove(*(labels[n] for n in names))
                        except KeyError:
                            pass  # the _total and _created samples of one series: removed once
