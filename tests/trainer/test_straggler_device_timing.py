"""The straggler timing's CUDA path (llmtrain_trainer/metrics/stragglers.py: DeviceWaitClock,
DeviceSteps, step_clocks), on CPU: there is no GPU here, so the boundary to the device, the CUDA
event, is a fake that stamps a simulated device clock when recorded. What is tested is what does not
need a GPU: which clock a device gets, that nothing is read in the step (no host sync), that a
window's figures are read at the next window's end, and the arithmetic (a step's device time, its
collective waits from issue to ready, compute the rest). Whether CUDA events time NCCL's waits as
intended is unmeasured until the GPU issue's run."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from llmtrain_trainer.metrics.stragglers import (
    DeviceSteps,
    DeviceWaitClock,
    StragglerWindow,
    WaitClock,
    _timed,
    step_clocks,
)

pytestmark = pytest.mark.trainer


class Device:
    """A simulated device timeline: `now` is where the stream is when an event is recorded."""

    def __init__(self) -> None:
        self.now = 0.0
        self.events: list[FakeEvent] = []

    def event(self) -> FakeEvent:
        e = FakeEvent(self)
        self.events.append(e)
        return e

    def reads(self) -> int:
        return sum(e.reads for e in self.events)


class FakeEvent:
    """torch.cuda.Event's surface the trainer uses: record, synchronize, elapsed_time (ms)."""

    def __init__(self, device: Device) -> None:
        self.device, self.at, self.reads = device, None, 0

    def record(self) -> None:
        self.at = self.device.now

    def synchronize(self) -> None:
        assert self.at is not None, "synchronize on an event never recorded"
        self.reads += 1

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.at is not None and end.at is not None
        self.reads += 1
        return (end.at - self.at) * 1000.0


def _step(dev: Device, steps: DeviceSteps, length: float, waits: list[tuple[float, float]]) -> None:
    """One step of `length` device seconds from dev.now, with collectives (issued, ready) at those offsets."""
    t0 = dev.now
    steps.begin()
    for issued, ready in waits:
        dev.now = t0 + issued
        token = steps.clock.issued()
        dev.now = t0 + ready
        with steps.clock.waiting(token):
            pass
    dev.now = t0 + length
    steps.end()


def test_cuda_gets_device_events_and_cpu_the_hosts_clock():
    clock, steps = step_clocks(torch.device("cpu"))
    assert type(clock) is WaitClock and steps is None
    dev = Device()
    clock, steps = step_clocks(torch.device("cuda"), event=dev.event)
    assert isinstance(clock, DeviceWaitClock) and isinstance(steps, DeviceSteps) and steps.clock is clock
    assert dev.events == []  # choosing makes no event (nothing touches CUDA until a step)
    assert clock.take() == 0.0  # the host never waits on CUDA: no host figure


def test_a_windows_device_figures_are_read_at_the_next_windows_end_never_in_a_step():
    dev = Device()
    _, steps = step_clocks(torch.device("cuda"), event=dev.event)
    assert steps is not None
    # window 1: 3 steps of 1.0 s, each waiting 0.3 s in one collective (issued at 0.1, ready at 0.4)
    for _ in range(3):
        _step(dev, steps, 1.0, [(0.1, 0.4)])
    assert dev.reads() == 0  # nothing read while stepping: no host sync
    assert steps.window() is None  # the first window's end: nothing complete to read yet
    assert dev.reads() == 0
    first = list(dev.events)
    # window 2: 3 steps of 2.0 s, two collectives each (0.5 s and 1.0 s of wait)
    for _ in range(3):
        _step(dev, steps, 2.0, [(0.0, 0.5), (1.0, 2.0)])
    second = [e for e in dev.events if e not in first]
    compute, wait = steps.window()  # window 1's: compute 3 × 0.7, wait 3 × 0.3
    assert (compute, wait) == pytest.approx((2.1, 0.9))
    assert all(e.reads for e in first) and not any(e.reads for e in second)
    compute, wait = steps.window()  # window 2's: 3 × (2.0 − 1.5), 3 × 1.5
    assert (compute, wait) == pytest.approx((1.5, 4.5))


def test_waits_beyond_the_step_count_as_the_whole_step_and_a_dropped_step_leaves_nothing():
    dev = Device()
    _, steps = step_clocks(torch.device("cuda"), event=dev.event)
    assert steps is not None
    # overlapping collectives (prefetch): their spans sum to more than the step, never a negative compute
    _step(dev, steps, 1.0, [(0.0, 0.8), (0.1, 0.9)])
    # a step dropped mid-way (a stop agreed between micro-batches): begun, a collective, never ended
    steps.begin()
    dev.now += 0.2
    with steps.clock.waiting():
        dev.now += 5.0
    _step(dev, steps, 1.0, [(0.2, 0.5)])
    assert steps.window() is None
    assert steps.window() == pytest.approx((0.0 + 0.7, 1.0 + 0.3))


def test_an_async_collective_is_timed_from_its_issue_to_after_its_wait():
    dev = Device()
    clock = DeviceWaitClock(dev.event)

    class Work(dist.Work):
        def wait(self, timeout=None) -> bool:
            dev.now += 0.25  # the stream is held until the slowest rank contributed
            return True

    issued = clock.issued()  # as TimedAllGather does before issuing
    dev.now += 0.5  # compute queued meanwhile (prefetch overlap)
    work = _timed(Work(), clock, issued)
    assert work.wait() is True
    ((start, end),) = clock.take_pairs()
    assert start is issued and (end.at - start.at) == pytest.approx(0.75)
    host = WaitClock()  # the host clock (gloo) times the wait() alone, as before
    assert host.issued() is None


def test_the_window_exchanges_the_device_figures_and_scores_nothing_before_it_has_any(tmp_path):
    """One rank on gloo: the window's exchange is the device's figures of the window before; its first
    exchange has none, and rank 0 scores nothing rather than scoring zeros."""
    assert not dist.is_initialized()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        dev = Device()
        _, steps = step_clocks(torch.device("cuda"), event=dev.event)
        window = StragglerWindow("node-a", device=torch.device("cpu"), steps=2, device_steps=steps)
        results = []
        for length in (1.0, 1.0, 3.0, 3.0, 2.0, 2.0):
            _step(dev, steps, length, [(0.0, 0.25)])
            results.append(window.add(99.0, 0.0))  # the host's figures: not used on CUDA
        assert results[:2] == [None, None]  # the first window: nothing measured yet
        assert [(r.rank, r.node) for r in results[3]] == [(0, "node-a")] and results[2] is None
        # rank 0 summed windows 1 and 2 of the device (2 × 0.75 + 2 × 2.75 compute, 4 × 0.25 wait)
        assert window.recent[-1].tolist() == [[5.5, 0.5]] and len(window.recent) == 2
        assert window.recent[0].tolist() == [[1.5, 0.5]]
    finally:
        dist.destroy_process_group()


def test_events_read_are_recorded_again_so_a_long_run_makes_only_two_windows_of_them():
    dev = Device()
    _, steps = step_clocks(torch.device("cuda"), event=dev.event)
    assert steps is not None
    for window in range(6):
        for _ in range(3):
            _step(dev, steps, 1.0 + window, [(0.1, 0.4)])  # 4 events a step: 12 a window
        figures = steps.window()
        if window:  # each reused event still times its own step: the window before's figures
            assert figures == pytest.approx((3 * (0.7 + window - 1), 3 * 0.3))
    assert len(dev.events) == 2 * 12
