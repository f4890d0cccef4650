"""The training loop that runs in every worker process: `run` builds a `Trainer` and trains.

Per step: this rank's micro-batches (gradient accumulation up to the global batch), forward/backward
under FSDP2, gradient clipping, AdamW, then a gloo all-reduce of the CPU flags [stop, save] so that
every rank agrees on stopping (SIGTERM/SIGINT reached any rank; stopping.py) and on checkpointing
(the time-based interval elapsed on any rank's clock) at the same step — a checkpoint or a stop
decided by one rank alone would deadlock the others in the next collective — and an all-reduce of
the loss on the device, read when the step is logged: after the next step is queued, unless this
step stops, saves or ends training (no per-step host sync; `train`).

The trainer is a handful of components, each built from its own config (job_config.py): the model
(distributed/parallel.py), the optimizer (optimizer.py), the data loader (data/loader.py), the
checkpointer (checkpoint/checkpointer.py), the metrics (metrics/logger.py) and the attempt's ledger
(metrics/restarts.py). `Trainer` wires them and does one thing per method:

    build    (the constructor) the components, in an order every rank shares
    resume   rollback, then the newest checkpoint that loads, or pretrained weights, or a fresh init
    step     one optimizer step → StepResult (the agreed stop/save flags; the loss read when logged)
    log      that step's metrics and step line
    save     a periodic checkpoint, when every rank agreed one is due
    stop     the one way out of the loop: say why, wait for the save in flight, save the final state
    train    the loop over the above; returns the process's exit code

Python's automatic garbage collection is off while the loop runs: every rank collects at the same
steps instead (garbage.py).
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from llmtrain.spec import LLMTrainingJobSpec

from .checkpoint.checkpointer import Checkpointer, init_optimizer_state
from .checkpoint.snapshots import Snapshotter
from .config import JobIdentity, WorkerEnv, dumps
from .data.loader import DataLoader, open_dataset
from .distributed.parallel import (
    AllReduceCounter,
    build_mesh,
    check_float8_device,
    device_for_rank,
    float8_all_gather,
    has_replicas,
    init_distributed,
    parallelize,
    precompute_float8_scales,
)
from .garbage import GarbageCollection
from .job_config import JobConfig, OptimizerConfig
from .metrics.logger import MetricsLogger
from .metrics.restarts import AttemptLedger
from .metrics.stragglers import StragglerWindow, step_clocks, test_slowness, time_fsdp_collectives
from .models.init import init_weights
from .models.llama import Llama, cross_entropy
from .optimizer import Implementation, clip_grad_norm
from .optimizer import build_optimizer as _build_optimizer
from .stopping import StopFlag

log = logging.getLogger("llmtrain_trainer")

Emit = Callable[[dict], None]


def emit(event: dict) -> None:
    """One structured line on stdout (rank 0 only calls this for step lines)."""
    sys.stdout.write(dumps(event) + "\n")
    sys.stdout.flush()


def build_optimizer(
    model: torch.nn.Module, spec: LLMTrainingJobSpec, implementation: Implementation | None = None
) -> torch.optim.Optimizer:
    """The trainer's optimizer for `spec` (optimizer.py), for loops outside the trainer: the
    single-process reference of the tests, the benches' minimal loop."""
    return _build_optimizer(model, OptimizerConfig.from_spec(spec), implementation)


