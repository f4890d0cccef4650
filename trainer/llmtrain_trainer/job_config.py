"""Each trainer component's own small config, and the one place the job spec becomes them.

The spec is the user's document (camelCase on the wire, validated by the operator); the components
take only what they use, in their own terms: the checkpointer a `CheckpointConfig`, the data loader a
`DataConfig`, and so on. `JobConfig.from_spec` builds them all from the spec, the job identity and
the worker's environment (`config.WorkerEnv`), so a spec field is read in exactly one place and a
component can be built, and tested, from its config alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmtrain.cadence import AutoInterval
from llmtrain.catalog import ModelDims, instance_type
from llmtrain.spec import FSDPSpec, LLMTrainingJobSpec, TrainingSpec, resolve_dims

from .config import JobIdentity, WorkerEnv, global_batch_seqs, lr_at, staging_dir
from .garbage import GC_EVERY_STEPS

if TYPE_CHECKING:  # snapshots.py imports torch; the trainer builds its config only where it runs
    from .checkpoint.snapshots import SnapshotConfig


@dataclass(frozen=True)
class ModelConfig:
    """The model and how it is sharded (distributed/parallel.py)."""

    dims: ModelDims
    fsdp: FSDPSpec
    seed: int  # the initial weights' (models/init.py)

    @classmethod
    def from_spec(cls, spec: LLMTrainingJobSpec) -> ModelConfig:
        return cls(dims=resolve_dims(spec.model), fsdp=spec.fsdp, seed=spec.training.seed)

    @property
    def fp16(self) -> bool:
        """fp16 has 5 exponent bits: its gradients need loss scaling (bf16's do not)."""
        return self.fsdp.mixed_precision == "fp16"


@dataclass(frozen=True)
class OptimizerConfig:
    """AdamW and its learning-rate schedule (optimizer.py)."""

    learning_rate: float
    weight_decay: float
    grad_clip: float  # 0: no clipping
    schedule: TrainingSpec  # warmup, decay shape and floor: `config.lr_at`

    @classmethod
    def from_spec(cls, spec: LLMTrainingJobSpec) -> OptimizerConfig:
        t = spec.training
        return cls(learning_rate=t.learning_rate, weight_decay=t.weight_decay, grad_clip=t.grad_clip, schedule=t)

    def lr_at(self, step: int) -> float:
        """The learning rate of optimizer step `step` (1-based)."""
        return lr_at(step, self.schedule)


@dataclass(frozen=True)
class DataConfig:
    """Which samples, how many per step and per micro-batch (data/loader.py)."""

    uri: str
    seq_len: int
    seed: int
    vocab_size: int  # the model's: a dataset with a larger vocabulary is refused
    global_batch_seqs: int
    micro_batch_size: int

    @classmethod
    def from_spec(cls, spec: LLMTrainingJobSpec, dims: ModelDims) -> DataConfig:
        seq_len = spec.data.seq_len
        assert seq_len is not None, "unresolved spec: data.seqLen"
        if seq_len > dims.max_seq_len:
            raise ValueError(f"data.seqLen {seq_len} exceeds the model's max_seq_len {dims.max_seq_len}")
        return cls(
            uri=spec.data.uri,
            seq_len=seq_len,
            seed=spec.training.seed,
            vocab_size=dims.vocab_size,
            global_batch_seqs=global_batch_seqs(spec),
            micro_batch_size=spec.training.micro_batch_size,
        )

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_seqs * self.seq_len


@dataclass(frozen=True)
class CheckpointConfig:
    """Where, how often and how many checkpoints (checkpoint/checkpointer.py). `uri` None: none."""

    uri: str | None
    keep: int = 3
    interval_minutes: float = 60.0  # time-based saves (ignored when `auto` is set)
    interval_steps: int = 0  # also every N steps (0: by time only)
    timeout_minutes: float = 10.0  # the save group's collective timeout (at least 60 minutes is used)
    attempt: int = 0  # the operator's attempt: S3 saves are fenced by it
    auto: AutoInterval | None = None  # intervalMinutes auto: the interval's inputs before any save
    staging: str | None = None  # node-local scratch for S3 transfers (None: config.staging_dir())

    @classmethod
    def from_spec(cls, spec: LLMTrainingJobSpec, job: JobIdentity, env: WorkerEnv) -> CheckpointConfig:
        from .checkpoint.checkpointer import auto_interval

        c = spec.checkpoint
        return cls(
            uri=c.uri,
            keep=c.keep,
            interval_minutes=(c.fixed_interval_seconds or 0) / 60,
            interval_steps=c.interval_steps,
            timeout_minutes=spec.resilience.collective_timeout_minutes,
            attempt=job.attempt,
            auto=auto_interval(spec, env.checkpoint_auto),
            staging=env.staging or staging_dir({}),
        )


def snapshot_config(spec: LLMTrainingJobSpec, job: JobIdentity, env: WorkerEnv) -> SnapshotConfig | None:
    """spec.checkpoint.memory's config (checkpoint/snapshots.py); None: no snapshots."""
    from pathlib import Path

    from .checkpoint.snapshots import SnapshotConfig, auto_snapshot_interval

    m = spec.checkpoint.memory
    if m is None:
        return None
    steps = m.interval_steps if isinstance(m.interval_steps, int) else 0
    return SnapshotConfig(
        folder=Path(env.snapshot_dir),
        job=job.label,
        attempt=job.attempt,
        run=env.run_id,
        interval_steps=steps,
        auto=None if steps else auto_snapshot_interval(spec, env.checkpoint_auto),
        partner=m.partner,
        timeout_minutes=spec.resilience.collective_timeout_minutes,
    )


@dataclass(frozen=True)
class LedgerConfig:
    """The attempt's goodput ledger across in-place restarts (metrics/restarts.py). `path` None:
    no staging volume or no rendezvous run id, so nothing is kept across processes."""

    path: str | None
    run_id: str
    attempt: int

    @classmethod
    def from_env(cls, job: JobIdentity, env: WorkerEnv) -> LedgerConfig:
        from .metrics.restarts import ledger_path

        path = ledger_path(env.staging, env.local_rank) if env.staging and env.run_id else None
        return cls(path=path, run_id=env.run_id, attempt=job.attempt)


@dataclass(frozen=True)
class MetricsConfig:
    """What the metrics component reports and from what (metrics/logger.py)."""

    job: JobIdentity
    port: int  # this rank's /metrics port
    hang_timeout_seconds: float
    dims: ModelDims
    seq_len: int
    global_batch_seqs: int
    micro_batch_size: int
    max_steps: int
    peak_flops_per_device: float  # the instance catalog's, for MFU
    loss_spike_window: int
    loss_spike_factor: float | None
    loss_spike_min_steps: int

    @classmethod
    def from_spec(cls, spec: LLMTrainingJobSpec, job: JobIdentity, env: WorkerEnv, dims: ModelDims) -> MetricsConfig:
        r = spec.resilience
        assert spec.data.seq_len is not None, "unresolved spec: data.seqLen"
        return cls(
            job=job,
            port=env.metrics_port + env.local_rank,
            hang_timeout_seconds=r.hang_timeout_minutes * 60,
            dims=dims,
            seq_len=spec.data.seq_len,
            global_batch_seqs=global_batch_seqs(spec),
            micro_batch_size=spec.training.micro_batch_size,
            max_steps=spec.training.max_steps,
            peak_flops_per_device=instance_type(spec.cluster.instance_type).peak_flops_per_device,
            loss_spike_window=r.loss_spike_window,
            loss_spike_factor=r.loss_spike_factor,
            loss_spike_min_steps=r.loss_spike_min_steps,
        )

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_seqs * self.seq_len


@dataclass(frozen=True)
class ResumeConfig:
    """Where an attempt starts: the newest checkpoint (before `before_step`, a loss-spike
    rollback), else the pretrained weights, else a fresh initialisation."""

    before_step: int  # 0: no rollback
    pretrained_uri: str | None
    local_rank: int = 0  # local rank 0 downloads S3 weights for its node
    cache_dir: str | None = None  # where (None: the temp dir)

    @classmethod
    def from_spec(cls, spec: LLMTrainingJobSpec, env: WorkerEnv) -> ResumeConfig:
        return cls(
            before_step=env.resume_before_step,
            pretrained_uri=spec.model.pretrained_uri,
            local_rank=env.local_rank,
            cache_dir=env.cache_dir,
        )


@dataclass(frozen=True)
class JobConfig:
    """Every component's config, and the spec they came from (the rank-0 `config` event prints it)."""

    spec: LLMTrainingJobSpec
    job: JobIdentity
    env: WorkerEnv
    seed: int
    max_steps: int
    model: ModelConfig
    optimizer: OptimizerConfig
    data: DataConfig
    checkpoint: CheckpointConfig
    snapshots: SnapshotConfig | None  # spec.checkpoint.memory
    ledger: LedgerConfig
    metrics: MetricsConfig
    resume: ResumeConfig
    gc_every_steps: int = GC_EVERY_STEPS  # garbage.py: collect on every rank before every Nth step

    @classmethod
    def from_spec(cls, spec: LLMTrainingJobSpec, job: JobIdentity, env: WorkerEnv) -> JobConfig:
        model = ModelConfig.from_spec(spec)
        return cls(
            spec=spec,
            job=job,
            env=env,
            seed=spec.training.seed,
            max_steps=spec.training.max_steps,
            model=model,
            optimizer=OptimizerConfig.from_spec(spec),
            data=DataConfig.from_spec(spec, model.dims),
            checkpoint=CheckpointConfig.from_spec(spec, job, env),
            snapshots=snapshot_config(spec, job, env),
            ledger=LedgerConfig.from_env(job, env),
            metrics=MetricsConfig.from_spec(spec, job, env, model.dims),
            resume=ResumeConfig.from_spec(spec, env),
        )
