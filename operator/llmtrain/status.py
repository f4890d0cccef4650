"""The `LLMTrainingJob` status: the one definition of what the operator writes under `status`.

Like `spec.py` for the spec, this is the source of the CRD's status schema (`llmtrain.crd`), and of
the two vocabularies every part of the operator shares:

- `Phase`: where the job is (`status.phase`, the printer column);
- `Reason`: why, one word per situation, in `status.reason`, in the conditions' reasons, as the
  events' reason and as the `reason` label of `llmtrain_operator_job_restarts`. Messages and
  `status.flightRecorder.reason` spell a reason in words (`Reason.words`: `StartupTimeout` →
  `startup-timeout`), as they always did.

Only the decide step (`controller/policy/decide.py` and its `situations_*.py`) sets phase, attempt, restarts,
reason and conditions. Reading is lenient (`parse`): an object written by an older operator (or with
fields a newer one added) still reads.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from .pod_contract import RESUME_TIERS


class Phase(str, Enum):
    PENDING = "Pending"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    @property
    def active(self) -> bool:
        return self in ACTIVE


TERMINAL = frozenset({Phase.SUCCEEDED, Phase.FAILED})
ACTIVE = frozenset({Phase.PENDING, Phase.RESTARTING, Phase.RUNNING})


class Reason(str, Enum):
    """Every cause the operator names. The values are the wire names (CamelCase, as Kubernetes
    reasons are); they never change, because existing objects, events and alerts carry them."""

    # the attempt's child's own states (llmtrain.backends.base.STATES), copied while it is not failed
    # (controller/policy/child_status.PHASE_OF)
    CREATED = "Created"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    # lifecycle
    PENDING = "Pending"  # Ready=False while the attempt's child has not run yet
    ADOPTED = "Adopted"  # event: an existing child (PyTorchJob, JobSet) taken over
    SUSPENDED = "Suspended"
    RESUMED = "Resumed"  # spec.suspend false again (a free restart once it had run)
    SPEC_VALID = "SpecValid"
    SPEC_APPLIED = "Applied"  # SpecAccepted=True: a mutable field changed
    SPEC_UPDATED = "SpecUpdated"  # its event
    SPEC_CHANGE_REJECTED = "SpecChangeRejected"  # event for a refused change
    IMMUTABLE_FIELD_CHANGED = "ImmutableFieldChanged"
    ROLLED_BACK = "RolledBack"  # event: resumeBeforeStep applied by the attempt
    POD_FAILED_ON_NODE = "PodFailedOnNode"  # event from the pod watch (nodes.py)
    # Kueue (controller/adapters/kueue.py): the attempt's child waits suspended until Kueue admits it
    QUEUED = "Queued"  # not admitted yet: Kueue's words in status.message
    # queued, and Kueue made no Workload for it in time: Kueue does not manage the child's kind
    # (integrations.frameworks), or another cause the message names; still waiting
    NO_KUEUE_WORKLOAD = "NoKueueWorkload"
    ADMITTED = "Admitted"  # Kueue unsuspended it: the start-up deadline counts from here
    PREEMPTED = "Preempted"  # Kueue suspended it again (preempted or evicted): no restart spent
    # the job cannot run: terminal, no restart
    INVALID_SPEC = "InvalidSpec"
    RENDER_FAILED = "RenderFailed"
    ATTEMPT_REJECTED = "AttemptRejected"  # the API server refused the attempt's child (the message names it)
    BACKEND_NOT_INSTALLED = "BackendNotInstalled"  # the job's backend's CRD is not served
    NAME_CONFLICT = "NameConflict"
    RESTART_BUDGET_EXHAUSTED = "RestartBudgetExhausted"
    # restart causes (one attempt ends, the next one starts)
    FAILED = "Failed"  # the attempt's child failed
    PREFLIGHT_FAILED = "PreflightFailed"
    HANG = "Hang"
    STARTUP_TIMEOUT = "StartupTimeout"
    NON_FINITE_LOSS = "NonFiniteLoss"
    LOSS_SPIKE = "LossSpike"
    NO_FIRST_STEP = "NoFirstStep"
    # a node under the attempt reports a health condition False (controller/policy/sicknodes.py): moved away
    NODE_UNHEALTHY = "NodeUnhealthy"
    # a rank slower than the others (controller/policy/slownodes.py): condition StragglerDetected, its
    # event, and the restart cause of spec.resilience.stragglers.action replace
    STRAGGLER = "Straggler"
    REPLACE_DECLINED = "ReplaceDeclined"  # replace would not pay (or its cap is reached): the event says why
    NO_STRAGGLER = "NoStraggler"
    COLLECTIVE_TIMEOUT = "CollectiveTimeout"  # only in status.flightRecorder: what the dumps are of
    # why the pods of a Pending attempt do not start (in the pods' own words: status.STUCK_WAITING)
    UNSCHEDULABLE = "Unschedulable"
    IMAGE_PULL_BACK_OFF = "ImagePullBackOff"
    ERR_IMAGE_PULL = "ErrImagePull"
    ERR_IMAGE_NEVER_PULL = "ErrImageNeverPull"  # imagePullPolicy Never, the image not on the node
    INVALID_IMAGE_NAME = "InvalidImageName"
    CREATE_CONTAINER_CONFIG_ERROR = "CreateContainerConfigError"
    CREATE_CONTAINER_ERROR = "CreateContainerError"
    CRASH_LOOP_BACK_OFF = "CrashLoopBackOff"
    RUN_CONTAINER_ERROR = "RunContainerError"
    # training health (controller/policy/health.py)
    STEPS_COMPLETING = "StepsCompleting"
    NO_RECENT_CHECKPOINT = "NoRecentCheckpoint"
    CHECKPOINT_RECENT = "CheckpointRecent"

    @property
    def words(self) -> str:
        """The reason in a sentence: `StartupTimeout` → `startup-timeout`."""
        return re.sub(r"(?<!^)(?=[A-Z])", "-", self.value).lower()


# Restarts whose attempt still holds its nodes (stuck or poisoned): its child is deleted even when
# the budget is spent. A failed child's pods are gone already (the training-operator's
# cleanPodPolicy; a failed Job's pods are terminated), so it is kept for `kubectl describe`.
STUCK = frozenset(
    {
        Reason.HANG,
        Reason.STARTUP_TIMEOUT,
        Reason.NON_FINITE_LOSS,
        Reason.LOSS_SPIKE,
        Reason.NO_FIRST_STEP,
        Reason.NODE_UNHEALTHY,
    }
)
# restart causes after which an NCCL flight recorder dump is worth reading
DUMPS = frozenset({Reason.HANG, Reason.STARTUP_TIMEOUT, Reason.COLLECTIVE_TIMEOUT})

DATE_TIME: dict[str, Any] = {"format": "date-time"}


def percent(share: float) -> str:
    """A share (0..1) as `kubectl get llmtj` shows it: 0.1085 → "10.85%", as `llmtrain local`'s
    summary prints MFU.

    Why a string beside the ratio: a CRD printer column shows a number as the JSON holds it (0.1085)
    and cannot scale or suffix it, and changing `mfu` or `goodput.ratio` to percent would break what
    reads them as ratios (the goodput gauge and its alert, `llmtrain goodput`, `llmtrain scale-test`,
    scripts reading status). So the writer of each ratio also writes this display string next to
    it, in the same write (`progress.mfuPercent`, `goodput.ratioPercent`), and the MFU and GOODPUT
    columns show those."""
    return f"{share:.2%}"


# status.progress.resumeFrom: the trainer's llmtrain_trainer_resume_tier, by name
ResumeTier = Literal[RESUME_TIERS]  # type: ignore[valid-type]  # the names live in pod_contract, one source


class _Status(BaseModel):
    # extra="ignore": an object written by another version of the operator still reads.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", use_enum_values=False)


class ConditionType(str, Enum):
    READY = "Ready"
    VALIDATED = "Validated"
    SPEC_ACCEPTED = "SpecAccepted"
    TRAINING_HEALTHY = "TrainingHealthy"
    CHECKPOINT_STALE = "CheckpointStale"
    STRAGGLER_DETECTED = "StragglerDetected"


class Condition(_Status):
    type: str
    status: str = Field(json_schema_extra={"enum": ["True", "False", "Unknown"]})
    reason: str | None = None
    message: str | None = None
    last_transition_time: str | None = Field(None, json_schema_extra=DATE_TIME)
    observed_generation: int | None = None


class PlanSummary(_Status):
    memory_per_gpu_gi_b: float | None = Field(None, alias="memoryPerGpuGiB")
    fits: bool | None = None
    flops_per_token: float | None = None
    num_params: int | None = None
    expected_tokens_per_second: float | None = None


class ProgressStatus(_Status):
    """The trainer's progress. While the job is Running, the monitor's scrape of rank 0's /metrics
    (controller/adapters/monitor.py, every --progress-interval; its write applies only while the phase is
    Running). When the job ends, decide's write that ends it: on Succeeded the trainer's final
    summary, from the termination message its pods leave on a clean exit (llmtrain/final_summary.py;
    tokensPerSecond and mfu are then the means over the steps after the first, and updateTime the
    time of that write), or, without one (an older trainer image, the pods already gone), the last
    scrape; on any end the ETA is removed."""

    step: int | None = None
    loss: float | None = None
    tokens_per_second: float | None = None
    mfu: float | None = Field(None, description="model FLOPs utilisation, 0..1")
    mfu_percent: str | None = Field(
        None, description="mfu as a percentage (10.85%), for the MFU printer column (status.percent)"
    )
    last_checkpoint_step: int | None = None
    last_checkpoint_time: str | None = Field(None, json_schema_extra=DATE_TIME)
    heartbeat_time: str | None = Field(None, json_schema_extra=DATE_TIME)
    update_time: str | None = Field(None, json_schema_extra=DATE_TIME)
    # the trainer's per-step loss facts (trainer/llmtrain_trainer/metrics/losswatch.py)
    non_finite_loss_steps: int | None = None
    non_finite_loss_max_steps: int | None = None
    non_finite_loss_first_step: int | None = None
    loss_median: float | None = None
    loss_spike_step: int | None = None
    loss_spike_ratio: float | None = None
    resumed_before_step: int | None = None
    # the trainer's goodput counters of `attempt` (llmtrain/goodput.py), since its process started
    attempt: int | None = Field(None, description="the attempt these counters are of")
    train_start_time: str | None = Field(
        None, json_schema_extra=DATE_TIME, description="the attempt's training loop began"
    )
    resume_step: int | None = Field(None, description="the step the attempt resumed from (0: from scratch)")
    resume_from: ResumeTier | None = Field(
        None,
        description="where its workers resumed from last: none (a fresh start or pretrained weights), durable "
        "(the newest checkpoint), memory (every rank's own in-memory snapshot) or partner (in-memory "
        "snapshots, some from the partner node's copies)",
    )
    attempt_steps: int | None = Field(None, description="optimizer steps the attempt completed")
    step_seconds: float | None = Field(None, description="their summed wall time")
    checkpoint_blocking_seconds: float | None = Field(
        None, description="seconds the attempt's checkpoint saves blocked training"
    )
    data_wait_seconds: float | None = Field(None, description="seconds its steps waited for input batches")
    in_place_restarts: int | None = Field(
        None,
        description="times torchrun restarted the attempt's worker processes in place, as rank 0's pod "
        "counts them (spec.resilience.inPlaceRestarts; not counted in status.restarts)",
    )
    in_place_restart_seconds: float | None = Field(
        None, description="their cost: one process's last step → the next one's training loop, summed"
    )
    in_place_redone_steps: int | None = Field(None, description="steps redone after them (from a checkpoint)")
    in_place_redone_seconds: float | None = Field(None, description="those steps' measured time")
    # ETA (controller/policy/progress.py): the recent step time × the steps left, plus the checkpoint stall
    # expected at this attempt's rate
    estimated_remaining_seconds: int | None = None
    estimated_completion_time: str | None = Field(None, json_schema_extra=DATE_TIME)


class GoodputSeconds(_Status):
    """Seconds of the job's wall time per bucket (llmtrain/goodput.py); they add up to wallSeconds."""

    queued: float = 0.0
    starting: float = 0.0
    productive: float = 0.0
    slow: float = Field(
        0.0,
        description="time lost to a straggler: (1 - 1/slowdown) of the productive time while a straggler verdict stood",
    )
    lost_work: float = 0.0
    restarting: float = 0.0
    hang: float = 0.0
    checkpoint_stall: float = 0.0
    data_wait: float = 0.0
    suspended: float = 0.0


