"""Process group, device mesh and FSDP2 wrapping: how the spec's `fsdp` section becomes a sharded model.

Strategy mapping (ZeRO stages in brackets; Ψ = parameters, N = data-parallel ranks):

    FULL_SHARD     1-D mesh (shard=N); reshard_after_forward=True: parameters are all-gathered per
                   block for forward, freed, gathered again for backward. Model state 16Ψ/N. [ZeRO-3]
    SHARD_GRAD_OP  same mesh; reshard_after_forward=False: the parameters gathered in forward stay
                   until backward, saving the second all-gather at the cost of holding every
                   gathered block between the passes (≈ 2Ψ + 14Ψ/N). [ZeRO-2]
    HYBRID_SHARD   2-D mesh (replicate=nodes, shard=processes per node): FULL_SHARD inside a node
                   (fast NVLink all-gathers), gradients all-reduced across nodes (EFA). [HSDP]
    NO_SHARD       2-D mesh (replicate=N, shard=1): every rank holds everything; gradients are
                   all-reduced, i.e. DDP semantics expressed with FSDP2 so the checkpoint format
                   (DTensors) is the same for all four strategies and can be resumed under any
                   other. [DDP]

Order of wrapping, per block: activation checkpointing → torch.compile → fully_shard (the same order
as torchtitan): checkpointing must see the plain block; compiling inside FSDP's hooks keeps the
all-gathers outside the graph; the root module is sharded last and keeps its parameters after
forward (`reshard_after_forward=False`) because backward starts with them immediately.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import os

import torch
import torch.distributed as dist
from torch import nn

log = logging.getLogger(__name__)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def device_for_rank(local_rank: int | None = None) -> torch.device:
    """cuda:<local rank> when a GPU is visible, else CPU (`local_rank` None: $LOCAL_RANK)."""
    if torch.cuda.is_available():
        if local_rank is None:
            local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
        return dev
    return torch.device("cpu")


def init_distributed(device: torch.device, timeout_minutes: float) -> None:
    """NCCL on GPU (with gloo for CPU-side collectives such as async checkpoints), gloo on CPU.

    The timeout applies to every collective, so a dead peer makes the others raise instead of hanging
    forever (the operator then starts a new attempt from the last checkpoint).
    """
    if dist.is_initialized():
        return
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
    kwargs = {}
    if device.type == "cuda":
        kwargs["device_id"] = device
    dist.init_process_group(backend=backend, timeout=dt.timedelta(minutes=timeout_minutes), **kwargs)


def build_mesh(strategy: str, device_type: str, world_size: int, local_world_size: int):
    from torch.distributed.device_mesh import init_device_mesh

    if strategy in ("FULL_SHARD", "SHARD_GRAD_OP"):
        return init_device_mesh(device_type, (world_size,), mesh_dim_names=("shard",))
    if strategy == "HYBRID_SHARD":
        if world_size % local_world_size:
            raise ValueError(
                f"HYBRID_SHARD needs equal processes per node: world {world_size}, local {local_world_size}"
            )
        return init_device_mesh(
            device_type, (world_size // local_world_size, local_world_size), mesh_dim_names=("replicate", "shard")
        )
    if strategy == "NO_SHARD":
        return init_device_mesh(device_type, (world_size, 1), mesh_dim_names=("replicate", "shard"))
    raise ValueError(f"unknown sharding strategy {strategy!r}")


def mixed_precision_policy(precision: str):
    """Compute in bf16/fp16, reduce gradients in fp32; master weights and optimizer state stay fp32
    (FSDP2 keeps the sharded parameters in their original dtype and casts the gathered copy)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision == "fp32":
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=DTYPES[precision], reduce_dtype=torch.float32)


# Selective activation checkpointing (op level): keep the outputs of the expensive ops — matmuls and
# attention — and recompute the cheap elementwise ones (norms, RoPE, SiLU, residual adds) in
# backward. Those elementwise activations are most of the 34·s·b·h bytes per layer that Korthikanti
# et al. count, while recomputing them costs almost no FLOPs.
def _save_list() -> set:
    ops = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}
    for name in (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    ):
        op = getattr(torch.ops.aten, name, None)
        if op is not None:
            ops.add(op.default)
    return ops


def _selective_context():
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    save = _save_list()

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def apply_activation_checkpointing(block: nn.Module, mode: str) -> nn.Module:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    if mode == "none":
        return block
    if mode == "full":
        return checkpoint_wrapper(block, preserve_rng_state=False)
    if mode == "selective":
        return checkpoint_wrapper(block, preserve_rng_state=False, context_fn=_selective_context)
    raise ValueError(f"unknown activation checkpointing {mode!r}")


