"""Per-step loss facts for the operator's health rules (operator/llmtrain/controller/policy/health.py).

The operator sees rank 0's /metrics only once per scrape interval, so a NaN streak or a spike
between two scrapes would be invisible if it only read the current loss. The trainer therefore
keeps what happened at EVERY step of this attempt and exports it as gauges; the operator applies
the thresholds of the job's current spec:

- the current and the longest run of consecutive non-finite losses, and the step that run began
  (`llmtrain_trainer_nonfinite_loss_steps`, `..._nonfinite_loss_max_steps`, `..._nonfinite_loss_first_step`);
- the median of the previous `window` finite losses and the last step's ratio to it;
- the FIRST step of this attempt whose loss exceeded `factor` × that median (after `min_steps`),
  and its ratio (`llmtrain_trainer_loss_spike_step`, `..._loss_spike_ratio`). The first, not the
  largest: a rollback must go back before the whole bad stretch, which starts there.

`factor` is the spec's resilience.lossSpikeFactor when set; when the rule is off the trainer still
records spikes over RECORD_FACTOR for dashboards and alerts.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

RECORD_FACTOR = 2.0


class LossWatch:
    def __init__(self, window: int, factor: float | None, min_steps: int):
        self.factor = factor or RECORD_FACTOR
        self.min_steps = min_steps
        self.recent: deque[float] = deque(maxlen=window)
        self.streak = self.max_streak = self.streak_start = self.max_streak_start = 0
        self.median: float | None = None
        self.ratio: float | None = None
        self.spike_step = 0
        self.spike_ratio = 0.0

    def observe(self, step: int, loss: float) -> None:
        if not math.isfinite(loss):
            self.streak += 1
            if self.streak == 1:
                self.streak_start = step
            if self.streak > self.max_streak:
                self.max_streak, self.max_streak_start = self.streak, self.streak_start
            self.ratio = None
            return
        self.streak = 0
        if len(self.recent) == self.recent.maxlen:
            self.median = statistics.median(self.recent)
            self.ratio = loss / self.median if self.median > 0 else None
            if self.ratio is not None and self.ratio > self.factor and step >= self.min_steps and not self.spike_step:
                self.spike_step, self.spike_ratio = step, self.ratio
        self.recent.append(loss)

    def export(self, metrics) -> None:
        metrics.nonfinite_loss_steps.set(self.streak)
        metrics.nonfinite_loss_max_steps.set(self.max_streak)
        metrics.nonfinite_loss_first_step.set(self.max_streak_start)
        if self.median is not None:
            metrics.loss_median.set(self.median)
        if self.ratio is not None:
            metrics.loss_ratio_to_median.set(self.ratio)
        metrics.loss_spike_step.set(self.spike_step)
        metrics.loss_spike_ratio.set(self.spike_ratio)
