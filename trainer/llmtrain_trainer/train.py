"""The training loop that runs in every worker process.

Per step: this rank's micro-batches (gradient accumulation up to the global batch), forward/backward
under FSDP2, gradient clipping, AdamW, then ONE small all-reduce of [loss, stop, save] so that every
rank agrees on the logged loss, on stopping (SIGTERM/SIGINT reached any rank) and on checkpointing
(the time-based interval elapsed on any rank's clock) at the same step — a checkpoint or a stop
decided by one rank alone would deadlock the others in the next collective.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import sys
import time

import torch
import torch.distributed as dist

from llmtrain.catalog import instance_type
from llmtrain.spec import LLMTrainingJobSpec, resolve_dims

from .checkpoint.checkpointer import Checkpointer, auto_interval, init_optimizer_state
from .config import JobIdentity, dumps, global_batch_seqs, lr_at
from .data.loader import DataLoader, open_dataset
from .distributed.parallel import (
    AllReduceCounter,
    build_mesh,
    check_float8_device,
    device_for_rank,
    has_replicas,
    init_distributed,
    parallelize,
)
from .launch import FINAL_SUMMARY_ENV
from .metrics.losswatch import LossWatch
from .metrics.prometheus import TrainerMetrics
from .metrics.restarts import AttemptLedger
from .metrics.throughput import SteadyThroughput, Throughput, step_throughput
from .models.init import init_weights
from .models.llama import Llama, cross_entropy

log = logging.getLogger("llmtrain_trainer")


def emit(event: dict) -> None:
    """One structured line on stdout (rank 0 only calls this for step lines)."""
    sys.stdout.write(dumps(event) + "\n")
    sys.stdout.flush()


class StopFlag:
    """SIGTERM (node drain, spot interruption, torchrun shutting down) or SIGINT: finish the current
    step, checkpoint, exit 0. Handlers only set a flag; the loop acts on it between steps."""

    def __init__(self):
        self.signal: int | None = None
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.signal = signum

    @property
    def set(self) -> bool:
        return self.signal is not None


class _Memory:
    """Allocated/reserved bytes for the memory gauges, read every step: the CUDA allocator's
    counters, or the process RSS on CPU — from /proc/self/statm through a descriptor kept open (an
    open/read/close per step cost ~24 µs of CPU, a pread ~2 µs: bench/trainer_overhead.py)."""

    def __init__(self, device: torch.device):
        self.device = device
        self._fd = os.open("/proc/self/statm", os.O_RDONLY) if device.type != "cuda" else None
        self._page = os.sysconf("SC_PAGE_SIZE")

    def read(self) -> tuple[int, int]:
        if self._fd is None:
            return torch.cuda.memory_allocated(self.device), torch.cuda.memory_reserved(self.device)
        rss = int(os.pread(self._fd, 128, 0).split()[1]) * self._page
        return rss, rss

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def write_final_summary(metrics: TrainerMetrics, steady: Throughput | None) -> None:
    """The final summary (TrainerMetrics.final_summary) to $LLMTRAIN_FINAL_SUMMARY, which
    llmtrain_trainer.launch makes the container's termination message on a clean exit. Local rank 0
    of every pod writes it; unset (not under the launcher or `llmtrain local`), nothing is written."""
    path = os.environ.get(FINAL_SUMMARY_ENV)
    if not path:
        return
    text = metrics.final_summary(*((steady.tokens_per_second, steady.mfu) if steady is not None else ()))
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as err:  # the operator then keeps its last scrape: not worth failing the run
        log.warning("final summary not written to %s: %s", path, err)


def build_optimizer(model: torch.nn.Module, spec: LLMTrainingJobSpec) -> torch.optim.Optimizer:
    """AdamW (β = 0.9, 0.95, as Llama); weight decay on matrices only, not on norm gains."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for p in model.parameters():
        (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": spec.training.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=spec.training.learning_rate, betas=(0.9, 0.95), eps=1e-8, foreach=True)


def _stop_agreed(stop: StopFlag, group) -> bool:
    """Whether any rank was asked to stop (a collective: every rank calls it at the same point)."""
    flag = torch.tensor([float(stop.set)])
    dist.all_reduce(flag, group=group)
    return flag.item() > 0


def run(spec: LLMTrainingJobSpec, job: JobIdentity) -> int:
    stop = StopFlag()
    device = device_for_rank()
    if spec.fsdp.float8:
        check_float8_device(device)  # before joining the job: a clear error, not a failed matmul later
    init_distributed(device, spec.resilience.collective_timeout_minutes)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    is_main = rank == 0
    t = spec.training
    dims = resolve_dims(spec.model)
    seq_len = spec.data.seq_len
    assert seq_len is not None, "unresolved spec: data.seqLen"
    if seq_len > dims.max_seq_len:
        raise ValueError(f"data.seqLen {seq_len} exceeds the model's max_seq_len {dims.max_seq_len}")
    g = global_batch_seqs(spec)
    tokens_per_step = g * seq_len
    peak = instance_type(spec.cluster.instance_type).peak_flops_per_device
    torch.manual_seed(t.seed)

    # The job name alone: the scrape adds `namespace`, as for the operator's own metrics.
    metrics = TrainerMetrics(job=job.name, rank=rank)
    # The attempt so far, when torchrun restarted this worker in place (metrics/restarts.py): the
    # attempt-wide gauges carry on from it, before the first scrape of this process can see them.
    ledger = AttemptLedger.from_env(local_rank, job.attempt)
    restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)
    metrics.export_ledger(ledger, restart_count)
    carried = ledger.state
    if carried.train_start is not None:  # an earlier process of this attempt trained
        metrics.train_start_timestamp_seconds.set(carried.train_start)
        metrics.resume_step.set(carried.resume_step or 0)
        metrics.step.set(carried.high_step)
    metrics.serve(int(os.environ.get("LLMTRAIN_METRICS_PORT", "9410")) + local_rank)
    metrics.hang_timeout_seconds.set(spec.resilience.hang_timeout_minutes * 60)

    if is_main:
        print(
            f"master_addr={os.environ.get('MASTER_ADDR', socket.gethostname())} "
            f"master_port={os.environ.get('MASTER_PORT', '')} world_size={world} "
            f"local_world_size={local_world} backend={dist.get_backend()} device={device.type} "
            f"job={job.label} attempt={job.attempt}",
            flush=True,
        )
        emit(
            {
                "event": "config",
                "job": job.label,
                "attempt": job.attempt,
                "in_place_restarts": max(carried.in_place_restarts, restart_count),
                "world_size": world,
                "device": device.type,
                "global_batch_seqs": g,
                "tokens_per_step": tokens_per_step,
                "grad_accum": g // (world * t.micro_batch_size),
                "dims": dims.__dict__,
                "spec": spec.wire(),
            }
        )
    else:
        log.info("rank=%d pid=%d started", rank, os.getpid())

    # Model: meta → wrapped/sharded → materialised shard by shard.
    mesh = build_mesh(spec.fsdp.sharding_strategy, device.type, world, local_world)
    with torch.device("meta"):
        model = Llama(dims)
    parallelize(model, mesh, spec.fsdp, device)
    model.to_empty(device=device)
    model.init_rope(device)
    optimizer = build_optimizer(model, spec)

    dataset = open_dataset(spec.data.uri, seq_len, t.seed, dims.vocab_size)
    loader = DataLoader(
        dataset, global_batch_seqs=g, dp_rank=rank, dp_size=world, micro_batch=t.micro_batch_size, device=device
    )
    ckpt = Checkpointer(
        spec.checkpoint.uri,
        keep=spec.checkpoint.keep,
        interval_minutes=(spec.checkpoint.fixed_interval_seconds or 0) / 60,
        interval_steps=spec.checkpoint.interval_steps,
        timeout_minutes=spec.resilience.collective_timeout_minutes,
        metrics=metrics,
        emit=emit if is_main else None,
        attempt=job.attempt,
        auto=auto_interval(spec, os.environ, (carried.checkpoint_blocking_seconds, carried.saves)),
    )

    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    def state(step: int) -> dict:
        msd, osd = get_state_dict(model, optimizer)
        return {
            "model": msd,
            "optim": osd,
            "train": {"step": step, "world_size": world, "data": loader.state_dict(), "rng": torch.get_rng_state()},
        }

    step = resumed_step = 0
    t0 = time.time()
    # A loss-spike/NaN rollback decided by the operator: resume from before that step, keeping the
    # checkpoints from it on aside for inspection (checkpoint/checkpointer.py, "Loss-spike rollback").
    before = int(os.environ.get("LLMTRAIN_RESUME_BEFORE_STEP") or 0)
    if before > 0:
        moved = ckpt.quarantine_from(before)
        metrics.resumed_before_step.set(before)
        if is_main:
            emit({"event": "rollback", "before_step": before, "quarantined": moved})

    def empty_state() -> dict:
        # The optimizer state DCP loads into, created directly rather than by get_state_dict's
        # zero-gradient optimizer step (most of a resume's time before: init_optimizer_state).
        init_optimizer_state(optimizer)
        return state(0)

    found = ckpt.resume(empty_state)
    if found is not None:
        latest, sd = found
        set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        torch.set_rng_state(sd["train"]["rng"])
        loader.load_state_dict(sd["train"]["data"])
        step = resumed_step = int(sd["train"]["step"])
        if loader.step != step:
            raise RuntimeError(f"checkpoint {latest}: data position {loader.step} != step {step}")
        metrics.last_checkpoint_step.set(step)
        if is_main:
            emit(
                {
                    "event": "resume",
                    "step": step,
                    "from_world_size": int(sd["train"]["world_size"]),
                    "world_size": world,
                    "seconds": round(time.time() - t0, 3),
                }
            )
    elif spec.model.pretrained_uri:
        # Initial weights only when there is no checkpoint to resume: at 70B, re-reading them on
        # every restart before the checkpoint overwrites them costs ~138 GB of reads per node.
        from .models.pretrained import load_pretrained

        n = load_pretrained(model, spec.model.pretrained_uri)
        if is_main:
            emit({"event": "pretrained", "uri": spec.model.pretrained_uri, "tensors": n})
    else:
        init_weights(model, t.seed)
    metrics.step.set(step)

    params = list(model.parameters())
    # fp16 has 5 exponent bits: without loss scaling small gradients underflow to zero. The sharded
    # scaler all-reduces "found inf" so every rank skips the same steps. (bf16 needs no scaling.)
    scaler = None
    if spec.fsdp.mixed_precision == "fp16":
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        scaler = ShardedGradScaler(device=device.type)
    accum = g // (world * t.micro_batch_size)
    # NO_SHARD / HYBRID_SHARD: all-reduce gradients across replicas (nodes) once per step, on the
    # last micro-batch, not once per micro-batch; earlier micro-batches accumulate locally.
    replicas = has_replicas(spec.fsdp.sharding_strategy)
    allreduce = AllReduceCounter(model) if replicas else None
    # A stop request is acted on at the next micro-batch boundary, not only after the whole step
    # (~37 s at 70B on 16 nodes): the partial step is dropped and the last completed step saved.
    # Agreeing needs a collective on every boundary; a 1-float gloo all-reduce on its own group
    # (never the GPU stream, never the checkpoint thread's group) costs well under a millisecond.
    control = dist.new_group(backend="gloo") if accum > 1 else None
    r = spec.resilience
    watch = LossWatch(r.loss_spike_window, r.loss_spike_factor, r.loss_spike_min_steps)
    memory = _Memory(device)
    steady = SteadyThroughput()
    reason = "finished"
    ledger.loop_started(time.time(), resumed_step)
    # the attempt's: the first process's loop start and resume step (this one's after an in-place restart)
    metrics.resume_step.set(ledger.state.resume_step or 0)
    metrics.train_start_timestamp_seconds.set(ledger.state.train_start or 0)
    try:
        while step < t.max_steps:
            t0 = time.perf_counter()
            lr = lr_at(step + 1, t)
            for group in optimizer.param_groups:
                group["lr"] = lr
            micro = loader.next()
            loss_sum = torch.zeros((), device=device)
            for i, (x, y) in enumerate(micro):
                if replicas and accum > 1:
                    model.set_requires_all_reduce(i == len(micro) - 1)
                loss = cross_entropy(model(x), y) / accum
                (scaler.scale(loss) if scaler else loss).backward()
                loss_sum += loss.detach()
                if control is not None and i < len(micro) - 1 and _stop_agreed(stop, control):
                    dropped = i + 1
                    break
            else:
                dropped = 0
            if dropped:
                optimizer.zero_grad(set_to_none=True)
                loader.rewind()
                reason = "signal"
                if is_main:
                    emit(
                        {
                            "event": "stop",
                            "step": step,
                            "reason": "signal",
                            "signal": signal.Signals(stop.signal).name if stop.signal else "peer",
                            "dropped_micro_batches": dropped,
                            "of": accum,
                        }
                    )
                break
            if scaler:
                scaler.unscale_(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(
                params, t.grad_clip if t.grad_clip > 0 else float("inf"), foreach=True
            )
            if scaler:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            # [loss, stop, save]: one host→device copy of the two flags, the loss added on device.
            flags = torch.tensor([0.0, float(stop.set), float(ckpt.due(step))], device=device)
            flags[0] += loss_sum
            dist.all_reduce(flags)
            loss_v, stop_v, save_v = flags.tolist()
            loss_v /= world
            dt_ = time.perf_counter() - t0

            tp = step_throughput(tokens_per_step, dt_, world, dims, seq_len, peak)
            steady.add(tokens_per_step, dt_)
            now = time.time()
            metrics.step.set(step)
            metrics.loss.set(loss_v)
            metrics.tokens_per_second.set(tp.tokens_per_second)
            metrics.tokens_total.inc(tokens_per_step // world)  # this rank's share: a sum over ranks is the job's
            metrics.tflops_per_device.set(tp.tflops_per_device)
            metrics.mfu.set(tp.mfu)
            metrics.step_seconds.observe(dt_)
            metrics.data_wait_seconds.observe(loader.last_wait)
            alloc, reserved = memory.read()
            metrics.memory_allocated_bytes.set(alloc)
            metrics.memory_reserved_bytes.set(reserved)
            watch.observe(step, loss_v)
            watch.export(metrics)
            metrics.heartbeat_timestamp_seconds.set(now)
            ledger.step(step, dt_, loader.last_wait, now)
            metrics.export_ledger(ledger, restart_count)
            if is_main:
                gn = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
                emit(
                    {
                        "event": "step",
                        "step": step,
                        "loss": round(loss_v, 6),
                        "lr": lr,
                        "grad_norm": round(float(gn), 6),
                        "tokens_per_second": round(tp.tokens_per_second, 2),
                        "tflops_per_device": tp.tflops_per_device,
                        "mfu": tp.mfu,
                        "step_seconds": round(dt_, 6),
                        "data_wait_seconds": round(loader.last_wait, 6),
                        **({"allreduce_bytes": allreduce.take()} if allreduce else {}),
                        "sample_start": (step - 1) * g,
                        "samples": g,
                        "tokens": tokens_per_step,
                        "max_steps": t.max_steps,
                        "time": round(now, 6),
                    }
                )

            if stop_v > 0:
                reason = "signal"
                if is_main:
                    emit(
                        {
                            "event": "stop",
                            "step": step,
                            "reason": "signal",
                            "signal": signal.Signals(stop.signal).name if stop.signal else "peer",
                        }
                    )
                break
            # Never checkpoint a NaN/Inf state (every rank sees the same all-reduced loss, so all
            # skip together): a restart must find a checkpoint from before the loss went bad.
            if save_v > 0 and step < t.max_steps and ckpt.enabled and math.isfinite(loss_v):
                blocked = time.perf_counter()
                ckpt.save(step, state(step))
                blocking = time.perf_counter() - blocked
                metrics.checkpoint_blocking_seconds.inc(blocking)
                ckpt.saved(blocking)  # intervalMinutes auto: the next interval follows it
                ledger.saved(blocking, time.time())
                metrics.export_ledger(ledger, restart_count)
        ckpt.wait()
        if watch.streak:
            log.error(
                "the loss of the final step %d is not finite: no final checkpoint (the newest is %s)",
                step,
                ckpt.last_committed,
            )
        if ckpt.enabled and ckpt.last_committed != step and not watch.streak:
            # End of training or a stop request: save synchronously, it's the last thing we do
            # (also when the background save of this very step failed).
            ckpt.save(step, state(step), blocking=True)
    finally:
        loader.close()
        memory.close()
    mean = steady.result(world, dims, seq_len, peak)
    if is_main:
        emit(
            {
                "event": "end",
                "reason": reason,
                "step": step,
                "last_checkpoint": ckpt.last_committed,
                # the steady means (SteadyThroughput), as the final summary reports them
                **({"tokens_per_second": mean.tokens_per_second, "mfu": mean.mfu} if mean is not None else {}),
            }
        )
    ckpt.close()
    dist.destroy_process_group()
    if ckpt.enabled and ckpt.last_committed != step and not watch.streak:
        log.error("the checkpoint of the final step %d failed; the newest checkpoint is %s", step, ckpt.last_committed)
        return 1
    if local_rank == 0:
        write_final_summary(metrics, mean)
    return 0
