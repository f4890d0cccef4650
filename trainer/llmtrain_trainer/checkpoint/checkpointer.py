"""Sharded, asynchronous, atomic checkpoints with `torch.distributed.checkpoint` (DCP).

What is saved: the model and optimizer state dicts as DTensors (each rank writes only its shard), the
step, the data position (samples consumed), and the RNG state. DCP stores the global shape and the
offset of every shard, so a checkpoint written by N ranks loads on M ranks under any sharding
strategy (resharding happens at load time).

Where and how a checkpoint is written, committed and read back (the layout, atomic commits, S3
fencing by attempt, ranged S3 loads): stores.py, on the storage layer (llmtrain_trainer/storage).
The newest `keep` complete checkpoints are kept; older ones and leftovers of interrupted saves are
deleted (rank 0).

Loss-spike rollback (LLMTRAIN_RESUME_BEFORE_STEP=S, set by the operator): the attempt resumes from
the newest complete checkpoint with step < S; rank 0 first moves every complete checkpoint with
step >= S to `quarantine/step-N/` (`.2`, `.3`... if that name is taken), where neither resume,
retention nor the clean-up of partial saves ever looks, so they stay for inspection and the new
attempt can write those step numbers again. Deleting them is the user's decision.

Asynchrony: `dcp.async_save` first copies the state to host memory (the only part training waits
for: a device→host copy of this rank's shard, into host buffers reused by every save, pinned on a
GPU: staging.py), then writes/uploads in a background thread over a dedicated gloo process group,
so its collectives never interleave with the training collectives of the default group. One save
is in flight at a time; the next one, or the end of training, waits for it.
"""

from __future__ import annotations

import datetime as dt
import gc
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from llmtrain import cadence
from llmtrain.cadence import AutoInterval

from .safety import RecordLoadPlanner, UnsafeCheckpoint, refusal
from .staging import open_stager
from .stores import open_store, step_name

if TYPE_CHECKING:  # job_config builds CheckpointConfig.auto with auto_interval, from here
    from ..job_config import CheckpointConfig

# DCP reports a failed save/load as CheckpointException, which derives from BaseException (not
# Exception): catch it explicitly, or one full disk ends the training run at the next save.
SAVE_ERRORS = (Exception, CheckpointException)

log = logging.getLogger(__name__)


def _short(err: BaseException) -> str:
    """One line for a (possibly multi-rank) checkpoint error: the root causes, not DCP's traceback."""
    failures = getattr(err, "failures", None) or getattr(err, "_failures", None)
    if isinstance(failures, dict) and failures:
        causes: dict[str, list[int]] = {}
        for rank, f in sorted(failures.items()):
            exc = f[0] if isinstance(f, tuple) else f
            causes.setdefault(f"{type(exc).__name__}: {exc}".rstrip(": "), []).append(rank)
        return "; ".join(f"{msg} (rank {','.join(map(str, ranks))})" for msg, ranks in causes.items())
    return f"{type(err).__name__}: {err}".rstrip(": ")


