"""`spec.checkpoint.intervalMinutes: auto`: the checkpoint interval that loses the least time.

Young (1974) and Daly (2006): with a save that blocks training for C seconds and failures every M
seconds on average (the job's MTBF), saving every τ seconds costs C/τ of the time in saves and, per
failure, about τ/2 of redone work; the sum is smallest at

    τ = √(2 · C · M)

(Daly's higher-order terms matter only when C is not small against M: here C is seconds, M hours).
Both inputs are measured where they can be:

  * C, the blocking part of a save, by the trainer on its own saves (the time its loop waits in
    `Checkpointer.save`: the device→host staging copy, and any wait for the previous save);
    smoothed over the saves (`AutoInterval`). Before the attempt's first save: the blocking cost
    the job's previous attempt measured (status.checkpoint.blockingSeconds), or the planner's
    estimate (`llmtrain.planner.checkpoint_blocking_estimate`).
  * M, by the operator, from the failures it has seen on the instance type (`node_mtbf`): one
    node's MTBF over the job's nodes, `M = node MTBF / nodes` (a job stops when any of its nodes
    fails).

The prior. Llama 3 (Dubey et al. 2024, "The Llama 3 Herd of Models", §3.3.4) reports 419
unexpected interruptions in a 54-day snapshot of pre-training on 16,384 H100 GPUs (78% of them
hardware: GPUs, HBM3, network, host maintenance; the rest software, which the prior keeps, so it
errs towards checkpointing more often). Per GPU that is one interruption every

    54 days × 24 h × 16,384 GPUs / 419 = 50,678 GPU-hours,

so per node, `50,678 h / GPUs per node` (the catalog's; 8 for p5: 6,335 h, about 264 days; a CPU
node counts as one GPU), and for the 16 p5 nodes of one job 396 h. The same 2,048-node job gets
3.1 h, Llama 3's own experience.

The estimate. Failures of a node as a Poisson process with rate λ per node-hour, λ's prior a gamma
distribution worth PRIOR_FAILURES pseudo-failures at the prior MTBF M0 (shape K, rate K·M0). After
F failures in E node-hours the posterior is Gamma(K + F, K·M0 + E), and the operator uses the MTBF
of its mean rate:

    node MTBF = (K · M0 + E) / (K + F)

With K = 2, two real failures move the estimate half way to what they alone say; a fleet that has
run ten times the prior's pseudo-hours without a failure is believed ten times more.

The interval is clamped to [MIN_INTERVAL_SECONDS, MAX_INTERVAL_SECONDS] (5 min, 24 h): whatever
the inputs (a tenant's hostile termination messages, a measurement gone wrong), no job checkpoints
more often than every 5 minutes or less often than daily.

Pure: the trainer, the operator, the planner and the docs read the same definitions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Llama 3 (Dubey et al. 2024, §3.3.4): 419 unexpected interruptions, 54 days, 16,384 H100s.
PRIOR_INTERRUPTIONS, PRIOR_DAYS, PRIOR_GPUS = 419, 54, 16384
FAILURES_PER_GPU_HOUR = PRIOR_INTERRUPTIONS / (PRIOR_DAYS * 24 * PRIOR_GPUS)
PRIOR_FAILURES = 2.0  # K: what the prior is worth, in failures
MIN_INTERVAL_SECONDS = 5 * 60.0
MAX_INTERVAL_SECONDS = 24 * 3600.0
SMOOTHING = 0.5  # weight of each new blocking measurement in the running estimate (EWMA)
AUTO = "auto"
# what the operator renders into an attempt's pods for the trainer's AutoInterval
MTBF_ENV, BLOCKING_ENV = "LLMTRAIN_CHECKPOINT_MTBF_SECONDS", "LLMTRAIN_CHECKPOINT_BLOCKING_SECONDS"


def young_daly(blocking_seconds: float, mtbf_seconds: float) -> float:
    """τ = √(2 · C · M), unclamped (seconds)."""
    return math.sqrt(2.0 * max(blocking_seconds, 0.0) * max(mtbf_seconds, 0.0))


def clamp_interval(seconds: float) -> float:
    if not math.isfinite(seconds):
        return MAX_INTERVAL_SECONDS
    return min(MAX_INTERVAL_SECONDS, max(MIN_INTERVAL_SECONDS, seconds))


def interval(blocking_seconds: float, mtbf_seconds: float) -> float:
    """The auto interval in seconds: Young/Daly, clamped."""
    return clamp_interval(young_daly(blocking_seconds, mtbf_seconds))


def prior_node_mtbf_hours(gpus_per_node: int) -> float:
    """One node's MTBF under the Llama 3 prior: 50,678 GPU-hours over its GPUs (a CPU node: one)."""
    return 1.0 / (FAILURES_PER_GPU_HOUR * max(1, gpus_per_node))


