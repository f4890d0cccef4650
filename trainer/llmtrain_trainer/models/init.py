"""Materialising a sharded model: deterministic, sharding-independent initialisation.

A 70B model must never exist whole in one process, so each process only ever produces the rows of
each parameter that its FSDP shard holds. The random values must not depend on how the model is
sharded, otherwise FULL_SHARD on 16 ranks, HYBRID_SHARD on 2×8 and a single process would start from
different weights and could not be compared (the tests compare their loss trajectories).

Scheme: split every parameter's dim 0 into fixed blocks of `rows_per_block` rows (≈1 M elements per
block). Block b of parameter `name` is drawn from a CPU generator seeded with
hash(seed, name, b). A process generates only the blocks that overlap its local rows and copies the
overlap, so the work and memory per process are its shard plus at most two partial blocks, and the
concatenation of all shards equals the tensor a single process would draw.
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

BLOCK_ELEMENTS = 1 << 20


def local_rows(param: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """(local tensor, first global row, number of rows) of a plain tensor or an FSDP2 DTensor.

    FSDP2 shards dim 0 only (`Shard(0)`, possibly under a `Replicate()` mesh dim for HYBRID/NO_SHARD),
    so a shard is always a contiguous range of rows.
    """
    from torch.distributed.tensor import DTensor

    if isinstance(param, DTensor):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
        local = param.to_local()
        if shape and tuple(local.shape[1:]) != tuple(param.shape[1:]):
            raise ValueError(f"expected a dim-0 shard, got local shape {tuple(local.shape)} of {tuple(param.shape)}")
        return local, (offset[0] if offset else 0), (shape[0] if shape else 1)
    return param, 0, (param.shape[0] if param.dim() else 1)


def _block_seed(seed: int, name: str, block: int) -> int:
    h = hashlib.blake2b(f"{seed}/{name}/{block}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << 63) - 1)


@torch.no_grad()
def fill_normal_(param: torch.Tensor, std: float, name: str, seed: int) -> None:
    local, row0, nrows = local_rows(param)
    if nrows == 0 or local.numel() == 0:
        return
    global_rows = param.shape[0]
    row_numel = max(1, param[0].numel()) if param.dim() else 1
    rows_per_block = max(1, BLOCK_ELEMENTS // row_numel)
    rest = tuple(param.shape[1:])
    first, last = row0 // rows_per_block, (row0 + nrows - 1) // rows_per_block
    for b in range(first, last + 1):
        b_start = b * rows_per_block
        b_rows = min(rows_per_block, global_rows - b_start)
        g = torch.Generator().manual_seed(_block_seed(seed, name, b))
        block = torch.randn((b_rows, *rest), generator=g, dtype=torch.float32).mul_(std)
        lo, hi = max(row0, b_start), min(row0 + nrows, b_start + b_rows)
        local[lo - row0 : hi - row0].copy_(block[lo - b_start : hi - b_start])


@torch.no_grad()
def init_weights(model: nn.Module, seed: int) -> None:
    """Fill every parameter of a (possibly sharded, already `to_empty`-ed) `Llama` model."""
    from .llama import init_std

    for name, p in model.named_parameters():
        name = canonical_name(name)
        std = init_std(name, model.dims)
        if std is None:
            local, _, _ = local_rows(p)
            local.fill_(1.0)
        else:
            fill_normal_(p, std, name, seed)


def canonical_name(name: str) -> str:
    """Parameter name without the wrappers' prefixes (activation checkpointing, torch.compile)."""
    return name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")
