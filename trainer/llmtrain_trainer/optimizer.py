"""The optimizer builder: AdamW as Llama trains (β = 0.9, 0.95, ε = 1e-8), weight decay on matrices only.

The one place the trainer, the single-process reference loop and the benches make their optimizer,
so a change of implementation applies to all of them at once.

Implementation: torch's fused AdamW (torchtitan's default) wherever the parameters allow it — one
kernel per step that reads and writes each parameter, gradient and moment once, where `foreach`
makes about three passes over the fp32 state and a temporary copy of a moment. The pinned torch
(2.15) has fused kernels for CUDA and CPU, for floating-point parameters of any width; the trainer's
parameters are always fp32 master weights (FSDP2 casts only the gathered copy), on the GPU, or on the
host with CPU offload or on a CPU-only run. Anything else (another device type, integer parameters,
fp16 training with its sharded gradient scaler: `implementation_for`) gets `foreach`. Both compute
the same update; the step count lives on the parameter's device with
`fused` (a CPU scalar with `foreach`), which a checkpoint of either loads into (DCP reshapes it).
"""

from __future__ import annotations

from typing import Literal

import torch

from .job_config import OptimizerConfig

Implementation = Literal["fused", "foreach"]

# Device types whose fused AdamW kernels the pinned torch has and the trainer runs on (device_for_rank).
FUSED_DEVICE_TYPES = frozenset({"cuda", "cpu"})


def implementation_for(params: list[torch.nn.Parameter], fp16_scaler: bool = False) -> Implementation:
    """`fused` when every parameter is floating-point on a device with fused kernels, else `foreach`.
    `fp16_scaler` (fp16 training, FSDP's ShardedGradScaler): `foreach` — the pinned torch's fused
    AdamW takes the scaler's found-inf flag, which the sharded scaler makes of shape [1], and fails
    subtracting it from its 0-d step counts ("output with shape [] doesn't match the broadcast shape
    [1]"); `foreach` gets no flag (the scaler skips the whole step itself)."""
    ok = all(p.is_floating_point() and p.device.type in FUSED_DEVICE_TYPES for p in params)
    return "fused" if params and ok and not fp16_scaler else "foreach"


def build_optimizer(
    model: torch.nn.Module,
    cfg: OptimizerConfig,
    implementation: Implementation | None = None,
    *,
    fp16_scaler: bool = False,
) -> torch.optim.Optimizer:
    """AdamW over `model`'s parameters; weight decay on matrices, not on norm gains (1-D).
    `implementation` None: `implementation_for` the parameters (the trainer's choice)."""
    params = list(model.parameters())
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    impl = implementation or implementation_for(params, fp16_scaler)
    kind = {"fused": True} if impl == "fused" else {"foreach": True}
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=(0.9, 0.95), eps=1e-8, **kind)


def clip_grad_norm(params: list[torch.nn.Parameter], cfg: OptimizerConfig) -> torch.Tensor:
    """The total gradient norm, after clipping the gradients to `grad_clip` (0: measured, not clipped)."""
    return torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"), foreach=True)
