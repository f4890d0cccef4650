"""The trainer's metrics component: everything it reports, behind one call per event.

Two outputs, both read by the operator and by people:
- Prometheus gauges on every rank (`TrainerMetrics`; rank 0 feeds status.progress, every rank the
  hang and goodput rules), including the attempt-wide ledger's (metrics/restarts.py) and the
  per-step loss facts (losswatch.py);
- one structured JSON line per event on rank 0's stdout (`config`, `rollback`, `resume`,
  `pretrained`, `step`, `stragglers`, `stop`, `end`; the checkpointer emits its own `checkpoint*` events), which
  `llmtrain local`, `kubectl logs` readers and the tests parse.

Per step the trainer makes ONE call, `log(result)`: the throughput/MFU arithmetic, the gauges, the
memory read, the loss watch, the ledger and the step line (about 25 µs of CPU in all:
bench/trainer_overhead.py times each piece).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from llmtrain.pod_contract import RESUME_TIERS

from .losswatch import LossWatch
from .memory import MemoryGauge
from .prometheus import TrainerMetrics
from .restarts import AttemptLedger
from .throughput import SteadyThroughput, Throughput, step_throughput

if TYPE_CHECKING:
    import torch

    from ..job_config import JobConfig, MetricsConfig
    from ..train import StepResult

log = logging.getLogger("llmtrain_trainer")


class MetricsLogger:
    """Reports the trainer's progress: `started`, `rolled_back`, `resumed`, `pretrained`,
    `loop_started`, `log` (every step), `saved`, `stopped`, `ended`; then `write_final_summary`.
    Events go out on rank 0 only."""

    def __init__(
        self,
        cfg: MetricsConfig,
        *,
        rank: int,
        world: int,
        device: torch.device,
        ledger: AttemptLedger,
        restart_count: int,
        emit: Callable[[dict], None],
    ):
        self.cfg = cfg
        self.rank, self.world = rank, world
        self.is_main = rank == 0
        self.emit = emit if self.is_main else (lambda event: None)
        # The job name alone: the scrape adds `namespace`, as for the operator's own metrics.
        self.prom = TrainerMetrics(job=cfg.job.name, rank=rank)
        self.ledger = ledger
        self.restart_count = restart_count
        self.device = device
        self.watch = LossWatch(cfg.loss_spike_window, cfg.loss_spike_factor, cfg.loss_spike_min_steps)
        self.memory: MemoryGauge | None = None
        self.steady = SteadyThroughput()  # the mean the end line and the final summary report
        m = self.prom
        # The attempt so far, when torchrun restarted this worker in place (metrics/restarts.py): the
        # attempt-wide gauges carry on from it, before the first scrape of this process can see them.
        m.export_ledger(ledger, restart_count)
        carried = ledger.state
        if carried.train_start is not None:  # an earlier process of this attempt trained
            m.train_start_timestamp_seconds.set(carried.train_start)
            m.resume_step.set(carried.resume_step or 0)
            m.step.set(carried.high_step)
        m.serve(cfg.port)
        m.hang_timeout_seconds.set(cfg.hang_timeout_seconds)

    @property
    def nonfinite_streak(self) -> int:
        """Consecutive non-finite losses up to the last step (0: the last loss was finite)."""
        return self.watch.streak

    def started(self, job: JobConfig, *, local_world: int, backend: str) -> None:
        """The rank-0 banner (`master_addr=...`, which the AWS runbooks grep for) and `config` event."""
        if not self.is_main:
            log.info("rank=%d pid=%d started", self.rank, os.getpid())
            return
        env, d = job.env, job.data
        print(
            f"master_addr={env.master_addr} master_port={env.master_port} world_size={self.world} "
            f"local_world_size={local_world} backend={backend} device={self.device.type} "
            f"job={job.job.label} attempt={job.job.attempt}",
            flush=True,
        )
        self.emit(
            {
                "event": "config",
                "job": job.job.label,
                "attempt": job.job.attempt,
                "in_place_restarts": max(self.ledger.state.in_place_restarts, self.restart_count),
                "world_size": self.world,
                "device": self.device.type,
                "global_batch_seqs": d.global_batch_seqs,
                "tokens_per_step": d.tokens_per_step,
                "grad_accum": d.global_batch_seqs // (self.world * d.micro_batch_size),
                "dims": job.model.dims.__dict__,
                "spec": job.spec.wire(),
            }
        )

    def rolled_back(self, before_step: int, quarantined: list[str]) -> None:
        self.prom.resumed_before_step.set(before_step)
        self.emit({"event": "rollback", "before_step": before_step, "quarantined": quarantined})

    def resumed(self, step: int, from_world_size: int, seconds: float, tier: str = "durable", moved: int = 0) -> None:
        """Resumed at `step` from `tier`: "durable" (a checkpoint), or "memory" / "partner" (in-memory
        snapshots; `moved` ranks got theirs from another process)."""
        if tier == "durable":
            self.prom.last_checkpoint_step.set(step)
        self.prom.resume_tier.set(RESUME_TIERS.index(tier))
        self.emit(
            {
                "event": "resume",
                "step": step,
                "tier": tier,
                **({"moved_ranks": moved} if tier != "durable" else {}),
                "from_world_size": from_world_size,
                "world_size": self.world,
                "seconds": round(seconds, 3),
            }
        )

    def snapshotted(self, step: int, blocking_seconds: float, nbytes: int) -> None:
        """An in-memory snapshot of `nbytes` (this rank's) blocked training for `blocking_seconds`
        (goodput: checkpointing)."""
        self.emit({"event": "snapshot", "step": step, "blocking_seconds": round(blocking_seconds, 4), "bytes": nbytes})
        self.prom.snapshot_blocking_seconds.inc(blocking_seconds)
        self.prom.last_snapshot_step.set(step)
        self.ledger.snapshotted(blocking_seconds, time.time())
        self.prom.export_ledger(self.ledger, self.restart_count)

    def pretrained(self, uri: str, tensors: int) -> None:
        self.emit({"event": "pretrained", "uri": uri, "tensors": tensors})

    def at_step(self, step: int) -> None:
        """Where training (re)starts: after the resume, before the first step."""
        self.prom.step.set(step)

    def loop_started(self, resumed_step: int) -> None:
        """The training loop begins: the ledger's account of this process starts here."""
        self.memory = MemoryGauge(self.device)
        self.ledger.loop_started(time.time(), resumed_step)
        # the attempt's: the first process's loop start and resume step (this one's after an in-place restart)
        self.prom.resume_step.set(self.ledger.state.resume_step or 0)
        self.prom.train_start_timestamp_seconds.set(self.ledger.state.train_start or 0)

    def log(self, r: StepResult) -> None:
        """One completed optimizer step: gauges, loss facts, ledger, and the rank-0 step line."""
        c = self.cfg
        tokens = c.tokens_per_step
        tp = step_throughput(tokens, r.wall_seconds, self.world, c.dims, c.seq_len, c.peak_flops_per_device)
        self.steady.add(tokens, r.wall_seconds)
        now = time.time()
        m = self.prom
        m.step.set(r.step)
        m.loss.set(r.loss)
        m.tokens_per_second.set(tp.tokens_per_second)
        m.tokens_per_second_per_device.set(tp.tokens_per_second_per_device)
        m.tokens_total.inc(tokens // self.world)  # this rank's share: a sum over ranks is the job's
        m.tflops_per_device.set(tp.tflops_per_device)
        m.mfu.set(tp.mfu)
        m.step_seconds.observe(r.seconds)
        m.data_wait_seconds.observe(r.data_wait)
        assert self.memory is not None, "log() before loop_started()"
        alloc, reserved = self.memory.read()
        m.memory_allocated_bytes.set(alloc)
        m.memory_reserved_bytes.set(reserved)
        self.watch.observe(r.step, r.loss)
        self.watch.export(m)
        m.heartbeat_timestamp_seconds.set(now)
        self.ledger.step(r.step, r.seconds, r.data_wait, now)
        m.export_ledger(self.ledger, self.restart_count)
        if self.is_main:
            gn = r.grad_norm
            assert gn is not None, "log() of a step that did not complete"
            gn = gn.full_tensor() if hasattr(gn, "full_tensor") else gn
            g = c.global_batch_seqs
            self.emit(
                {
                    "event": "step",
                    "step": r.step,
                    "loss": round(r.loss, 6),
                    "lr": r.lr,
                    "grad_norm": round(float(gn), 6),
                    "tokens_per_second": round(tp.tokens_per_second, 2),
                    "tokens_per_second_per_device": round(tp.tokens_per_second_per_device, 2),
                    "tflops_per_device": tp.tflops_per_device,
                    "mfu": tp.mfu,
                    "step_seconds": round(r.seconds, 6),
                    "wall_seconds": round(r.wall_seconds, 6),
                    "data_wait_seconds": round(r.data_wait, 6),
                    **({"allreduce_bytes": r.allreduce_bytes} if r.allreduce_bytes is not None else {}),
                    "sample_start": (r.step - 1) * g,
                    "samples": g,
                    "tokens": tokens,
                    "max_steps": c.max_steps,
                    "time": round(now, 6),
                }
            )

    def stragglers(self, step: int, ranked) -> None:
        """A window's highest straggler scores (rank 0): the series, and a `stragglers` event saying at
        which step the window ended, so the log shows when a rank was first named."""
        self.prom.export_stragglers(ranked)
        self.emit(
            {
                "event": "stragglers",
                "step": step,
                "ranks": [
                    {"rank": s.rank, "node": s.node, "score": round(s.score, 3), "slowdown": round(s.slowdown, 3)}
                    for s in ranked
                ],
            }
        )

    def saved(self, blocking_seconds: float) -> None:
        """A save between steps blocked training for `blocking_seconds`."""
        self.prom.checkpoint_blocking_seconds.inc(blocking_seconds)
        self.ledger.saved(blocking_seconds, time.time())
        self.prom.export_ledger(self.ledger, self.restart_count)

    def stopped(self, step: int, signum: int | None, dropped: int, of: int) -> None:
        """A stop request (SIGTERM/SIGINT on any rank) is being acted on at `step`; `dropped`: the
        micro-batches of the unfinished step given up (0: it stopped between steps)."""
        self.emit(
            {
                "event": "stop",
                "step": step,
                "reason": "signal",
                "signal": signal.Signals(signum).name if signum else "peer",
                **({"dropped_micro_batches": dropped, "of": of} if dropped else {}),
            }
        )

    def steady_throughput(self) -> Throughput | None:
        """This process's steps after its first, as one (SteadyThroughput); None before any step."""
        c = self.cfg
        return self.steady.result(self.world, c.dims, c.seq_len, c.peak_flops_per_device)

    def ended(self, reason: str, step: int, last_checkpoint: int | None) -> None:
        mean = self.steady_throughput()
        self.emit(
            {
                "event": "end",
                "reason": reason,
                "step": step,
                "last_checkpoint": last_checkpoint,
                # the steady means, as the final summary reports them
                **({"tokens_per_second": mean.tokens_per_second, "mfu": mean.mfu} if mean is not None else {}),
            }
        )

    def write_final_summary(self, path: str | None) -> None:
        """The final summary (TrainerMetrics.final_summary, with the steady means) to `path`, which
        llmtrain_trainer.launch makes the container's termination message on a clean exit. Local
        rank 0 of every pod writes it; None (not under the launcher or `llmtrain local`): nothing."""
        if not path:
            return
        mean = self.steady_throughput()
        text = self.prom.final_summary(*((mean.tokens_per_second, mean.mfu) if mean is not None else ()))
        try:
            with open(path, "w") as f:
                f.write(text)
        except OSError as err:  # the operator then keeps its last scrape: not worth failing the run
            log.warning("final summary not written to %s: %s", path, err)

    def close(self) -> None:
        if self.memory is not None:
            self.memory.close()
