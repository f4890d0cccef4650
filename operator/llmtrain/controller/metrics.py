"""The operator's own Prometheus metrics (served by prometheus-client on --metrics-port).

Names are part of the product surface: dashboards and alert rules query them, and a test checks
that every metric a dashboard or rule names is registered here or by the trainer.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..status import Phase

RECONCILE_OUTCOMES = ("created", "adopted", "updated", "unchanged", "invalid", "restarted", "suspended",
                      "resumed", "error")


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        kw: dict[str, Any] = {"registry": registry} if registry is not None else {}
        self.reconciles = Counter(
            "llmtrain_operator_reconciles", "Reconciles of LLMTrainingJobs by outcome",
            ["outcome"], **kw)
        self.reconcile_seconds = Histogram(
            "llmtrain_operator_reconcile_duration_seconds", "Time spent in one reconcile",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), **kw)
        self.jobs = Gauge(
            "llmtrain_operator_jobs", "LLMTrainingJobs this operator owns, by phase", ["phase"], **kw)
        self.restarts = Counter(
            "llmtrain_operator_job_restarts", "Attempts started after a failure or hang",
            ["namespace", "llmtrain_job", "reason"], **kw)
        # failure forensics and preflight (controller/forensics.py)
        self.preflight_busbw = Gauge(
            "llmtrain_operator_preflight_bus_bandwidth_gbps",
            "All-reduce bus bandwidth the last failed preflight health check of a job measured (GB/s)",
            ["namespace", "llmtrain_job"], **kw)
        self.bad_nodes = Counter(
            "llmtrain_operator_bad_nodes", "Nodes blamed for a failed attempt, by reason", ["reason"], **kw)
        for outcome in RECONCILE_OUTCOMES:
            self.reconciles.labels(outcome)
        for phase in Phase:
            self.jobs.labels(phase.value)

    def forget_job(self, namespace: str, name: str) -> None:
        """Drop a deleted job's own series: with one series per job (and restart reason), an
        operator that outlives many jobs would otherwise grow /metrics (and its memory) forever."""
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
