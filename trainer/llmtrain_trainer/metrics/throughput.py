"""Throughput, TFLOP/s and MFU of a step — from the one formula in `llmtrain.flops`.

    tokens/s (job)      = tokens per step / step seconds
    tokens/s per device = tokens/s / devices (torchtitan's figure; comparable across job sizes)
    TFLOP/s per device  = tokens/s per device · flops_per_token(dims, T) / 10¹²
    MFU                 = tokens/s per device · flops_per_token ÷ peak FLOP/s per device

flops_per_token = 6·N_matmul + 12·L·H·q·T (see `llmtrain.flops`), peak from the instance catalog
(dense BF16 for GPUs). The trainer never re-derives either number. The step seconds are the wall
time since the previous step ended, so a checkpoint's blocking part counts against the step after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from llmtrain import flops
from llmtrain.catalog import ModelDims


@dataclass(frozen=True)
class Throughput:
    tokens_per_second: float
    tokens_per_second_per_device: float
    tflops_per_device: float
    mfu: float


def step_throughput(
    tokens: int, seconds: float, devices: int, dims: ModelDims, seq_len: int, peak_flops_per_device: float
) -> Throughput:
    tps = tokens / seconds if seconds > 0 else 0.0
    fpt = _flops_per_token(dims, seq_len)
    per_device = tps / devices
    return Throughput(tps, per_device, per_device * fpt / 1e12, flops.mfu(per_device, fpt, peak_flops_per_device))


@lru_cache(maxsize=8)
def _flops_per_token(dims: ModelDims, seq_len: int) -> int:
    # Called every step with the same (dims, seq_len): counting the parameters each time was the
    # largest single item of the trainer's per-step bookkeeping after the metrics.
    return flops.flops_per_token(dims, seq_len)


class SteadyThroughput:
    """The mean throughput of a worker process's steps after its first (the first includes the
    warm-up: allocator growth, the data loader's start, lazy initialisation): their tokens over
    their seconds, so each step weighs as long as it took. With one step only, that step's.
    The trainer's final summary and its `end` line report it (`llmtrain local`'s summary prints
    it), rather than the last step's alone."""

    def __init__(self) -> None:
        self.steps = 0
        self._first: tuple[int, float] = (0, 0.0)
        self._tokens = 0
        self._seconds = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        self.steps += 1
        if self.steps == 1:
            self._first = (tokens, seconds)
        else:
            self._tokens += tokens
            self._seconds += seconds

    def result(self, devices: int, dims: ModelDims, seq_len: int, peak_flops_per_device: float) -> Throughput | None:
        if not self.steps:
            return None
        tokens, seconds = (self._tokens, self._seconds) if self.steps > 1 else self._first
        return step_throughput(tokens, seconds, devices, dims, seq_len, peak_flops_per_device)
