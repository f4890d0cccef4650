"""The trainer's progress as the monitor reads it from rank 0's /metrics: `Progress`, the trainer's
series it comes from, and `parse_progress`, which reads them from the body scrape.py fetched (the
tenant's: bounded, see scrape.py). Pure: decide's rules read the same figures."""

from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import dataclass

from ... import stragglers
from ...pod_contract import RESUME_TIERS
from ...status import percent

MAX_BODY_BYTES = 256 * 1024
MAX_SERIES_LINES = 1024  # lines of llmtrain_trainer_* series looked at (the trainer's: ~70)
_OURS = re.compile(rb"^llmtrain_trainer_[^\n]{0,4096}", re.MULTILINE)  # bounded: linear scan


def timestamp(t: dt.datetime) -> str:
    """A status time: RFC 3339, whole seconds (the clock is the caller's: clock.py, or a snapshot's `now`)."""
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def precise_timestamp(seconds: float) -> str:
    """Unix seconds as RFC 3339 to the millisecond (a whole second prints as `timestamp` prints it).
    For the trainer's own times that bound an attempt's steps in status.goodput (its loop's start,
    its last step): cut to whole seconds, each moved up to 1 s, always the same way."""
    whole = math.floor(seconds)
    ms = round((seconds - whole) * 1000)
    if ms == 1000:
        whole, ms = whole + 1, 0
    base = dt.datetime.fromtimestamp(whole, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{base}.{ms:03d}Z" if ms else f"{base}Z"


@dataclass(frozen=True)
class Progress:
    step: int | None = None
    loss: float | None = None
    tokens_per_second: float | None = None
    mfu: float | None = None
    last_checkpoint_step: int | None = None
    last_checkpoint_time: float | None = None
    heartbeat: float | None = None
    # Per-step loss facts the trainer keeps for the health rules (trainer/llmtrain_trainer/metrics/losswatch.py).
    nonfinite_loss_steps: float | None = None
    nonfinite_loss_max_steps: float | None = None
    nonfinite_loss_first_step: float | None = None
    loss_median: float | None = None
    loss_spike_step: float | None = None
    loss_spike_ratio: float | None = None
    resumed_before_step: float | None = None
    # goodput counters of this attempt's process (llmtrain/goodput.py)
    train_start: float | None = None
    resume_step: float | None = None
    resume_tier: float | None = None  # an index of pod_contract.RESUME_TIERS
    step_seconds_sum: float | None = None
    step_seconds_count: float | None = None
    checkpoint_blocking_seconds: float | None = None
    data_wait_seconds: float | None = None
    # the same for the whole attempt, over its in-place restarts (the trainer carries them across
    # its worker processes: trainer restarts.py); preferred to the process's own when present
    attempt_steps: float | None = None
    attempt_step_seconds: float | None = None
    attempt_checkpoint_blocking_seconds: float | None = None
    attempt_data_wait_seconds: float | None = None
    in_place_restarts: float | None = None
    in_place_restart_seconds: float | None = None
    in_place_redone_steps: float | None = None
    in_place_redone_seconds: float | None = None
    # intervalMinutes auto (llmtrain/cadence.py): the trainer's choice and its inputs, for
    # status.checkpoint (controller/policy/checkpoint_status.py), not status.progress
    checkpoint_interval_seconds: float | None = None
    checkpoint_blocking_estimate_seconds: float | None = None
    checkpoint_blocking_measured_saves: float | None = None
    # rank 0's latest straggler window (llmtrain/stragglers.py): the highest scores, each with its node
    stragglers: stragglers.Window | None = None

    def as_status(self) -> dict:
        """The status.progress fields (the scrape is the tenant's: a number no field can hold, an
        infinite step or a time past year 9999, is left out, not raised on)."""
        out: dict = {}
        for field, key in _HEALTH_STATUS.items():
            value = getattr(self, field)
            if field in ("loss_median", "loss_spike_ratio"):
                if value is not None and math.isfinite(value):
                    out[key] = round(value, 4)
            elif _count(value) is not None:
                out[key] = _count(value)
        if _count(self.step) is not None:
            out["step"] = _count(self.step)
        if self.loss is not None and math.isfinite(self.loss):  # JSON has no NaN: the API server refuses it
            out["loss"] = round(self.loss, 4)
        if self.tokens_per_second is not None and math.isfinite(self.tokens_per_second):
            out["tokensPerSecond"] = round(self.tokens_per_second, 1)
        if self.mfu is not None and math.isfinite(self.mfu):
            out["mfu"] = round(self.mfu, 4)
            out["mfuPercent"] = percent(self.mfu)
        if _count(self.last_checkpoint_step) is not None:
            out["lastCheckpointStep"] = _count(self.last_checkpoint_step)
        if (at := _unix(self.last_checkpoint_time)) is not None:
            out["lastCheckpointTime"] = timestamp(dt.datetime.fromtimestamp(at, dt.UTC))
        if (at := _unix(self.heartbeat)) is not None:
            out["heartbeatTime"] = precise_timestamp(at)
        if (at := _unix(self.train_start)) is not None:
            out["trainStartTime"] = precise_timestamp(at)
        tier = _count(self.resume_tier)
        if tier is not None and 0 <= tier < len(RESUME_TIERS):
            out["resumeFrom"] = RESUME_TIERS[tier]
        for field, key, digits in _GOODPUT_STATUS:
            value = getattr(self, field)
            attempt_field = _ATTEMPT_WIDE.get(field)
            if attempt_field is not None and getattr(self, attempt_field) is not None:
                value = getattr(self, attempt_field)
            if value is not None and math.isfinite(value) and 0 <= value <= MAX_COUNT:
                out[key] = int(value) if digits is None else round(value, digits)
        return out


# The largest count status.progress takes (JSON numbers are exact up to 2**53), and the latest
# time (RFC 3339 ends at year 9999).
MAX_COUNT = 2**53
MAX_UNIX_SECONDS = 253402300799


def _count(value: float | None) -> int | None:
    if value is None or not math.isfinite(value) or not -MAX_COUNT <= value <= MAX_COUNT:
        return None
    return int(value)


def _unix(value: float | None) -> float | None:
    """The value if it is a time the trainer could have written: after the epoch, before year 10000."""
    return value if value is not None and math.isfinite(value) and 0 < value <= MAX_UNIX_SECONDS else None


def eta(progress: dict, previous: dict, max_steps: int | None, at: dt.datetime) -> dict:
    """status.progress.estimatedRemainingSeconds and estimatedCompletionTime: the steps left at the
    recent step time (since the previous scrape of the same attempt, else the attempt's mean),
    plus the checkpoint stall this attempt has cost per step so far. {} when not known yet."""
    step, steps, secs = progress.get("step"), progress.get("attemptSteps"), progress.get("stepSeconds")
    if not max_steps or step is None or not steps or not secs:
        return {}
    per_step = secs / steps
    prev_steps, prev_secs = previous.get("attemptSteps"), previous.get("stepSeconds")
    if (
        previous.get("attempt") == progress.get("attempt")
        and isinstance(prev_steps, int)
        and isinstance(prev_secs, (int, float))
        and steps > prev_steps
        and secs > prev_secs
    ):
        per_step = (secs - prev_secs) / (steps - prev_steps)
    stall = (progress.get("checkpointBlockingSeconds") or 0.0) / steps
    left = max(0, int(max_steps) - int(step))
    remaining = round(left * (per_step + stall))
    return {
        "estimatedRemainingSeconds": remaining,
        "estimatedCompletionTime": timestamp(at + dt.timedelta(seconds=remaining)),
    }


_HEALTH_STATUS = {
    "nonfinite_loss_steps": "nonFiniteLossSteps",
    "nonfinite_loss_max_steps": "nonFiniteLossMaxSteps",
    "nonfinite_loss_first_step": "nonFiniteLossFirstStep",
    "loss_median": "lossMedian",
    "loss_spike_step": "lossSpikeStep",
    "loss_spike_ratio": "lossSpikeRatio",
    "resumed_before_step": "resumedBeforeStep",
}

# Progress field, status.progress key, rounding (None: an integer)
_GOODPUT_STATUS = (
    ("resume_step", "resumeStep", None),
    ("step_seconds_count", "attemptSteps", None),
    ("step_seconds_sum", "stepSeconds", 3),
    ("checkpoint_blocking_seconds", "checkpointBlockingSeconds", 3),
    ("data_wait_seconds", "dataWaitSeconds", 3),
    ("in_place_restarts", "inPlaceRestarts", None),
    ("in_place_restart_seconds", "inPlaceRestartSeconds", 3),
    ("in_place_redone_steps", "inPlaceRedoneSteps", None),
    ("in_place_redone_seconds", "inPlaceRedoneSeconds", 3),
)
# a process's own counter → the attempt-wide one that replaces it when the trainer exports it
_ATTEMPT_WIDE = {
    "step_seconds_count": "attempt_steps",
    "step_seconds_sum": "attempt_step_seconds",
    "checkpoint_blocking_seconds": "attempt_checkpoint_blocking_seconds",
    "data_wait_seconds": "attempt_data_wait_seconds",
}

GOODPUT_KEYS = (
    "trainStartTime",
    "resumeFrom",
    *(key for _, key, _ in _GOODPUT_STATUS),
    "estimatedRemainingSeconds",
    "estimatedCompletionTime",
)

_PROGRESS_METRICS = {
    "llmtrain_trainer_step": "step",
    "llmtrain_trainer_loss": "loss",
    "llmtrain_trainer_tokens_per_second": "tokens_per_second",
    "llmtrain_trainer_mfu": "mfu",
    "llmtrain_trainer_last_checkpoint_step": "last_checkpoint_step",
    "llmtrain_trainer_last_checkpoint_timestamp_seconds": "last_checkpoint_time",
    "llmtrain_trainer_heartbeat_timestamp_seconds": "heartbeat",
    **{f"llmtrain_trainer_{field}": field for field in _HEALTH_STATUS},
    "llmtrain_trainer_train_start_timestamp_seconds": "train_start",
    "llmtrain_trainer_resume_step": "resume_step",
    "llmtrain_trainer_resume_tier": "resume_tier",
    "llmtrain_trainer_step_seconds_sum": "step_seconds_sum",
    "llmtrain_trainer_step_seconds_count": "step_seconds_count",
    "llmtrain_trainer_checkpoint_blocking_seconds_total": "checkpoint_blocking_seconds",
    "llmtrain_trainer_data_wait_seconds_sum": "data_wait_seconds",
    "llmtrain_trainer_attempt_steps": "attempt_steps",
    "llmtrain_trainer_attempt_step_seconds": "attempt_step_seconds",
    "llmtrain_trainer_attempt_checkpoint_blocking_seconds": "attempt_checkpoint_blocking_seconds",
    "llmtrain_trainer_attempt_data_wait_seconds": "attempt_data_wait_seconds",
    "llmtrain_trainer_inplace_restarts": "in_place_restarts",
    "llmtrain_trainer_inplace_restart_seconds": "in_place_restart_seconds",
    "llmtrain_trainer_inplace_redone_steps": "in_place_redone_steps",
    "llmtrain_trainer_inplace_redone_seconds": "in_place_redone_seconds",
    "llmtrain_trainer_checkpoint_interval_seconds": "checkpoint_interval_seconds",
    "llmtrain_trainer_checkpoint_blocking_estimate_seconds": "checkpoint_blocking_estimate_seconds",
    "llmtrain_trainer_checkpoint_blocking_measured_saves": "checkpoint_blocking_measured_saves",
}


def parse_progress(body: bytes | str) -> Progress:
    """Our series of a Prometheus text exposition → Progress; everything else is skipped unread.
    `name{labels} value [timestamp]`: the first sample of each of our names counts. The straggler
    series (labelled by rank and node) are read by stragglers.parse, bounded the same way."""
    if isinstance(body, str):
        body = body.encode()
    values: dict = {}
    for n, m in enumerate(_OURS.finditer(body[:MAX_BODY_BYTES])):
        if n >= MAX_SERIES_LINES or len(values) == len(_PROGRESS_METRICS):
            break
        line = m.group(0)
        brace = line.find(b"{")
        if brace >= 0:
            end = line.rfind(b"}")
            if end < brace:
                continue
            name, rest = line[:brace], line[end + 1 :]
        else:
            name, _, rest = line.partition(b" ")
        field = _PROGRESS_METRICS.get(name.strip().decode("ascii", "replace"))
        if field is None or field in values:
            continue
        parts = rest.split()
        if not parts:
            continue
        try:
            value = float(parts[0][:64])
        except ValueError:
            continue
        values[field] = value
    window = stragglers.parse(body)
    if window.ranks:
        values["stragglers"] = window
    return Progress(**values)
