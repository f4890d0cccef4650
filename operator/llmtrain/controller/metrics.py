"""The operator's own Prometheus metrics (served by prometheus-client on --metrics-port).

Names are part of the product surface: dashboards and alert rules query them, and a test checks
that every metric a dashboard or rule names is registered here or by the trainer.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..goodput import BADPUT
from ..status import Phase

RECONCILE_OUTCOMES = (
    "created",
    "adopted",
    "updated",
    "unchanged",
    "invalid",
    "restarted",
    "suspended",
    "resumed",
    "error",
)


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
        self.restarts = Counter(
            "llmtrain_operator_job_restarts",
            "Attempts started after a failure or hang",
            ["namespace", "llmtrain_job", "reason"],
            **kw,
        )
        # failure forensics and preflight (controller/forensics.py)
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
        self.goodput_ratio = Gauge(
            "llmtrain_job_goodput_ratio",
            "Productive seconds / (wall - suspended seconds) of a job since its creation",
            ["namespace", "llmtrain_job"],
            **kw,
        )
        self.badput_seconds = Gauge(
            "llmtrain_job_badput_seconds",
            "Seconds of a job's wall time that trained nothing, by kind (queued, starting, lostWork, restarting, "
            "hang, checkpointStall, dataWait)",
            ["namespace", "llmtrain_job", "kind"],
            **kw,
        )
        for outcome in RECONCILE_OUTCOMES:
            self.reconciles.labels(outcome)
        for phase in Phase:
            self.jobs.labels(phase.value)

    def set_goodput(self, namespace: str, name: str, summary: dict) -> None:
        seconds = summary.get("seconds") or {}
        if summary.get("ratio") is not None:
            self.goodput_ratio.labels(namespace, name).set(summary["ratio"])
        for kind in BADPUT:
            self.badput_seconds.labels(namespace, name, kind).set(seconds.get(kind, 0.0))

    def forget_job(self, namespace: str, name: str) -> None:
        """Drop a deleted job's own series: with one series per job (and restart reason), an
        operator that outlives many jobs would otherwise grow /metrics (and its memory) forever."""
        for metric in (self.restarts, self.preflight_busbw, self.goodput_ratio, self.badput_seconds):
            names = metric._labelnames
            for family in metric.collect():
                for sample in family.samples:
                    labels = sample.labels
                    if labels.get("namespace") == namespace and labels.get("llmtrain_job") == name:
                        try:
                            metric.remove(*(labels[n] for n in names))
                        except KeyError:
                            pass  # the _total and _created samples of one series: removed once
