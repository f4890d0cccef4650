"""Python's garbage collection at step boundaries, on every rank at once (as torchtitan does).

The automatic collector runs when allocation counts cross its thresholds: at a different moment on
each rank, in the middle of a step. While one rank collects it launches no work, and the next
collective makes every other rank wait for it, so each rank's pause is paid by all of them, at
random. While training, automatic collection is off; every rank collects the young generations
(`gc.collect(1)`) once when training starts and then before every `every_steps`-th step, so the
pauses are short, and taken together. The trainer makes few reference cycles; what reaches the
oldest generation waits for the end of training, when automatic collection is on again.
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger(__name__)

# torchtitan's default (training.gc_freq).
GC_EVERY_STEPS = 50


class GarbageCollection:
    """Automatic collection off from construction to `close`; `step(n)` collects before step n when
    n > 1 is a multiple of `every_steps`."""

    def __init__(self, every_steps: int = GC_EVERY_STEPS):
        if every_steps < 1:
            raise ValueError(f"gc every_steps must be at least 1, got {every_steps}")
        self.every_steps = every_steps
        self._was_enabled = gc.isenabled()
        gc.disable()
        self.collect("at the start of training")

    def step(self, step: int) -> None:
        if step > 1 and step % self.every_steps == 0:
            self.collect(f"before step {step}")

    @staticmethod
    def collect(why: str) -> None:
        t0 = time.perf_counter()
        gc.collect(1)
        log.debug("gc.collect(1) %s: %.3f s", why, time.perf_counter() - t0)

    def close(self) -> None:
        if self._was_enabled:
            gc.enable()
