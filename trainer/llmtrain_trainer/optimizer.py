"""The optimizer builder: AdamW as Llama trains (β = 0.9, 0.95, ε = 1e-8), weight decay on matrices only.

The one place the trainer, the single-process reference loop and the benches make their optimizer,
so a change of implementation (e.g. fused kernels on GPU) applies to all of them at once.
"""

from __future__ import annotations

import torch

from .job_config import OptimizerConfig


def build_optimizer(model: torch.nn.Module, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    """AdamW over `model`'s parameters; weight decay on matrices, not on norm gains (1-D)."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for p in model.parameters():
        (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=(0.9, 0.95), eps=1e-8, foreach=True)


def clip_grad_norm(params: list[torch.nn.Parameter], cfg: OptimizerConfig) -> torch.Tensor:
    """The total gradient norm, after clipping the gradients to `grad_clip` (0: measured, not clipped)."""
    return torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"), foreach=True)
