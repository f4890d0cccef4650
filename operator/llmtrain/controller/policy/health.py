"""Health rules of a Running attempt: pure verdicts from the job's spec, status and rank 0's metrics.

No API calls here (decide.py turns the verdicts into the job's transitions), so every rule is
unit-testable.
Thresholds come from the job's CURRENT spec.resilience (mutable: a change applies at the next
scrape); the facts come from the trainer, which keeps them for every step (metrics/losswatch.py), so a NaN
streak or a spike between two scrapes is not missed.

Restart rules (the first that holds, in this order; each restart counts against maxRestarts):
  NonFiniteLoss    the longest run of NaN/Inf losses of this attempt >= nonFiniteLossSteps
                   → resume before the first step of that run
  LossSpike        lossSpikeFactor set, and the first step (>= lossSpikeMinSteps) whose loss exceeded
                   lossSpikeFactor × the median of the previous lossSpikeWindow losses
                   → resume before that step
  Hang             a step of this attempt was seen, the last one longer ago than hangTimeoutMinutes
  NoFirstStep      no step of this attempt within firstStepTimeoutMinutes of it Running
"Resume before step S" is recorded as status.resumeBeforeStep, rendered into the next attempts as
LLMTRAIN_RESUME_BEFORE_STEP until one reports (llmtrain_trainer_resumed_before_step) that it applied
it: that attempt moved the checkpoints from S on to <checkpoint.uri>/quarantine/ and resumed from
the newest one before S.

Conditions: `TrainingHealthy` (False with the rule's reason: NonFiniteLoss, LossSpike, Hang,
NoFirstStep; True, reason StepsCompleting, once the attempt completes steps again) and
`CheckpointStale` (warning only, never a restart: True, reason NoRecentCheckpoint, when
checkpoint.uri is set and no checkpoint completed for STALE_INTERVALS × checkpoint.intervalMinutes,
counted from the newer of the last checkpoint and the attempt's start; the interval is the one the
attempt runs with, status.checkpoint's (a change of intervalMinutes applies from the next attempt),
and for auto before the attempt has one the longest auto interval).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from ... import cadence
from ...spec import LLMTrainingJobSpec
from ...status import ConditionType, Phase, Reason
from .child_status import parse_time, set_condition
from .progress import Progress

HEALTHY = ConditionType.TRAINING_HEALTHY.value
STALE = ConditionType.CHECKPOINT_STALE.value
STALE_INTERVALS = 2
MAX_RECORDED_INTERVAL = 10080 * 60.0  # the longest spec interval (status is written by decide, still bounded)


@dataclass(frozen=True)
class Restart:
    reason: Reason  # status.reason of the restart, and the TrainingHealthy=False reason
    message: str
    resume_before_step: int | None = None

    @property
    def condition_reason(self) -> Reason:
        return self.reason

    def amend(self, generation: int | None, update: dict, at: dt.datetime) -> dict:
        """The verdict's condition (and rollback) in the restart's own conditional write."""
        update["conditions"] = set_condition(
            update.get("conditions") or [], HEALTHY, False, self.reason, self.message, generation, at
        )
        if self.resume_before_step is not None and update.get("phase") != Phase.FAILED:
            update["resumeBeforeStep"] = self.resume_before_step
        return update


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: Reason
    message: str
    warn: bool = False  # post a Warning event when it is newly set


@dataclass(frozen=True)
class Verdict:
    restart: Restart | None
    conditions: tuple[Condition, ...]
    rollback_applied: int | None = None  # status.resumeBeforeStep the current attempt applied


def _minutes(td: dt.timedelta) -> str:
    return f"{td.total_seconds() / 60:.0f} min"


def evaluate(spec: LLMTrainingJobSpec, status: dict, progress: Progress | None, at: dt.datetime) -> Verdict:
    """The verdict for a Running attempt. `status` is the job's status with status.progress already
    merged with this scrape; `progress` is this scrape of the current attempt's rank 0 (None when
    it failed: the loss rules then wait for the next one, the time rules still apply)."""
    current = status.get("progress") or {}
    running_since = parse_time(status.get("attemptStartTime") or status.get("startTime"))
    heartbeat = parse_time(current.get("heartbeatTime"))
    if heartbeat is not None and running_since is not None and heartbeat < running_since:
        heartbeat = None  # the previous attempt's heartbeat says nothing about this one
    conditions: list[Condition] = []
    stale = _checkpoint_stale(spec, status, running_since, at)
    if stale is not None:
        conditions.append(stale)
    applied = None
    pending = status.get("resumeBeforeStep")
    if progress is not None and pending and progress.resumed_before_step == pending:
        applied = pending

    restart = _restart(spec, progress, heartbeat, running_since, at)
    if restart is None and heartbeat is not None:
        conditions.append(
            Condition(
                HEALTHY,
                True,
                Reason.STEPS_COMPLETING,
                f"attempt {status.get('attempt') or 1} is completing training steps",
            )
        )
    return Verdict(restart, tuple(conditions), applied)


def _restart(spec, progress, heartbeat, running_since, at) -> Restart | None:
    r = spec.resilience
    if progress is not None:
        worst = int(progress.nonfinite_loss_max_steps or 0)
        if r.non_finite_loss_steps and worst >= r.non_finite_loss_steps:
            first = int(progress.nonfinite_loss_first_step or 0) or None
            where = (
                f"from step {first} (nonFiniteLossSteps {r.non_finite_loss_steps}); resuming from "
                f"the newest checkpoint before step {first}"
                if first
                else f"(nonFiniteLossSteps {r.non_finite_loss_steps}); resuming from the newest checkpoint"
            )
            return Restart(Reason.NON_FINITE_LOSS, f"the loss was NaN/Inf for {worst} consecutive steps {where}", first)
        spike = int(progress.loss_spike_step or 0)
        ratio = progress.loss_spike_ratio or 0.0
        if r.loss_spike_factor and spike and spike >= r.loss_spike_min_steps and ratio > r.loss_spike_factor:
            return Restart(
                Reason.LOSS_SPIKE,
                f"the loss of step {spike} was {ratio:.2f}× the median of the previous "
                f"{r.loss_spike_window} steps (lossSpikeFactor {r.loss_spike_factor:g}); "
                f"resuming from the newest checkpoint before step {spike}, the checkpoints "
                f"from step {spike} on are kept under {_quarantine(spec)}",
                spike,
            )
    hang = dt.timedelta(minutes=r.hang_timeout_minutes)
    if heartbeat is not None and at - heartbeat > hang:
        return Restart(
            Reason.HANG,
            f"no training step completed for {_minutes(at - heartbeat)} (hangTimeoutMinutes {r.hang_timeout_minutes})",
        )
    first_step = dt.timedelta(minutes=r.first_step_timeout_minutes)
    if heartbeat is None and running_since is not None and at - running_since > first_step:
        return Restart(
            Reason.NO_FIRST_STEP,
            f"no training step completed in the {_minutes(at - running_since)} since the "
            f"attempt started running (firstStepTimeoutMinutes {r.first_step_timeout_minutes})",
        )
    return None


def _quarantine(spec: LLMTrainingJobSpec) -> str:
    uri = spec.checkpoint.uri or "<checkpoint.uri>"
    return f"{uri.rstrip('/')}/quarantine/"


def _interval_in_use(spec: LLMTrainingJobSpec, status: dict) -> tuple[float, str]:
    """(seconds, in words) of the interval the running attempt saves at: status.checkpoint's, which
    was recorded when its pods were rendered (and follows the trainer's auto choice), else the
    spec's; for auto before the attempt has one, the longest auto interval."""
    ck = status.get("checkpoint") or {}
    raw = ck.get("intervalSeconds")
    seconds = float(raw) if isinstance(raw, (int, float)) and not isinstance(raw, bool) else 0.0
    recorded = ck.get("attempt") == status.get("attempt") and 0 < seconds <= MAX_RECORDED_INTERVAL
    if recorded and ck.get("intervalSource") == cadence.AUTO:
        return seconds, f"the auto interval ({_minutes(dt.timedelta(seconds=seconds))})"
    if recorded:
        return seconds, f"checkpoint.intervalMinutes ({seconds / 60:.0f})"
    fixed = spec.checkpoint.fixed_interval_seconds
    if fixed is None:
        return cadence.MAX_INTERVAL_SECONDS, f"the auto interval (at most {cadence.MAX_INTERVAL_SECONDS / 3600:.0f} h)"
    return fixed, f"checkpoint.intervalMinutes ({spec.checkpoint.interval_minutes})"


def _checkpoint_stale(spec, status, running_since, at) -> Condition | None:
    if not spec.checkpoint.uri or running_since is None:
        return None
    fixed, interval = _interval_in_use(spec, status)
    limit = dt.timedelta(seconds=STALE_INTERVALS * fixed)
    last_ckpt = parse_time((status.get("progress") or {}).get("lastCheckpointTime"))
    since = max(t for t in (last_ckpt, running_since) if t is not None)
    what = (
        f"the last checkpoint completed {_minutes(at - last_ckpt)} ago"
        if last_ckpt and last_ckpt >= running_since
        else f"no checkpoint completed in the {_minutes(at - running_since)} since the attempt started running"
    )
    if at - since > limit:
        return Condition(
            STALE,
            True,
            Reason.NO_RECENT_CHECKPOINT,
            f"{what}: more than {STALE_INTERVALS} × {interval}; a restart now would lose that work",
            warn=True,
        )
    return Condition(
        STALE,
        False,
        Reason.CHECKPOINT_RECENT,
        f"a checkpoint completed within {STALE_INTERVALS} × {interval.split(' (')[0]}",
    )


def changed_conditions(conditions: list[dict], verdict: Verdict) -> list[Condition]:
    """The verdict's conditions that differ (status or reason) from the recorded ones. A
    CheckpointStale=False is only worth writing when it was True: a job that never went stale
    carries no CheckpointStale condition."""
    have = {c.get("type"): c for c in conditions or []}
    out = []
    for c in verdict.conditions:
        old = have.get(c.type)
        if old is None and c.type == STALE and not c.status:
            continue
        if old is None or old.get("status") != ("True" if c.status else "False") or old.get("reason") != c.reason:
            out.append(c)
    return out


def needs_write(status: dict, verdict: Verdict) -> bool:
    """Whether the verdict changes anything against `status` as last seen (the write itself is
    decided again on a fresh read)."""
    return (
        verdict.restart is not None
        or verdict.rollback_applied is not None
        or bool(changed_conditions(status.get("conditions") or [], verdict))
    )