def init_optimizer_state(optimizer) -> None:
    """Give every parameter the optimizer state a load fills in, without an optimizer step.

    DCP loads in place, so the optimizer state must exist before `dcp.load`. torch's
    `get_state_dict` creates it by running a whole optimizer step on zero gradients
    (`_init_optim_state`): on FSDP2's DTensors that is ~20 dispatched ops per parameter, and it was
    ~2 of the 2.8 s a 0.28 GB resume took on 2 CPU processes (bench/checkpoint_bandwidth.py).
    For Adam/AdamW (the trainer's optimizer) this creates exactly the tensors `Adam._init_group`
    creates on the first step (same keys, dtypes, devices, placements, zero values), directly;
    any other optimizer falls back to torch's step-based initialisation.
    """
    import torch
    from torch.distributed.checkpoint.state_dict import _init_optim_state
    from torch.optim.optimizer import _get_scalar_dtype

    if optimizer.state:
        return
    if type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW):
        _init_optim_state(optimizer)
        return
    for group in optimizer.param_groups:
        on_device = group["capturable"] or group["fused"]
        for p in group["params"]:
            if not p.requires_grad:
                continue
            st = optimizer.state[p]
            # Adam._init_group: `step` lives on the host unless capturable/fused.
            st["step"] = (
                torch.zeros((), dtype=_get_scalar_dtype(is_fused=group["fused"]), device=p.device)
                if on_device
                else torch.tensor(0.0, dtype=_get_scalar_dtype(), device="cpu")
            )
            st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            if group["amsgrad"]:
                st["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def load_checked(state: dict[str, Any], reader, **kwargs) -> None:
    """`dcp.load` through the trainer's reader and `RecordLoadPlanner` (no unrestricted unpickler
    anywhere); a refusal on any rank is raised as that UnsafeCheckpoint, not DCP's wrapper. Every
    rank reads `.metadata` and every non-tensor record itself, and DCP gathers the failures of
    the others, so all ranks raise it."""
    try:
        dcp.load(state, storage_reader=reader, planner=RecordLoadPlanner(), **kwargs)
    except SAVE_ERRORS as err:
        refused = reader.refused or refusal(err)
        if refused is not None:
            raise refused from None
        raise


def _positive(env: Mapping[str, str], name: str) -> float | None:
    try:
        value = float(env.get(name) or "")
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def auto_interval(spec, env: Mapping[str, str], carried: tuple[float, int] = (0.0, 0)) -> AutoInterval | None:
    """intervalMinutes auto: the job's MTBF and the blocking cost to start from, as the operator
    rendered them (LLMTRAIN_CHECKPOINT_MTBF_SECONDS: from the failures it has seen on the instance
    type; LLMTRAIN_CHECKPOINT_BLOCKING_SECONDS: the previous attempt's measurement or the planner's
    estimate), else (a local run) the Llama 3 prior and the planner's estimate. `carried`: the
    blocking seconds and saves of this attempt's earlier processes (an in-place restart: the
    ledger), whose mean is measured and replaces the estimate. None unless auto."""
    if not spec.checkpoint.auto or not spec.checkpoint.uri:
        return None
    from llmtrain.catalog import instance_type
    from llmtrain.planner import checkpoint_blocking_estimate, plan_job

    mtbf = _positive(env, cadence.MTBF_ENV)
    if mtbf is None or mtbf == 0:
        inst = instance_type(spec.cluster.instance_type)
        mtbf = cadence.node_mtbf(inst.name, inst.gpus_per_node).job_seconds(spec.cluster.nodes)
    blocking = _positive(env, cadence.BLOCKING_ENV)
    if blocking is None:
        blocking = checkpoint_blocking_estimate(plan_job(spec))
    return carry_measured(AutoInterval(mtbf, blocking), carried)


def carry_measured(auto: AutoInterval | None, carried: tuple[float, int]) -> AutoInterval | None:
    """`auto` (a copy: the checkpointer's own), or, when this attempt's earlier processes measured
    saves (`carried`: their blocking seconds and count), the same MTBF with their mean blocking cost."""
    if auto is None:
        return None
    total, saves = carried
    if saves > 0 and math.isfinite(total) and total >= 0:
        return AutoInterval(auto.mtbf_seconds, total / saves, measured_saves=saves)
    return AutoInterval(auto.mtbf_seconds, auto.blocking_seconds, auto.measured_saves)


# ----------------------------------------------------------------------------------------------


class _Once:
    """Call ``fn`` once, whoever calls first; a second caller returns only after the first call
    is complete (an async save is booked by its future's callback or by `wait`, not both)."""

    def __init__(self, fn: Callable[[Any], None]):
        self.fn, self.lock, self.ran = fn, threading.Lock(), False

    def __call__(self, arg: Any) -> None:
        with self.lock:
            if not self.ran:
                self.ran = True
                self.fn(arg)


class Checkpointer:
    """Decides when to save (collectively), saves asynchronously, commits, prunes, resumes."""

    def __init__(
        self,
        cfg: CheckpointConfig,
        *,
        metrics=None,
        emit: Callable[[dict], None] | None = None,
        carried: tuple[float, int] = (0.0, 0),
    ):
        """`carried`: the blocking seconds and saves of this attempt's earlier processes (an in-place
        restart: the ledger); with intervalMinutes auto their mean replaces the estimate."""
        self.cfg = cfg
        self.store = open_store(cfg.uri, cfg.attempt, cfg.staging) if cfg.uri else None
        self.keep = cfg.keep
        # intervalMinutes auto: the interval follows the measured blocking cost (`saved`)
        self.auto = carry_measured(cfg.auto, carried)
        self.interval_s = self.auto.seconds if self.auto is not None else cfg.interval_minutes * 60
        self.interval_steps = cfg.interval_steps
        self.metrics = metrics
        self.emit = emit or (lambda event: None)
        self.rank = dist.get_rank()
        self._future: tuple[Any, _Once] | None = None  # the save in flight and its booking
        self._stager = None  # staging.py: one for the run, its host buffers reused by every async save
        self._last_save = time.monotonic()
        self._lock = threading.Lock()
        self.last_committed: int | None = None
        self.last_started: int | None = None
        self.failures = 0
        # A separate gloo group for the background save: its collectives run in another thread and
        # must not interleave with the training collectives on the default group. Uploads can be
        # slow, hence the generous timeout.
        self.pg = dist.new_group(backend="gloo", timeout=dt.timedelta(minutes=max(60.0, cfg.timeout_minutes)))
        self._export_interval()
        if self.store is not None:
            # Rank 0 checks that it can write there now, not at the first save an hour in; every
            # rank raises the same error (a rank-0-only exception would leave the others waiting).
            problem: list[str | None] = [None]
            if self.rank == 0:
                try:
                    self.store.check_writable()
                    self.store.clean_partials()
                except Exception as err:  # noqa: BLE001 - reported to every rank, which all raise
                    problem[0] = f"checkpoint.uri {self.store} is not writable: {type(err).__name__}: {err}"
            dist.broadcast_object_list(problem, src=0)
            if problem[0]:
                raise RuntimeError(problem[0])

    @property
    def enabled(self) -> bool:
        return self.store is not None

    def _export_interval(self) -> None:
        m = self.metrics
        if m is None:
            return
        m.checkpoint_interval_seconds.set(self.interval_s if self.store is not None else 0)
        if self.auto is not None:
            m.checkpoint_blocking_estimate_seconds.set(self.auto.blocking_seconds)
            m.checkpoint_blocking_measured_saves.set(self.auto.measured_saves)
            m.checkpoint_mtbf_seconds.set(self.auto.mtbf_seconds)

    def saved(self, blocking_seconds: float) -> None:
        """A save blocked training for `blocking_seconds` (measured by the loop around `save`): for
        intervalMinutes auto, the next interval follows it. Each rank measures its own; the loop's
        all-reduce of `due` saves when any rank's interval has elapsed, so the shortest one rules."""
        if self.auto is None:
            return
        self.interval_s = self.auto.observe(blocking_seconds)
        self._export_interval()
        self.emit(
            {
                "event": "checkpoint_interval",
                "seconds": round(self.interval_s, 1),
                "blocking_seconds": round(self.auto.blocking_seconds, 6),
                "measured_saves": self.auto.measured_saves,
                "mtbf_seconds": round(self.auto.mtbf_seconds),
            }
        )

    def due(self, step: int) -> bool:
        """This rank's opinion; the trainer all-reduces it so every rank saves at the same step."""
        if self.store is None:
            return False
        if self.interval_steps and step % self.interval_steps == 0:
            return True
        return time.monotonic() - self._last_save >= self.interval_s

    def latest(self) -> int | None:
        """Newest complete checkpoint (it may still fail to load: see `resume`)."""
        found = self.complete_steps()
        return found[-1] if found else None

    def complete_steps(self) -> list[int]:
        """Complete checkpoints, oldest first, as rank 0 sees them (broadcast so every rank agrees)."""
        if self.store is None:
            return []
        found: list[Any] = [(self.store.list_complete(), self.store.locations()) if self.rank == 0 else None]
        dist.broadcast_object_list(found, src=0)
        steps, locations = found[0]
        self.store.adopt(locations)
        return steps

    def uri_of(self, step: int) -> str:
        root = str(self.store)
        return f"{root}{'' if root.endswith('/') else '/'}{step_name(step)}"

    def load(self, step: int, state: dict[str, Any]) -> None:
        """Load checkpoint `step` into `state`; raises UnsafeCheckpoint (on every rank) when it holds
        something the allow-lists refuse (safety.py), other errors as DCP raises them."""
        assert self.store is not None, "load() of a disabled checkpointer"
        try:
            load_checked(state, self.store.reader(step, self.rank))
        finally:
            self.store.finish_load(self.rank)
        self._last_save = time.monotonic()
        self.last_committed = step

    def quarantine_from(self, before_step: int) -> list[str]:
        """Loss-spike rollback: move every complete checkpoint with step >= `before_step` aside
        (rank 0), so that resume, retention and new saves of those steps never touch them. Returns
        where they went (every rank gets the list)."""
        moved: list = [None]
        if self.store is not None and self.rank == 0:
            try:
                moved[0] = [self.store.quarantine(s) for s in self.store.list_complete() if s >= before_step]
            except Exception as err:  # noqa: BLE001 - every rank must raise, not only rank 0
                moved[0] = f"cannot move the checkpoints from step {before_step} on aside: {type(err).__name__}: {err}"
        dist.broadcast_object_list(moved, src=0)
        if isinstance(moved[0], str):
            raise RuntimeError(moved[0])
        return moved[0] or []

    def resume(self, make_state: Callable[[], dict[str, Any]]) -> tuple[int, dict[str, Any]] | None:
        """Load the newest checkpoint that loads: (step, state), or None when there is none.

        A checkpoint that fails to load (truncated shard, empty or garbage metadata) is skipped with
        a warning naming it, and the next older one is tried: on a cluster, one bad checkpoint must
        not burn the whole restart budget. DCP's load is collective (a failure on any rank raises
        on every rank), so all ranks skip the same checkpoints. If checkpoints exist and none
        loads, that is an error: starting over would silently overwrite them.
        """
        # Building the state to load into and unpickling DCP's metadata and plans make many small
        # objects, which triggered a full (generation-2) garbage collection over the whole process
        # heap (all of torch, the model, the optimizer) in the middle of the resume: 0.5-1.4 s of a
        # 0.5 GB resume on 2 busy cores (gc callbacks around bench/checkpoint_bandwidth.py's
        # resume). What is alive now is the process's long-lived state, so it is moved out of the
        # collector's scans for good instead of being scanned again.
        gc.freeze()
        errors: list[str] = []
        for step in reversed(self.complete_steps()):
            state = make_state()
            try:
                self.load(step, state)
            except UnsafeCheckpoint:
                # Not a damaged checkpoint but one llmtrain cannot have written: someone wrote into
                # the location. Resuming from an older one would hide that, and the next saves
                # would overwrite the evidence.
                raise
            except SAVE_ERRORS as err:
                msg = _short(err)
                log.warning(
                    "checkpoint %s does not load, skipped (trying the next older one): %s", self.uri_of(step), msg
                )
                self.emit({"event": "checkpoint_skipped", "step": step, "uri": self.uri_of(step), "error": msg})
                errors.append(f"{self.uri_of(step)}: {msg}")
                continue
            return step, state
        if errors:
            raise RuntimeError(f"no checkpoint loads at {self.store}:\n  " + "\n  ".join(errors))
        return None

    def save(self, step: int, state: dict[str, Any], *, blocking: bool = False) -> None:
        self.wait()
        t0 = time.time()
        self.last_started = step
        self._last_save = time.monotonic()
        commit = self._committer(step, t0)
        assert self.store is not None, "save() of a disabled checkpointer"
        writer = self.store.writer(step, self.rank, on_commit=commit if self.rank == 0 else (lambda: None))
        if blocking:
            try:
                dcp.save(state, storage_writer=writer, process_group=self.pg)
            except SAVE_ERRORS as err:
                self._failed(step, err)
            else:
                self._done(step, t0)
            return
        if self._stager is None:
            self._stager = open_stager(torch.cuda.is_available())
        fut = dcp.async_save(state, storage_writer=writer, process_group=self.pg, async_stager=self._stager)
        done = _Once(lambda f: self._done(step, t0, f))
        fut.add_done_callback(done)
        self._future = (fut, done)

    def _committer(self, step: int, t0: float) -> Callable[[], None]:
        def commit() -> None:  # rank 0, inside DCP's finish: the checkpoint is whole and visible
            self.emit(
                {"event": "checkpoint", "step": step, "seconds": round(time.time() - t0, 3), "uri": self.uri_of(step)}
            )
            assert self.store is not None  # only saves commit
            complete = self.store.list_complete()
            for old in complete[: -self.keep]:
                self.store.delete(old)

        return commit

    def _failed(self, step: int, err: BaseException) -> None:
        """A save that failed on any rank (DCP makes every rank raise): report it, drop its
        leftovers, keep training; the next save starts from scratch."""
        self.failures += 1
        log.error("checkpoint of step %d failed (the next save tries again): %s", step, _short(err))
        self.emit({"event": "checkpoint_failed", "step": step, "error": _short(err)})
        if self.metrics is not None:
            self.metrics.checkpoint_failures_total.inc()
        if self.rank == 0 and self.store is not None:  # only saves fail
            self.store.discard_partial(step)

    def _done(self, step: int, t0: float, fut=None) -> None:
        if fut is not None and fut.exception() is not None:
            self._failed(step, fut.exception())
            return
        with self._lock:
            self.last_committed = step
        if self.metrics is not None:
            self.metrics.last_checkpoint_step.set(step)
            self.metrics.last_checkpoint_timestamp_seconds.set(time.time())
            self.metrics.checkpoint_duration_seconds.observe(time.time() - t0)

    def wait(self) -> None:
        """Block until the in-flight save (if any) is complete and booked (`last_committed`).

        A future's result is ready before its done-callbacks run (in the saving thread), so the
        booking is done here too, once, whichever comes first: `stop` read `last_committed` right
        after this and, seeing the old step, saved the same step again, blocking, inside the
        SIGTERM grace period."""
        pending, self._future = self._future, None
        if pending is not None:
            fut, done = pending
            try:
                fut.result()
            except SAVE_ERRORS:  # reported by _done (below, once); the next save tries again
                pass
            done(fut)

    def close(self) -> None:
        self.wait()
        if self._stager is not None:
            self._stager.close()
            self._stager = None
        dist.destroy_process_group(self.pg)