class AttemptRecord(_Status):
    """One attempt on the goodput timeline; the trainer's counters are copied from status.progress
    when it ends."""

    attempt: int
    created_time: str | None = Field(None, json_schema_extra=DATE_TIME)
    end_time: str | None = Field(None, json_schema_extra=DATE_TIME)
    end_reason: str | None = None
    admitted_time: str | None = Field(
        None, json_schema_extra=DATE_TIME, description="a queue admitted its child (created suspended)"
    )
    train_start_time: str | None = Field(None, json_schema_extra=DATE_TIME)
    heartbeat_time: str | None = Field(None, json_schema_extra=DATE_TIME)
    resume_step: int | None = None
    resume_from: ResumeTier | None = None
    step: int | None = None
    attempt_steps: int | None = None
    step_seconds: float | None = None
    checkpoint_blocking_seconds: float | None = None
    data_wait_seconds: float | None = None
    in_place_restarts: int | None = None
    in_place_restart_seconds: float | None = None
    in_place_redone_steps: int | None = None
    in_place_redone_seconds: float | None = None
    last_checkpoint_step: int | None = Field(
        None, description="the newest complete checkpoint when the attempt ended (`llmtrain goodput` marks it)"
    )
    last_checkpoint_time: str | None = Field(None, json_schema_extra=DATE_TIME)
    slow_seconds: float | None = Field(
        None, description="time lost to ended straggler verdicts: (1 - 1/slowdown) x their seconds"
    )
    slow_since: str | None = Field(
        None, json_schema_extra=DATE_TIME, description="a straggler verdict stands since (status.straggler)"
    )
    slowdown: float | None = Field(None, description="its slowdown since slowSince")


