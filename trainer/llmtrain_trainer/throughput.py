"""Throughput, TFLOP/s and MFU of a step — from the one formula in `llmtrain.flops`.

    tokens/s (job)      = tokens per step / step seconds
    TFLOP/s per device  = tokens/s / devices · flops_per_token(dims, T) / 10¹²
    MFU                 = tokens/s per device · flops_per_token ÷ peak FLOP/s per device

flops_per_token = 6·N_matmul + 12·L·H·q·T (see `llmtrain.flops`), peak from the instance catalog
(dense BF16 for GPUs). The trainer never re-derives either number.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmtrain import flops
from llmtrain.catalog import ModelDims


@dataclass(frozen=True)
class Throughput:
    tokens_per_second: float
    tflops_per_device: float
    mfu: float


def step_throughput(tokens: int, seconds: float, devices: int, dims: ModelDims, seq_len: int,
                    peak_flops_per_device: float) -> Throughput:
    tps = tokens / seconds if seconds > 0 else 0.0
    fpt = flops.flops_per_token(dims, seq_len)
    per_device = tps / devices
    return Throughput(tps, per_device * fpt / 1e12, flops.mfu(per_device, fpt, peak_flops_per_device))
