"""The trainer's Prometheus metrics: the names the operator, dashboards and alerts rely on.

Every series carries the labels `llmtrain_job` (the job name; Prometheus adds `namespace` at scrape)
and `rank`. Every rank serves its own registry on port LLMTRAIN_METRICS_PORT + LOCAL_RANK; the
operator scrapes rank 0 for status.progress.

`llmtrain_trainer_heartbeat_timestamp_seconds` moves only when an optimizer step completes, so
`time() - heartbeat > hang_timeout_seconds` is the hang alert, independent of whether the process
is still alive and serving /metrics.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

log = logging.getLogger(__name__)

LABELS = ("llmtrain_job", "rank")

STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
WAIT_BUCKETS = (0.0001, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30)
CKPT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 3600)


class TrainerMetrics:
    """All trainer metrics, already bound to (job, rank).

    `registry=None` creates a private `CollectorRegistry` (available as `.registry`), so several
    instances can coexist in one process (tests); pass `prometheus_client.REGISTRY` to use the global one.
    """

    def __init__(self, registry: CollectorRegistry | None = None, *, job: str, rank: int):
        self.registry = registry if registry is not None else CollectorRegistry()
        self._job = job
        self._values = (job, str(rank))
        self._labels = dict(zip(LABELS, self._values, strict=True))
        self._throughput_series()
        self._checkpoint_series()
        self._loss_series()
        self._attempt_series()
        self._straggler_series()

    def _gauge(self, name: str, doc: str):
        return Gauge(name, doc, LABELS, registry=self.registry).labels(*self._values)

    def _counter(self, name: str, doc: str):
        return Counter(name, doc, LABELS, registry=self.registry).labels(*self._values)

    def _hist(self, name: str, doc: str, buckets: tuple[float, ...]):
        return Histogram(name, doc, LABELS, buckets=buckets, registry=self.registry).labels(*self._values)

    def _throughput_series(self) -> None:
        """Progress and speed: the step, loss, tokens/s, MFU, step and data-wait times, memory."""
        gauge, hist = self._gauge, self._hist
        self.step = gauge("llmtrain_trainer_step", "Last completed optimizer step")
        self.loss = gauge("llmtrain_trainer_loss", "Training loss of the last step (mean over the global batch)")
        self.tokens_per_second = gauge(
            "llmtrain_trainer_tokens_per_second", "Training throughput of the whole job, tokens per second"
        )
        self.tokens_per_second_per_device = gauge(
            "llmtrain_trainer_tokens_per_second_per_device",
            "Training throughput per device (the job's tokens per second / devices), as torchtitan reports it",
        )
        self.tokens_total = self._counter(
            "llmtrain_trainer_tokens_total", "Tokens trained on by this rank (sum over ranks = the job's tokens)"
        )
        self.tflops_per_device = gauge(
            "llmtrain_trainer_tflops_per_device", "Achieved model TFLOP/s per device (6N + 12LHQT FLOPs per token)"
        )
        self.mfu = gauge("llmtrain_trainer_mfu", "Model FLOPs utilisation, 0..1, against the catalog peak")
        self.step_seconds = hist("llmtrain_trainer_step_seconds", "Wall time of one optimizer step", STEP_BUCKETS)
        self.data_wait_seconds = hist(
            "llmtrain_trainer_data_wait_seconds", "Time a step waited for its input batch", WAIT_BUCKETS
        )
        self.memory_allocated_bytes = gauge(
            "llmtrain_trainer_memory_allocated_bytes", "Device memory allocated by tensors (process RSS on CPU)"
        )
        self.memory_reserved_bytes = gauge(
            "llmtrain_trainer_memory_reserved_bytes",
            "Device memory reserved by the caching allocator (process RSS on CPU)",
        )

    def _checkpoint_series(self) -> None:
        """Checkpoints and snapshots, the resume, the auto interval's inputs, the heartbeat."""
        gauge, counter = self._gauge, self._counter
        self.last_checkpoint_step = gauge(
            "llmtrain_trainer_last_checkpoint_step", "Step of the newest complete checkpoint"
        )
        self.last_checkpoint_timestamp_seconds = gauge(
            "llmtrain_trainer_last_checkpoint_timestamp_seconds", "Unix time the newest checkpoint became complete"
        )
        self.checkpoint_duration_seconds = self._hist(
            "llmtrain_trainer_checkpoint_duration_seconds",
            "Time from starting a checkpoint to it being complete",
            CKPT_BUCKETS,
        )
        self.checkpoint_failures_total = counter(
            "llmtrain_trainer_checkpoint_failures",
            "Checkpoint saves that failed (training went on; the next save retries)",
        )
        # goodput (the operator's status.goodput): where this attempt's time went
        self.checkpoint_blocking_seconds = counter(
            "llmtrain_trainer_checkpoint_blocking_seconds",
            "Seconds the checkpoint saves between steps blocked training (the staging; the upload runs behind)",
        )
        # spec.checkpoint.memory (checkpoint/snapshots.py)
        self.snapshot_blocking_seconds = counter(
            "llmtrain_trainer_snapshot_blocking_seconds",
            "Seconds the in-memory snapshots blocked training (the copy into /dev/shm; the checksum and the "
            "partner copy run behind)",
        )
        self.last_snapshot_step = gauge(
            "llmtrain_trainer_last_snapshot_step", "Step of this rank's newest in-memory snapshot (0: none yet)"
        )
        self.resume_tier = gauge(
            "llmtrain_trainer_resume_tier",
            "Where this process resumed from: 0 nothing (fresh or pretrained), 1 the durable checkpoint, "
            "2 every rank's own in-memory snapshot, 3 in-memory snapshots with partner copies "
            "(llmtrain.pod_contract.RESUME_TIERS)",
        )
        self.train_start_timestamp_seconds = gauge(
            "llmtrain_trainer_train_start_timestamp_seconds",
            "Unix time this attempt's training loop began (model built, checkpoint loaded)",
        )
        self.resume_step = gauge("llmtrain_trainer_resume_step", "The step this attempt resumed from (0: from scratch)")
        self.checkpoint_interval_seconds = gauge(
            "llmtrain_trainer_checkpoint_interval_seconds",
            "Checkpoint interval in effect (spec.checkpoint.intervalMinutes, or the auto interval chosen last)",
        )
        # intervalMinutes auto (llmtrain.cadence): what the interval is computed from, for status.checkpoint
        self.checkpoint_blocking_estimate_seconds = gauge(
            "llmtrain_trainer_checkpoint_blocking_estimate_seconds",
            "Blocking cost per save the auto checkpoint interval is computed from (0: intervalMinutes is a number)",
        )
        self.checkpoint_blocking_measured_saves = gauge(
            "llmtrain_trainer_checkpoint_blocking_measured_saves",
            "Saves that blocking cost is measured over (0: still the estimate the process started with)",
        )
        self.checkpoint_mtbf_seconds = gauge(
            "llmtrain_trainer_checkpoint_mtbf_seconds",
            "The job MTBF the auto checkpoint interval is computed from (0: intervalMinutes is a number)",
        )
        self.hang_timeout_seconds = gauge(
            "llmtrain_trainer_hang_timeout_seconds", "Configured hang timeout (spec.resilience.hangTimeoutMinutes)"
        )
        self.heartbeat_timestamp_seconds = gauge(
            "llmtrain_trainer_heartbeat_timestamp_seconds", "Unix time the last optimizer step completed"
        )

    def _loss_series(self) -> None:
        """Per-step loss facts (losswatch.py) for the operator's NaN / loss-spike rules and the alerts."""
        gauge = self._gauge
        self.nonfinite_loss_steps = gauge(
            "llmtrain_trainer_nonfinite_loss_steps", "Consecutive steps, up to the last one, whose loss was NaN or Inf"
        )
        self.nonfinite_loss_max_steps = gauge(
            "llmtrain_trainer_nonfinite_loss_max_steps", "Longest run of consecutive NaN/Inf losses in this attempt"
        )
        self.nonfinite_loss_first_step = gauge(
            "llmtrain_trainer_nonfinite_loss_first_step", "First step of that longest run (0: none)"
        )
        self.loss_median = gauge(
            "llmtrain_trainer_loss_median", "Median loss of the previous resilience.lossSpikeWindow finite steps"
        )
        self.loss_ratio_to_median = gauge(
            "llmtrain_trainer_loss_ratio_to_median", "The last step's loss / llmtrain_trainer_loss_median"
        )
        self.loss_spike_step = gauge(
            "llmtrain_trainer_loss_spike_step",
            "First step of this attempt whose loss exceeded the spike factor × the median (0: none)",
        )
        self.loss_spike_ratio = gauge(
            "llmtrain_trainer_loss_spike_ratio", "Loss / median at llmtrain_trainer_loss_spike_step"
        )
        self.resumed_before_step = gauge(
            "llmtrain_trainer_resumed_before_step",
            "The rollback this attempt applied: it resumed from the newest checkpoint "
            "before this step (LLMTRAIN_RESUME_BEFORE_STEP; 0: none)",
        )

    def _attempt_series(self) -> None:
        """The attempt's goodput counters over its in-place restarts (metrics/restarts.py): the
        per-process series start at zero in every worker process torchrun starts."""
        gauge = self._gauge
        self.attempt_steps = gauge(
            "llmtrain_trainer_attempt_steps", "Optimizer steps this attempt completed, over its in-place restarts"
        )
        self.attempt_step_seconds = gauge(
            "llmtrain_trainer_attempt_step_seconds", "Their summed wall time, over the attempt's in-place restarts"
        )
        self.attempt_checkpoint_blocking_seconds = gauge(
            "llmtrain_trainer_attempt_checkpoint_blocking_seconds",
            "Seconds this attempt's checkpoint saves blocked training, over its in-place restarts",
        )
        self.attempt_data_wait_seconds = gauge(
            "llmtrain_trainer_attempt_data_wait_seconds",
            "Seconds this attempt's steps waited for their batch, over its in-place restarts",
        )
        self.inplace_restarts = gauge(
            "llmtrain_trainer_inplace_restarts",
            "Times torchrun restarted this rank's worker process in place in this attempt "
            "(spec.resilience.inPlaceRestarts)",
        )
        self.inplace_restart_seconds = gauge(
            "llmtrain_trainer_inplace_restart_seconds",
            "Seconds from the last step before each in-place restart to the next process's training loop, summed",
        )
        self.inplace_redone_steps = gauge(
            "llmtrain_trainer_inplace_redone_steps",
            "Steps redone after in-place restarts (an earlier process of the attempt had completed them)",
        )
        self.inplace_redone_seconds = gauge(
            "llmtrain_trainer_inplace_redone_seconds", "Their measured wall time, less their data wait"
        )

    def _straggler_series(self) -> None:
        """Stragglers (llmtrain/stragglers.py): rank 0 exports the highest scores of each window, one
        series per scored rank with its node; on these `rank` is the scored rank."""
        from llmtrain import stragglers

        r = self.registry
        self.straggler_score = Gauge(
            stragglers.SCORE,
            "A rank's compute time over the median of the other ranks' in the last window (the highest "
            f"{stragglers.TOP_RANKS}; exported by rank 0)",
            ("llmtrain_job", "rank", "node"),
            registry=r,
        )
        self.straggler_slowdown = Gauge(
            stragglers.SLOWDOWN,
            "How many times slower the job ran in the last window because of that rank (1: not at all)",
            ("llmtrain_job", "rank", "node"),
            registry=r,
        )

    def export_stragglers(self, ranked) -> None:
        """The window's highest scores (stragglers.top): the previous window's series are replaced,
        so a rank that left the top goes."""
        self.straggler_score.clear()
        self.straggler_slowdown.clear()
        for s in ranked:
            self.straggler_score.labels(self._job, str(s.rank), s.node).set(s.score)
            self.straggler_slowdown.labels(self._job, str(s.rank), s.node).set(s.slowdown)

    def export_ledger(self, ledger, restart_count: int = 0) -> None:
        """The attempt-wide gauges from this worker's ledger (metrics/restarts.py); `restart_count`:
        torchrun's TORCHELASTIC_RESTART_COUNT, a lower bound when no ledger could be kept."""
        s = ledger.state
        self.attempt_steps.set(s.steps)
        self.attempt_step_seconds.set(s.step_seconds)
        self.attempt_checkpoint_blocking_seconds.set(s.checkpoint_blocking_seconds + s.snapshot_blocking_seconds)
        self.attempt_data_wait_seconds.set(s.data_wait_seconds)
        self.inplace_restarts.set(max(s.in_place_restarts, restart_count))
        self.inplace_restart_seconds.set(s.restart_seconds)
        self.inplace_redone_steps.set(s.redone_steps)
        self.inplace_redone_seconds.set(s.redone_seconds)

    def final_summary(self, tokens_per_second: float | None = None, mfu: float | None = None) -> str:
        """The final summary (llmtrain/final_summary.py): this rank's series as a scrape would read
        them now, with tokens/s and MFU replaced by the steady means when given
        (metrics/throughput.SteadyThroughput). llmtrain_trainer.launch makes it the termination
        message of a pod that exits 0."""
        from llmtrain.final_summary import SERIES, format_summary

        values = {name: self.registry.get_sample_value(name, self._labels) for name in SERIES}
        if tokens_per_second is not None:
            values["llmtrain_trainer_tokens_per_second"] = tokens_per_second
        if mfu is not None:
            values["llmtrain_trainer_mfu"] = mfu
        return format_summary(values)

    def serve(self, port: int, addr: str = "0.0.0.0") -> bool:
        """Start the /metrics HTTP server; a busy port is logged, never fatal to training."""
        try:
            start_http_server(port, addr=addr, registry=self.registry)
            return True
        except OSError as e:
            log.warning("metrics server not started on port %d: %s", port, e)
            return False
