"""Straggler timing in the trainer: each rank's compute and collective-wait seconds per step, summed
over a window of steps and exchanged in one small all-gather; rank 0 scores the window
(llmtrain/stragglers.py: the score, its derivation) and exports the highest scores
(TrainerMetrics.export_stragglers).

What a rank waits for, measured where it blocks:

  * FSDP2's all-gathers and reduce-scatters: `time_fsdp_collectives` gives each fully_shard module
    custom comms (fully_shard's set_custom_all_gather / set_custom_reduce_scatter) that issue the
    same collective as FSDP's default and hand back its Work wrapped, so the seconds FSDP spends
    in the Work's wait() are counted (`WaitClock`); the collective stays asynchronous, FSDP's
    prefetch overlap is kept. On gloo (CPU) wait() blocks until every rank contributed: the time
    waited for the slowest rank, plus the transfer. (On CUDA, NCCL's wait() only orders streams:
    the host does not block there, so these seconds say nothing about the GPU; measuring the wait
    on GPUs needs CUDA events on the collectives' streams, which this does not do yet.)
  * the step's own agreement all-reduce (loss, stop and save flags), timed by the caller.

compute = the step's wall time − its wait. Cost per step: two perf_counter() reads per collective
and one float add; per window: one all-gather of 2 floats per rank.
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

from llmtrain.stragglers import MAX_RANK, NODE_NAME, RankScore, RankTiming, scores, top

log = logging.getLogger(__name__)

WINDOW_STEPS = 20  # steps per exchange
# Rank 0 scores the sums of the last this many exchanges (a rolling 60 steps): one 20-step window
# on a busy machine is too short to tell a slow rank from scheduling noise (a healthy 10-minute run
# on 2 shared cores crossed 1.2 in 3.8 % of single windows: bench/results/stragglers_healthy_*.json).
ROLLING_WINDOWS = 3
# The test-only slow hook (docs: tests/trainer/hooks/straggler_testhook.py). Off in production:
# honoured only when this variable is set AND the module TESTHOOK_MODULE imports. The module ships
# in no package and no image (it lives under tests/, outside the packages setuptools finds); a
# job's spec can set neither the variable (spec.cluster.env refuses the LLMTRAIN_ prefix) nor the
# import path (it refuses PYTHONPATH and the other loader variables).
TESTHOOK_ENV = "LLMTRAIN_TEST_SLOW_RANK"
TESTHOOK_MODULE = "straggler_testhook"


class WaitClock:
    """Seconds this rank spent blocked in collectives, since the last `take`."""

    def __init__(self) -> None:
        self.seconds = 0.0

    @contextmanager
    def timed(self) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - t

    def take(self) -> float:
        s, self.seconds = self.seconds, 0.0
        return s


class _TimedWork(dist.Work):
    """A collective's Work whose wait() is timed on `clock` (FSDP checks for a dist.Work)."""

    def __init__(self, inner: dist.Work, clock: WaitClock) -> None:
        super().__init__()
        self._inner, self._clock = inner, clock

    def wait(self, timeout=None) -> bool:  # FSDP calls wait() without one
        with self._clock.timed():
            return self._inner.wait()

    def is_completed(self) -> bool:
        return self._inner.is_completed()


def _timed(result, clock: WaitClock):
    if isinstance(result, dist.Work):
        return _TimedWork(result, clock)
    return result


def time_fsdp_collectives(model: torch.nn.Module, clock: WaitClock) -> int:
    """Give every fully_shard module of `model` the timed comms; returns how many. A synchronous
    collective (async_op False) is timed whole."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

    class TimedAllGather(DefaultAllGather):
        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            if async_op:
                return _timed(super().__call__(output_tensor, input_tensor, group, async_op=True), clock)
            with clock.timed():
                return super().__call__(output_tensor, input_tensor, group, async_op=False)

    class TimedReduceScatter(DefaultReduceScatter):
        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            if async_op:
                return _timed(super().__call__(output_tensor, input_tensor, group, op, async_op=True), clock)
            with clock.timed():
                return super().__call__(output_tensor, input_tensor, group, op, async_op=False)

    n = 0
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_custom_all_gather(TimedAllGather())
            module.set_custom_reduce_scatter(TimedReduceScatter())
            n += 1
    return n


def node_name(value: str | None) -> str:
    """The node a rank reports (the downward API's spec.nodeName): a node name, or "unknown"."""
    value = (value or "").strip()
    return value if 0 < len(value) <= 253 and NODE_NAME.match(value) else "unknown"


class StragglerWindow:
    """Every `steps` steps, one exchange of each rank's (compute, wait) sums; rank 0 gets the
    highest scores over the last ROLLING_WINDOWS exchanges. The ranks' nodes are exchanged once,
    at construction (a collective: every rank builds its window at the same point)."""

    def __init__(self, node: str | None, *, device: torch.device, steps: int = WINDOW_STEPS) -> None:
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device, self.steps = device, max(1, steps)
        nodes: list[str | None] = [None] * self.world
        dist.all_gather_object(nodes, node_name(node))
        self.nodes = [node_name(n if isinstance(n, str) else None) for n in nodes]
        self.compute = self.wait = 0.0
        self.n = 0
        self.recent: deque[torch.Tensor] = deque(maxlen=ROLLING_WINDOWS)  # rank 0: the last exchanges

    def add(self, step_seconds: float, wait_seconds: float) -> list[RankScore] | None:
        """One step's wall time and the part of it spent waiting in collectives. At the end of a
        window (every rank at the same step: a collective), rank 0 gets the top scores."""
        wait = min(max(0.0, wait_seconds), max(0.0, step_seconds))
        self.compute += max(0.0, step_seconds) - wait
        self.wait += wait
        self.n += 1
        if self.n < self.steps:
            return None
        local = torch.tensor([self.compute, self.wait], dtype=torch.float64, device=self.device)
        gathered = [torch.zeros_like(local) for _ in range(self.world)]
        dist.all_gather(gathered, local)
        self.compute = self.wait = 0.0
        self.n = 0
        if self.rank != 0 or self.world > MAX_RANK:
            return None
        self.recent.append(torch.stack(gathered))
        summed = torch.stack(list(self.recent)).sum(dim=0)  # (world, 2) over the rolling windows
        timings = [RankTiming(r, self.nodes[r], *summed[r].tolist()) for r in range(self.world)]
        return top(scores(timings))


def test_slowness(rank: int, value: str | None = None) -> float:
    """Seconds the test-only hook makes this rank sleep in each step's compute; 0.0 in production
    (no LLMTRAIN_TEST_SLOW_RANK, or no straggler_testhook module to honour it). `value`: the
    variable as WorkerEnv read it (None: from the environment)."""
    value = os.environ.get(TESTHOOK_ENV) if value is None else value
    if not value:
        return 0.0
    try:
        hook = importlib.import_module(TESTHOOK_MODULE)
    except ImportError:
        log.warning("%s is set but the test hook module is not installed: ignored", TESTHOOK_ENV)
        return 0.0
    return float(hook.seconds_for(value, rank))