class Suspension(_Status):
    start_time: str | None = Field(None, json_schema_extra=DATE_TIME)
    end_time: str | None = Field(None, json_schema_extra=DATE_TIME)


class GoodputStatus(_Status):
    ratio: float | None = Field(None, description="productive / (wall - suspended)")
    ratio_percent: str | None = Field(
        None, description="ratio as a percentage (93.41%), for the GOODPUT printer column"
    )
    wall_seconds: float | None = None
    seconds: GoodputSeconds | None = None
    steps_redone: int | None = None
    update_time: str | None = Field(None, json_schema_extra=DATE_TIME)
    # the timeline the figures are computed from (kept across attempts and operator restarts)
    attempts: list[AttemptRecord] | None = None
    suspensions: list[Suspension] | None = None
    earlier: GoodputSeconds | None = Field(None, description="buckets of attempt records folded away")
    earlier_until: str | None = Field(None, json_schema_extra=DATE_TIME)
    earlier_high_step: int | None = None


class CheckpointCadence(_Status):
    """The checkpoint interval the current attempt uses and why (llmtrain/cadence.py). Written by
    decide only: when the attempt's child is created, and for intervalMinutes auto again when
    the trainer's choice (its gauges, scraped) changes."""

    attempt: int | None = Field(None, description="the attempt this is of")
    interval_source: str | None = Field(
        None,
        json_schema_extra={"enum": ["auto", "spec"]},
        description="spec.checkpoint.intervalMinutes: auto, or a number (spec)",
    )
    interval_seconds: int | None = Field(None, description="seconds between time-based saves now")
    blocking_seconds: float | None = Field(
        None, description="auto: the blocking cost per save the interval is computed from"
    )
    blocking_measured_saves: int | None = Field(
        None,
        description="auto: the attempt's saves that blocking cost is measured over (smoothed); 0: an estimate "
        "(the previous attempt's measurement, or the planner's)",
    )
    mtbf_seconds: float | None = Field(None, description="auto: the job's MTBF (one node's over the job's nodes)")
    node_mtbf_hours: float | None = Field(None, description="auto: one node's MTBF on the instance type")
    failures: int | None = Field(None, description="auto: node faults counted on the instance type")
    node_hours: float | None = Field(None, description="auto: node-hours those failures were seen in")
    reason: str | None = Field(None, description="why, in words")
    update_time: str | None = Field(None, json_schema_extra=DATE_TIME)