@dataclass
class StepResult:
    """What one call of `Trainer.step` did. `dropped` > 0: a stop was agreed between micro-batches and
    the step was given up after that many (no optimizer step; `step` is the last completed one).

    The loss stays on the device, all-reduced, until `loss` is read (a host sync): the training loop
    reads it when it logs the step, after the next step's work is queued."""

    step: int
    lr: float
    loss_sum: torch.Tensor | None = None  # sum over the ranks of their mean losses (all-reduced, on device)
    world: int = 1
    grad_norm: torch.Tensor | None = None  # before clipping; read on rank 0 only (log)
    # The step's time: since the previous step ended (or, outside the loop, since this one started),
    # less any checkpoint blocking in between (the goodput ledger counts that separately).
    seconds: float = 0.0
    # Since the previous step ended (or the loop started): the step, plus what ran between the two
    # steps — the previous step's logging and its checkpoint's blocking part. Throughput and MFU use
    # it, so a checkpoint's cost shows in them (on the step after it); `seconds` excludes it.
    wall_seconds: float = 0.0
    data_wait: float = 0.0  # of which waiting for this step's batch
    # The straggler score's inputs (metrics/stragglers.py): this step's own time, from its start to the
    # agreement (nothing of what ran between steps, such as a window's exchange), and the part of it
    # this rank spent waiting in collectives. Taken in `step`, since the step is logged one step late.
    own_seconds: float = 0.0
    wait_seconds: float = 0.0
    stop: bool = False  # some rank was asked to stop
    save: bool = False  # some rank's checkpoint interval elapsed
    snapshot: bool = False  # some rank's in-memory snapshot is due (spec.checkpoint.memory), none busy
    snapshot_skipped: bool = False  # one was due, but some rank's previous one is still being swapped
    dropped: int = 0
    allreduce_bytes: int | None = None  # NO_SHARD / HYBRID_SHARD: gradient bytes all-reduced across replicas

    @property
    def completed(self) -> bool:
        return not self.dropped

    @property
    def loss(self) -> float:
        """Mean over the global batch (NaN for a dropped step). Reading it waits for the device."""
        if self.loss_sum is None:
            return math.nan
        if not hasattr(self, "_loss"):
            self._loss = float(self.loss_sum) / self.world
        return self._loss


