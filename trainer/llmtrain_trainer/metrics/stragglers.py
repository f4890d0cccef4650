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
    waited for the slowest rank, plus the transfer.
  * the step's own agreement all-reduce (loss, stop and save flags), timed by the caller.

compute = the step's wall time − its wait. Cost per step: two perf_counter() reads per collective
and one float add; per window: one all-gather of 2 floats per rank.

On CUDA the host sees none of this: NCCL's wait() only makes the current stream wait for the
collective's, and the step itself only queues kernels (no per-step host sync). There the same two
figures come from CUDA events on the device's own timeline (`DeviceWaitClock`, `DeviceSteps`): an
event where the step starts and where it ends (after the agreement all-reduce) on the current
stream, and for each collective one where it was issued and one recorded right after its wait()
(its result is ready to the stream that needs it: the time this rank's stream was held for the
slowest rank, plus the transfer). Nothing is read in the step: at a window's end the previous
window's events, long complete by then, are read (elapsed_time; a synchronize on each first, which
returns at once on a complete event), so the scores lag one window. Unmeasured on a GPU so far:
the selection and the arithmetic are tested on CPU with fake events
(tests/trainer/test_straggler_device_timing.py); the GPU run of the GPU issue is its first
measurement.
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

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
    """Seconds this rank spent blocked in collectives, since the last `take` (the host's clock: where
    the host blocks, as on gloo)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def issued(self) -> Any:
        """A collective was issued (async): the host clock counts only its wait()."""
        return None

    @contextmanager
    def waiting(self, issued: Any = None) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - t

    def timed(self) -> AbstractContextManager[None]:
        return self.waiting()

    def take(self) -> float:
        s, self.seconds = self.seconds, 0.0
        return s


def _cuda_event() -> Any:
    return torch.cuda.Event(enable_timing=True)


class DeviceWaitClock(WaitClock):
    """On CUDA: each collective as a pair of events on the current stream (the module's docstring),
    from its issue to just after its wait(); `take_pairs` hands the step's pairs over unread. The
    host figure (`take`) stays 0: the host does not wait. `event` makes an event (a test's fake)."""

    def __init__(self, event: Callable[[], Any] = _cuda_event) -> None:
        super().__init__()
        self.make = event
        self.free: list[Any] = []  # events read already (DeviceSteps.window), recorded again
        self.pairs: list[tuple[Any, Any]] = []

    def event(self) -> Any:
        """An event to record: a read one again, else a new one (a model of many blocks records
        hundreds a step: they are made during the first two windows only)."""
        return self.free.pop() if self.free else self.make()

    def issued(self) -> Any:
        start = self.event()
        start.record()
        return start

    @contextmanager
    def waiting(self, issued: Any = None) -> Iterator[None]:
        start = issued if issued is not None else self.issued()
        try:
            yield
        finally:
            end = self.event()
            end.record()
            self.pairs.append((start, end))

    def take_pairs(self) -> list[tuple[Any, Any]]:
        pairs, self.pairs = self.pairs, []
        return pairs


def _seconds(start: Any, end: Any) -> float:
    """Seconds between two complete events (CUDA's elapsed_time is in milliseconds)."""
    start.synchronize()
    end.synchronize()
    return max(0.0, start.elapsed_time(end) / 1000.0)


class DeviceSteps:
    """Each step's device time and collective waits as events (the module's docstring), kept per
    window and read one window late, so that reading them never waits for the device."""

    def __init__(self, clock: DeviceWaitClock) -> None:
        self.clock = clock
        self.start: Any = None
        self.current: list[tuple[Any, Any, list[tuple[Any, Any]]]] = []
        self.previous: list[tuple[Any, Any, list[tuple[Any, Any]]]] | None = None

    def begin(self) -> None:
        self.clock.take_pairs()  # a step dropped mid-way (a stop agreed) left its own: not this step's
        self.start = self.clock.issued()

    def end(self) -> None:
        if self.start is None:
            return
        end = self.clock.event()
        end.record()
        self.current.append((self.start, end, self.clock.take_pairs()))
        self.start = None

    def window(self) -> tuple[float, float] | None:
        """At a window's end: the previous window's summed (compute, wait) seconds, its events read
        now; None at the first window (nothing complete to read yet)."""
        previous, self.previous, self.current = self.previous, self.current, []
        if previous is None:
            return None
        compute = wait = 0.0
        for start, end, pairs in previous:
            step = _seconds(start, end)
            waited = min(step, sum(_seconds(a, b) for a, b in pairs))
            compute += step - waited
            wait += waited
            self.clock.free += [start, end, *(e for pair in pairs for e in pair)]
        return compute, wait


def step_clocks(device: torch.device, event: Callable[[], Any] = _cuda_event) -> tuple[WaitClock, DeviceSteps | None]:
    """The straggler timing for `device`: on CUDA, device events (the host does not block in NCCL);
    elsewhere the host's clock, where gloo blocks."""
    if device.type == "cuda":
        clock = DeviceWaitClock(event)
        return clock, DeviceSteps(clock)
    return WaitClock(), None


class _TimedWork(dist.Work):
    """A collective's Work whose wait() is timed on `clock` (FSDP checks for a dist.Work)."""

    def __init__(self, inner: dist.Work, clock: WaitClock, issued: Any = None) -> None:
        super().__init__()
        self._inner, self._clock, self._issued = inner, clock, issued

    def wait(self, timeout=None) -> bool:  # FSDP calls wait() without one
        with self._clock.waiting(self._issued):
            return self._inner.wait()

    def is_completed(self) -> bool:
        return self._inner.is_completed()


def _timed(result, clock: WaitClock, issued: Any = None):
    if isinstance(result, dist.Work):
        return _TimedWork(result, clock, issued)
    return result


def time_fsdp_collectives(model: torch.nn.Module, clock: WaitClock) -> int:
    """Give every fully_shard module of `model` the timed comms; returns how many. A synchronous
    collective (async_op False) is timed whole."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

    class TimedAllGather(DefaultAllGather):
        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            if async_op:
                issued = clock.issued()
                return _timed(super().__call__(output_tensor, input_tensor, group, async_op=True), clock, issued)
            with clock.timed():
                return super().__call__(output_tensor, input_tensor, group, async_op=False)

    class TimedReduceScatter(DefaultReduceScatter):
        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            if async_op:
                issued = clock.issued()
                return _timed(super().__call__(output_tensor, input_tensor, group, op, async_op=True), clock, issued)
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
    at construction (a collective: every rank builds its window at the same point). With
    `device_steps` (CUDA) the sums exchanged are the device's, of the window before (the host's
    figures given to `add` are not used); the first window has none, and rank 0 scores nothing."""

    def __init__(
        self,
        node: str | None,
        *,
        device: torch.device,
        steps: int = WINDOW_STEPS,
        device_steps: DeviceSteps | None = None,
    ) -> None:
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device, self.steps, self.device_steps = device, max(1, steps), device_steps
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
        figures: tuple[float, float] | None = (self.compute, self.wait)
        if self.device_steps is not None:
            figures = self.device_steps.window()
        local = torch.tensor(figures or (0.0, 0.0), dtype=torch.float64, device=self.device)
        gathered = [torch.zeros_like(local) for _ in range(self.world)]
        dist.all_gather(gathered, local)
        self.compute = self.wait = 0.0
        self.n = 0
        if self.rank != 0 or self.world > MAX_RANK:
            return None
        window = torch.stack(gathered)
        if not bool((window.sum(dim=1) > 0).all()):
            return None  # a rank with nothing measured yet (device timing's first window): no scores
        self.recent.append(window)
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