class BadNode(_Status):
    node: str
    reason: str
    attempt: int | None = None
    pod: str | None = None
    exit_code: int | None = None
    xid: int | None = None
    message: str | None = None
    time: str | None = Field(None, json_schema_extra=DATE_TIME)


class PreflightStatus(_Status):
    attempt: int | None = None
    healthy: bool | None = None
    degraded: bool | None = None
    bus_bandwidth_g_bps: float | None = Field(None, alias="busBandwidthGBps")
    expected_bus_bandwidth_g_bps: float | None = Field(None, alias="expectedBusBandwidthGBps")
    world_size: int | None = None
    suspect_nodes: list[str] | None = None
    time: str | None = Field(None, json_schema_extra=DATE_TIME)


class StragglerStatus(_Status):
    """The straggler the current attempt's rank 0 reports (controller/policy/slownodes.py)."""

    attempt: int | None = None
    rank: int | None = None
    node: str | None = None
    score: float | None = Field(None, description="its compute time over the median of the other ranks'")
    slowdown: float | None = Field(None, description="the job's step time over what it would be without it")
    since: str | None = Field(None, json_schema_extra=DATE_TIME, description="first seen on this node, this attempt")


class FlightRecorder(_Status):
    attempt: int | None = None
    reason: str | None = Field(None, description="the restart cause in words (Reason.words)")
    path: str | None = None
    persistent: bool | None = None
    note: str | None = None