class Trainer:
    """One worker's training: built from a `JobConfig` inside an initialised process group."""

    def __init__(self, cfg: JobConfig, *, device: torch.device, stop: StopFlag, emit: Emit = emit):
        self.cfg, self.device, self.stop_flag = cfg, device, stop
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.local_world = cfg.env.local_world_size or self.world
        torch.manual_seed(cfg.seed)

        self.ledger = AttemptLedger.open(cfg.ledger)
        self.metrics = MetricsLogger(
            cfg.metrics,
            rank=self.rank,
            world=self.world,
            device=device,
            ledger=self.ledger,
            restart_count=cfg.env.restart_count,
            emit=emit,
        )
        self.metrics.started(cfg, local_world=self.local_world, backend=dist.get_backend())
        self.model = self._build_model()
        self.optimizer = _build_optimizer(self.model, cfg.optimizer, fp16_scaler=cfg.model.fp16)
        d = cfg.data
        self.loader = DataLoader(
            open_dataset(d.uri, d.seq_len, d.seed, d.vocab_size),
            global_batch_seqs=d.global_batch_seqs,
            dp_rank=self.rank,
            dp_size=self.world,
            micro_batch=d.micro_batch_size,
            device=device,
        )
        carried = self.ledger.state
        self.checkpointer = Checkpointer(
            cfg.checkpoint,
            metrics=self.metrics.prom,
            emit=emit if self.rank == 0 else None,
            carried=(carried.checkpoint_blocking_seconds, carried.saves),
        )
        self.snapshots = (
            Snapshotter(cfg.snapshots, local_world=self.local_world, emit=emit if self.rank == 0 else None)
            if cfg.snapshots is not None
            else None
        )
        self._build_step()
        self.step_no = 0
        self.resumed_step = 0
        self._last_step_end: float | None = None  # perf_counter; None before the loop starts
        self._blocked = 0.0  # checkpoint blocking since the last step ended

    def _build_model(self) -> torch.nn.Module:
        """Meta → wrapped/sharded → materialised shard by shard (the weights come in `resume`)."""
        m = self.cfg.model
        mesh = build_mesh(m.fsdp.sharding_strategy, self.device.type, self.world, self.local_world)
        with torch.device("meta"):
            model = Llama(m.dims)
        parallelize(model, mesh, m.fsdp, self.device)
        # float8 weights all-gathered in float8: their scales are computed once per step (`step`).
        self.float8_scales = m.fsdp.float8 and float8_all_gather(mesh)
        model.to_empty(device=self.device)
        model.init_rope(self.device)
        return model

    def _build_step(self) -> None:
        """What the step needs beyond the model and optimizer: the loss, the fp16 scaler, gradient
        accumulation and replica all-reduce, the stop-agreement group."""
        d = self.cfg.data
        self.loss_fn = cross_entropy
        self.params = list(self.model.parameters())
        # fp16 has 5 exponent bits: without loss scaling small gradients underflow to zero. The sharded
        # scaler all-reduces "found inf" so every rank skips the same steps. (bf16 needs no scaling.)
        self.scaler = None
        if self.cfg.model.fp16:
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            self.scaler = ShardedGradScaler(device=self.device.type)
        self.accum = d.global_batch_seqs // (self.world * d.micro_batch_size)
        # NO_SHARD / HYBRID_SHARD: all-reduce gradients across replicas (nodes) once per step, on the
        # last micro-batch, not once per micro-batch; earlier micro-batches accumulate locally.
        self.replicas = has_replicas(self.cfg.model.fsdp.sharding_strategy)
        self.allreduce = AllReduceCounter(self.model) if self.replicas else None
        # The ranks agree on stopping and saving through gloo all-reduces of CPU flags on their own
        # group (never the GPU stream, never the checkpoint thread's group; well under a millisecond):
        # after each step, and, with gradient accumulation, at every micro-batch boundary (a stop
        # request is acted on there, not only after the whole step — ~37 s at 70B on 16 nodes — the
        # partial step dropped and the last completed step saved). Neither waits for the device.
        self.control = dist.new_group(backend="gloo")
        # Stragglers (metrics/stragglers.py): the seconds this rank waits in collectives, FSDP2's and
        # the step's agreement all-reduce below; (compute, wait) exchanged every window. On CPU the
        # host's clock, where gloo blocks; on CUDA, where NCCL does not block the host, CUDA events
        # on the device's timeline, read one window late (no per-step host sync).
        self.waits, self.device_steps = step_clocks(self.device)
        time_fsdp_collectives(self.model, self.waits)
        self.stragglers = StragglerWindow(self.cfg.env.node_name, device=self.device, device_steps=self.device_steps)
        self.slow = test_slowness(self.rank, self.cfg.env.test_slow_rank or "")

    # -- checkpoint state ------------------------------------------------------------------------

    def state_dict(self, step: int) -> dict:
        """What a checkpoint holds: model, optimizer, and the step, world size, data position and RNG."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(self.model, self.optimizer)
        return {
            "model": msd,
            "optim": osd,
            "train": {
                "step": step,
                "world_size": self.world,
                "data": self.loader.state_dict(),
                "rng": torch.get_rng_state(),
            },
        }

    def _empty_state(self) -> dict:
        # The optimizer state DCP loads into, created directly rather than by get_state_dict's
        # zero-gradient optimizer step (most of a resume's time before: init_optimizer_state).
        init_optimizer_state(self.optimizer)
        return self.state_dict(0)

    def load_state_dict(self, sd: dict, where: int) -> int:
        """Hand a loaded checkpoint (`where`: its step) to the model, optimizer, RNG and data; its step."""
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(self.model, self.optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        torch.set_rng_state(sd["train"]["rng"])
        self.loader.load_state_dict(sd["train"]["data"])
        step = int(sd["train"]["step"])
        if self.loader.step != step:
            raise RuntimeError(f"checkpoint {where}: data position {self.loader.step} != step {step}")
        return step

    # -- the five verbs --------------------------------------------------------------------------

    def resume(self) -> int:
        """Where this attempt starts; returns that step. A loss-spike rollback decided by the operator
        first sets aside the checkpoints from its step on (checkpoint/checkpointer.py, "Loss-spike
        rollback"); then the newest checkpoint that loads, else the pretrained weights — only when
        there is no checkpoint: at 70B, re-reading them on every restart before the checkpoint
        overwrites them costs ~138 GB of reads per node — else a fresh initialisation."""
        r, ckpt = self.cfg.resume, self.checkpointer
        t0 = time.time()
        if r.before_step > 0:
            self.metrics.rolled_back(r.before_step, ckpt.quarantine_from(r.before_step))
        # In-memory snapshots first (checkpoint/snapshots.py), when one newer than the newest durable
        # checkpoint is whole somewhere; never after a rollback, which wants an older state.
        memory = None
        if self.snapshots is not None and r.before_step == 0:
            memory = self.snapshots.restore(self._empty_state, newer_than=ckpt.latest())
        found = ckpt.resume(self._empty_state) if memory is None else None
        step = 0
        if memory is not None:
            choice, sd = memory
            step = self.load_state_dict(sd, choice.step)
            tier = "partner" if choice.moved else "memory"
            self.metrics.resumed(step, self.world, time.time() - t0, tier=tier, moved=choice.moved)
        elif found is not None:
            latest, sd = found
            step = self.load_state_dict(sd, latest)
            self.metrics.resumed(step, int(sd["train"]["world_size"]), time.time() - t0)
        elif r.pretrained_uri:
            from .models.pretrained import load_pretrained

            n = load_pretrained(self.model, r.pretrained_uri, local_rank=r.local_rank, cache_dir=r.cache_dir)
            self.metrics.pretrained(r.pretrained_uri, n)
        else:
            init_weights(self.model, self.cfg.model.seed)
        self.step_no = self.resumed_step = step
        self.metrics.at_step(step)
        return step

    def step(self) -> StepResult:
        """One optimizer step over this rank's micro-batches, then the agreement all-reduce."""
        t0 = time.perf_counter()
        if self.device_steps is not None:
            self.device_steps.begin()
        if self.slow:
            time.sleep(self.slow)  # the test-only slow hook (metrics/stragglers.py): a slower device
        model, opt, stop = self.model, self.optimizer, self.stop_flag
        lr = self.cfg.optimizer.lr_at(self.step_no + 1)
        for group in opt.param_groups:
            group["lr"] = lr
        micro = self.loader.next()
        loss_sum = torch.zeros((), device=self.device)
        last = len(micro) - 1
        for i, (x, y) in enumerate(micro):
            if self.replicas and self.accum > 1:
                model.set_requires_all_reduce(i == last)
            loss = self.loss_fn(model(x), y) / self.accum
            (self.scaler.scale(loss) if self.scaler else loss).backward()
            loss_sum += loss.detach()
            if self.accum > 1 and i < last and stop.agreed(self.control):
                opt.zero_grad(set_to_none=True)
                self.loader.rewind()
                return StepResult(step=self.step_no, lr=lr, stop=True, dropped=i + 1)
        if self.scaler:
            self.scaler.unscale_(opt)
        grad_norm = clip_grad_norm(self.params, self.cfg.optimizer)
        if self.scaler:
            self.scaler.step(opt)
            self.scaler.update()
        else:
            opt.step()
        if self.float8_scales:
            precompute_float8_scales(model)
        opt.zero_grad(set_to_none=True)
        self.step_no += 1
        # [stop, save]: CPU flags, agreed on the gloo group; the loss is all-reduced on the device and
        # read only when the step is logged, so the host does not wait for the device here and can
        # queue the next step while this one runs (no per-step host sync). Both are waits for the
        # straggler score (metrics/stragglers.py): a rank that arrives first waits here for the others.
        snap = self.snapshots is not None and self.snapshots.due(self.step_no)
        busy = self.snapshots is not None and self.snapshots.busy()
        flags = torch.tensor([float(stop.set), float(self.checkpointer.due(self.step_no)), float(snap), float(busy)])
        with self.waits.timed():
            dist.all_reduce(flags, group=self.control)
            dist.all_reduce(loss_sum)
        if self.device_steps is not None:
            self.device_steps.end()
        stop_v, save_v, snap_v, busy_v = flags.tolist()
        end = time.perf_counter()
        since = t0 if self._last_step_end is None else self._last_step_end
        self._last_step_end = end
        blocked, self._blocked = self._blocked, 0.0
        return StepResult(
            step=self.step_no,
            lr=lr,
            loss_sum=loss_sum,
            world=self.world,
            grad_norm=grad_norm,
            seconds=end - since - blocked,
            wall_seconds=end - since,
            own_seconds=end - t0,
            wait_seconds=self.waits.take(),
            data_wait=self.loader.last_wait,
            stop=stop_v > 0,
            save=save_v > 0,
            snapshot=snap_v > 0 and busy_v == 0,
            snapshot_skipped=snap_v > 0 and busy_v > 0,
            allreduce_bytes=self.allreduce.take() if self.allreduce else None,
        )

    def log(self, result: StepResult) -> None:
        self.metrics.log(result)
        # every rank, every completed step: the window's end is a collective (the same step everywhere)
        top = self.stragglers.add(result.own_seconds, result.wait_seconds)
        if top is not None:
            self.metrics.stragglers(result.step, top)

    def save(self, result: StepResult) -> None:
        """The periodic checkpoint every rank agreed on. Never of a NaN/Inf state (every rank sees
        the same all-reduced loss, so all skip together): a restart must find a checkpoint from
        before the loss went bad; never of the last step (`stop` saves that one, blocking)."""
        ckpt = self.checkpointer
        if not (result.save and result.step < self.cfg.max_steps and ckpt.enabled and math.isfinite(result.loss)):
            return
        blocked = time.perf_counter()
        ckpt.save(result.step, self.state_dict(result.step))
        blocking = time.perf_counter() - blocked
        self._blocked += blocking
        ckpt.saved(blocking)  # intervalMinutes auto: the next interval follows it
        self.metrics.saved(blocking)

    def snapshot(self, result: StepResult) -> None:
        """The in-memory snapshot every rank agreed on: as `save`, never of a NaN/Inf state nor of
        the last step; training waits only for the copy into the snapshot folder."""
        snaps = self.snapshots
        if snaps is not None and result.snapshot_skipped:
            snaps.skipped(result.step)
        if snaps is None or not (result.snapshot and result.step < self.cfg.max_steps and math.isfinite(result.loss)):
            return
        blocking = snaps.take(result.step, self.state_dict(result.step))
        self._blocked += blocking
        self.metrics.snapshotted(result.step, blocking, snaps.nbytes)

    def stop(self, result: StepResult | None) -> None:
        """The one way out of the loop: `result` is the step a stop was agreed at (None: training
        reached maxSteps). Says so, waits for the save in flight, and saves the final state
        synchronously — it is the last thing this process does (also when the background save of
        this very step failed) — unless the loss is not finite."""
        ckpt, step = self.checkpointer, self.step_no
        if result is not None:
            self.metrics.stopped(step, self.stop_flag.signal, result.dropped, self.accum)
        ckpt.wait()
        if self.metrics.nonfinite_streak:
            log.error(
                "the loss of the final step %d is not finite: no final checkpoint (the newest is %s)",
                step,
                ckpt.last_committed,
            )
        elif ckpt.enabled and ckpt.last_committed != step:
            ckpt.save(step, self.state_dict(step), blocking=True)

    def train(self) -> int:
        """Steps until maxSteps or an agreed stop; then the final checkpoint. 0, or 1 when the final
        checkpoint failed (the newest one is older than the last step)."""
        self.metrics.loop_started(self.resumed_step)
        self._last_step_end = time.perf_counter()
        collector = GarbageCollection(self.cfg.gc_every_steps)
        self.waits.take()  # the resume's collectives are no step's
        stopped: StepResult | None = None
        # A completed step whose loss is read and logged once the next step is queued: the host never
        # waits for the device between steps. A step that stops, saves or ends training is logged at
        # once (its loss decides whether it may be saved), so stopping and saving happen at the same
        # steps as with a per-step sync; the other steps' lines, metrics and health facts (non-finite
        # loss, loss spike) come one step later.
        pending: StepResult | None = None
        try:
            while self.step_no < self.cfg.max_steps:
                collector.step(self.step_no + 1)
                result = self.step()
                if pending is not None:
                    self.log(pending)
                    pending = None
                if not result.completed:
                    stopped = result
                    break
                if not (
                    result.stop
                    or result.save
                    or result.snapshot
                    or result.snapshot_skipped
                    or result.step >= self.cfg.max_steps
                ):
                    pending = result
                    continue
                self.log(result)
                if result.stop:
                    stopped = result
                    break
                self.snapshot(result)
                self.save(result)
            self.stop(stopped)
        finally:
            collector.close()
            self.loader.close()
            self.metrics.close()
        ckpt, step = self.checkpointer, self.step_no
        self.metrics.ended("signal" if stopped else "finished", step, ckpt.last_committed)
        ckpt.close()
        if self.snapshots is not None:
            self.snapshots.close()
        if ckpt.enabled and ckpt.last_committed != step and not self.metrics.nonfinite_streak:
            log.error(
                "the checkpoint of the final step %d failed; the newest checkpoint is %s", step, ckpt.last_committed
            )
            return 1
        if self.cfg.env.local_rank == 0:
            self.metrics.write_final_summary(self.cfg.env.final_summary)
        return 0


def run(spec: LLMTrainingJobSpec, job: JobIdentity, *, env: WorkerEnv | None = None, emit: Emit = emit) -> int:
    """A worker's whole life: join the job, build the trainer, resume, train, leave. The exit code."""
    env = WorkerEnv.from_environ() if env is None else env
    stop = StopFlag()
    device = device_for_rank(env.local_rank)
    if spec.fsdp.float8:
        check_float8_device(device)  # before joining the job: a clear error, not a failed matmul later
    init_distributed(device, spec.resilience.collective_timeout_minutes)
    trainer = Trainer(JobConfig.from_spec(spec, job, env), device=device, stop=stop, emit=emit)
    trainer.resume()
    rc = trainer.train()
    stop.done()
    dist.destroy_process_group()
    return rc