@dataclass(frozen=True)
class NodeMTBF:
    """One node's MTBF on an instance type: the prior and what the operator has seen."""

    instance_type: str
    prior_hours: float  # M0
    failures: int  # F: node faults seen
    node_hours: float  # E: node-hours run

    @property
    def hours(self) -> float:
        """(K · M0 + E) / (K + F)."""
        return (PRIOR_FAILURES * self.prior_hours + max(self.node_hours, 0.0)) / (
            PRIOR_FAILURES + max(self.failures, 0)
        )

    def job_seconds(self, nodes: int) -> float:
        """The MTBF of a job on `nodes` of them."""
        return self.hours * 3600.0 / max(1, nodes)

    def words(self, nodes: int) -> str:
        """'16 p5.48xlarge nodes, prior + 2 failures in 310 node-hours'."""
        seen = (
            f"prior + {self.failures} failure{'s' if self.failures != 1 else ''} in {self.node_hours:,.0f} node-hours"
            if self.failures or self.node_hours
            else "prior only"
        )
        return f"{nodes} {self.instance_type} node{'s' if nodes != 1 else ''}, {seen}"


def node_mtbf(instance_type: str, gpus_per_node: int, failures: int = 0, node_hours: float = 0.0) -> NodeMTBF:
    return NodeMTBF(instance_type, prior_node_mtbf_hours(gpus_per_node), max(0, int(failures)), max(0.0, node_hours))


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 10 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def reason(blocking_seconds: float, mtbf_seconds: float, mtbf_words: str, what: str = "blocking") -> str:
    """Why the auto interval is what it is, for status.checkpoint.reason:
    'auto: √(2 × 41 s blocking × 37.5 h MTBF (16 p5.48xlarge nodes, prior + 2 failures in 310
    node-hours)) = 93 min'. `what`: where the blocking cost comes from, in words."""
    raw = young_daly(blocking_seconds, mtbf_seconds)
    chosen = clamp_interval(raw)
    text = (
        f"auto: √(2 × {blocking_seconds:.3g} s {what} × {mtbf_seconds / 3600:.1f} h MTBF ({mtbf_words})) "
        f"= {_duration(raw)}"
    )
    if chosen != raw:
        bounds = f"{_duration(MIN_INTERVAL_SECONDS)}..{_duration(MAX_INTERVAL_SECONDS)}"
        text += f", clamped to {_duration(chosen)} ({bounds})"
    return text


class AutoInterval:
    """The trainer's running choice: starts from `blocking_seconds` (an estimate), and after each
    save blends in its measured blocking time (the first measurement replaces the estimate; then an
    exponential moving average, SMOOTHING per save) and recomputes the interval."""

    def __init__(self, mtbf_seconds: float, blocking_seconds: float, measured_saves: int = 0):
        self.mtbf_seconds = max(0.0, mtbf_seconds)
        self.blocking_seconds = max(0.0, blocking_seconds)
        self.measured_saves = measured_saves

    @property
    def seconds(self) -> float:
        return interval(self.blocking_seconds, self.mtbf_seconds)

    def observe(self, blocking_seconds: float) -> float:
        """A save blocked training for `blocking_seconds`: the new interval."""
        if math.isfinite(blocking_seconds) and blocking_seconds >= 0:
            if self.measured_saves == 0:
                self.blocking_seconds = blocking_seconds
            else:
                self.blocking_seconds += SMOOTHING * (blocking_seconds - self.blocking_seconds)
            self.measured_saves += 1
        return self.seconds