class LLMTrainingJobStatus(_Status):
    phase: Phase | None = None
    reason: str | None = Field(None, description="a Reason (or, while Pending, the pods' own reason)")
    message: str | None = None
    attempt: int | None = Field(None, description="the current attempt (1, 2, ...); only goes up")
    restarts: int | None = Field(None, description="restarts spent of spec.resilience.maxRestarts; only goes up")
    observed_generation: int | None = None
    backend: str | None = Field(
        None,
        description="what runs the attempts' pods (llmtrain.backends: pytorchjob, jobset), decided when the job "
        "is first judged (spec.cluster.backend, or the platform's default then) and never again",
    )
    child: str | None = Field(None, description="the current attempt's child: the PyTorchJob or JobSet named so")
    pytorch_job: str | None = Field(
        None,
        alias="pytorchJob",
        description="deprecated: the current attempt's PyTorchJob, as operators before status.child wrote it "
        "(read, never written; cleared with the next attempt)",
    )
    rendezvous_id: str | None = None
    start_time: str | None = Field(None, json_schema_extra=DATE_TIME)
    attempt_start_time: str | None = Field(None, json_schema_extra=DATE_TIME)
    attempt_creation_time: str | None = Field(None, json_schema_extra=DATE_TIME)
    admission_time: str | None = Field(
        None,
        json_schema_extra=DATE_TIME,
        description=(
            "when Kueue last admitted the current attempt (unsuspended its child); the start-up "
            "deadline counts from here"
        ),
    )
    next_attempt_time: str | None = Field(None, json_schema_extra=DATE_TIME)
    completion_time: str | None = Field(None, json_schema_extra=DATE_TIME)
    model: str | None = None
    plan: PlanSummary | None = None
    progress: ProgressStatus | None = None
    # a NaN/spike rollback the next attempt still has to apply (controller/policy/health.py)
    resume_before_step: int | None = None
    # failure forensics, preflight and flight recorder (controller/policy/forensics.py)
    bad_nodes: list[BadNode] | None = None
    avoid_nodes: list[str] | None = None
    preflight: PreflightStatus | None = None
    preflight_failures: int | None = None
    node_moves: int | None = Field(
        None,
        description="attempts moved off a node whose health condition turned False (controller/policy/sicknodes.py); "
        "only goes up",
    )
    flight_recorder: FlightRecorder | None = None
    straggler: StragglerStatus | None = None
    straggler_replacements: int | None = Field(
        None, description="restarts away from a straggler's node (spec.resilience.stragglers); only goes up"
    )
    goodput: GoodputStatus | None = None
    checkpoint: CheckpointCadence | None = None
    conditions: list[Condition] | None = None

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions or [] if c.type == type_), None)

    @property
    def current_child(self) -> str | None:
        """The current attempt's child, also as an operator before status.child recorded it."""
        return self.child or self.pytorch_job


def parse(raw: dict | None) -> LLMTrainingJobStatus:
    """The status as stored; a field this operator cannot read (a hand-edited object) is left out
    rather than failing the job."""
    raw = raw or {}
    try:
        return LLMTrainingJobStatus.model_validate(raw)
    except ValueError:
        good = {}
        for key, value in raw.items():
            try:
                LLMTrainingJobStatus.model_validate({key: value})
                good[key] = value
            except ValueError:
                continue
        return LLMTrainingJobStatus.model_validate(good)


def wire_fields() -> set[str]:
    """The camelCase names status may have (the schema's properties)."""
    return {f.alias or name for name, f in LLMTrainingJobStatus.model_fields.items()}