# float8 needs tensor cores that multiply e4m3/e5m2: compute capability 8.9 (Ada) or newer — H100,
# H200 in the instance catalog (validation checks the instance type; this checks the device itself).
FLOAT8_MIN_CAPABILITY = (8, 9)


def check_float8_device(device: torch.device) -> None:
    """`spec.fsdp.float8` on a device without float8 tensor cores: refuse before building anything."""
    if device.type != "cuda":
        raise RuntimeError(
            f"spec.fsdp.float8 needs a CUDA GPU with float8 tensor cores (H100/H200, compute "
            f"capability ≥ 8.9); this worker runs on {device.type}. Set spec.fsdp.float8: false"
        )
    cap = torch.cuda.get_device_capability(device)
    if cap < FLOAT8_MIN_CAPABILITY:
        raise RuntimeError(
            f"spec.fsdp.float8 needs compute capability ≥ 8.9 (H100/H200); "
            f"{torch.cuda.get_device_name(device)} has {cap[0]}.{cap[1]}. Set spec.fsdp.float8: false"
        )


def float8_filter(module: nn.Module, fqn: str) -> bool:
    """Which Linear layers train in float8: those of the transformer blocks whose both dimensions are
    multiples of 16 (float8 GEMMs need them); not `lm_head`, whose logits need the precision
    (torchtitan keeps its output layer in bf16 too)."""
    return (
        isinstance(module, nn.Linear)
        and ".layers." in f".{fqn}"
        and module.in_features % 16 == 0
        and module.out_features % 16 == 0
    )


def convert_float8(model: nn.Module) -> int:
    """Swap the selected Linear layers for torchao's Float8Linear (dynamic tensorwise scaling), before
    checkpointing/compile/FSDP wrap them, as torchtitan orders it. Returns how many were swapped."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    convert_to_float8_training(model, config=Float8LinearConfig(), module_filter_fn=float8_filter)
    return sum(type(m).__name__ == "Float8Linear" for m in model.modules())


def parallelize(model: nn.Module, mesh, fsdp_spec, device: torch.device) -> nn.Module:
    """Wrap each transformer block (checkpoint → compile → fully_shard), then the root; with
    `fsdp.float8`, the blocks' Linear layers become float8 first."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    if getattr(fsdp_spec, "float8", False):
        check_float8_device(device)
        n = convert_float8(model)
        log.info("float8 training: %d Linear layers converted", n)

    strategy = fsdp_spec.sharding_strategy
    reshard = strategy in ("FULL_SHARD", "HYBRID_SHARD")
    mp = mixed_precision_policy(fsdp_spec.mixed_precision)
    # CPU offload keeps sharded parameters, gradients and optimizer state in host memory and runs
    # the optimizer step there; on a CPU-only run everything already lives there.
    offload = CPUOffloadPolicy() if (fsdp_spec.cpu_offload and device.type == "cuda") else OffloadPolicy()
    shard = functools.partial(fully_shard, mesh=mesh, mp_policy=mp, offload_policy=offload)

    layers = model.model.layers
    for i, block in enumerate(layers):
        block = apply_activation_checkpointing(block, fsdp_spec.activation_checkpointing)
        if fsdp_spec.compile:
            block.compile()  # in place: parameter names and the module type stay the same
        # The last block's parameters are needed first in backward: don't free them after forward.
        shard(block, reshard_after_forward=reshard and i < len(layers) - 1)
        layers[i] = block
    shard(model, reshard_after_forward=False)
    return model


def has_replicas(strategy: str) -> bool:
    """NO_SHARD and HYBRID_SHARD all-reduce gradients across a replicate mesh dimension."""
    return strategy in ("NO_SHARD", "HYBRID_SHARD")


class AllReduceCounter:
    """Bytes of gradients all-reduced across replicas, counted where FSDP2 issues the all-reduce
    (its all-reduce hook runs only when the all-reduce ran, with the reduced tensor)."""

    def __init__(self, model: nn.Module):
        from torch.distributed.fsdp import FSDPModule

        self.bytes = 0
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_all_reduce_hook(self._count)

    def _count(self, reduced: torch.Tensor) -> None:
        self.bytes += reduced.numel() * reduced.element_size()

    def take(self) -> int:
        n, self.bytes = self.bytes, 0
        return n
