"""Memory and throughput plan for a job, per GPU, before a node is paid for.

Model state (ZeRO paper, Rajbhandari et al. 2019), Ψ parameters, mixed-precision AdamW:

    16 bytes/param = 2 (16-bit params) + 2 (16-bit grads) + 12 (fp32 master, Adam m and v)
    fp32 training: 4 (params) + 4 (grads) + 8 (Adam m, v; the params are the master copy) = 16

How much of it one GPU holds depends on the strategy; N is the shard group:
    FULL_SHARD     params, grads, optimizer / N            (N = all GPUs)       16Ψ/N
    HYBRID_SHARD   params, grads, optimizer / N            (N = GPUs per node)  16Ψ/N
    SHARD_GRAD_OP  params whole; grads, optimizer / N                           2Ψ + 14Ψ/N
    NO_SHARD       everything whole                                             16Ψ
CPU offload moves the sharded state to host memory: the GPU keeps none of it.

Activations per layer, 16-bit (Korthikanti et al. 2022), s = seq len, b = micro batch,
h = hidden, a = heads:
    none:      s·b·h·(34 + 5·a·s/h)
    selective: 34·s·b·h              (attention scores recomputed; also what SDPA/flash gives)
    full:      2·s·b·h               (only each block's input is kept)
times L layers (doubled for fp32). The 34 comes from a GPT block with a 4h MLP; Llama's SwiGLU MLP
is a little larger, so treat this as an estimate.

Workspace, on top of the standard accounting: the parameters FSDP gathers for the block it is
computing plus the one it prefetches (2 blocks at 16-bit, sharded strategies only), and the fp32
logits of one micro batch for the loss (b·s·V·4 bytes). A job fits when the total stays below
FIT_FRACTION of GPU memory; the rest is CUDA context, NCCL buffers and allocator fragmentation.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .catalog import InstanceType, ModelDims, instance_type
from .flops import block_params, flops_per_token, num_params
from .spec import LLMTrainingJobSpec, resolve_dims

FIT_FRACTION = 0.90
ASSUMED_MFU = 0.40
STRATEGIES = ("FULL_SHARD", "HYBRID_SHARD", "SHARD_GRAD_OP", "NO_SHARD")


@dataclass(frozen=True)
class Plan:
    num_params: int
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    workspace_bytes: int
    total_bytes: int
    gpu_memory_bytes: int
    fits: bool
    flops_per_token: int
    world_size: int
    shard_group: int
    assumed_mfu: float
    tokens_per_second_per_gpu: float
    tokens_per_second: float

    def as_dict(self) -> dict:
        return asdict(self)


def shard_group(strategy: str, nodes: int, per_node: int) -> int:
    if strategy in ("FULL_SHARD", "SHARD_GRAD_OP"):
        return nodes * per_node
    if strategy == "HYBRID_SHARD":
        return per_node
    return 1


def model_state_bytes(psi: int, strategy: str, group: int, precision: str,
                      cpu_offload: bool) -> tuple[int, int, int]:
    """(params, grads, optimizer) bytes one GPU holds."""
    if precision == "fp32":
        p, g, o = 4 * psi, 4 * psi, 8 * psi
    else:
        p, g, o = 2 * psi, 2 * psi, 12 * psi
    if cpu_offload:
        return 0, 0, 0
    if strategy == "SHARD_GRAD_OP":
        return p, g // group, o // group
    return p // group, g // group, o // group


def activation_bytes(dims: ModelDims, seq_len: int, micro_batch: int, checkpointing: str,
                     precision: str) -> int:
    s, b, h, a, L = seq_len, micro_batch, dims.hidden_size, dims.num_heads, dims.num_layers
    if checkpointing == "full":
        per_layer = 2 * s * b * h
    elif checkpointing == "selective":
        per_layer = 34 * s * b * h
    else:
        per_layer = s * b * h * 34 + 5 * a * s * s * b
    scale = 2 if precision == "fp32" else 1
    return per_layer * L * scale


def plan_for(dims: ModelDims, inst: InstanceType, nodes: int, strategy: str, precision: str,
             checkpointing: str, seq_len: int, micro_batch: int, cpu_offload: bool = False,
             per_node: int | None = None, assumed_mfu: float = ASSUMED_MFU) -> Plan:
    per_node = per_node or inst.devices_per_node
    world = nodes * per_node
    group = shard_group(strategy, nodes, per_node)
    psi = num_params(dims)
    params, grads, optim = model_state_bytes(psi, strategy, group, precision, cpu_offload)
    acts = activation_bytes(dims, seq_len, micro_batch, checkpointing, precision)
    gathered = 2 * block_params(dims) * (4 if precision == "fp32" else 2) if group > 1 else 0
    logits = micro_batch * seq_len * dims.vocab_size * 4
    workspace = gathered + logits
    total = params + grads + optim + acts + workspace
    fpt = flops_per_token(dims, seq_len)
    per_gpu_tps = assumed_mfu * inst.peak_flops_per_device / fpt
    return Plan(
        num_params=psi, params_bytes=params, grads_bytes=grads, optimizer_bytes=optim,
        activations_bytes=acts, workspace_bytes=workspace, total_bytes=total,
        gpu_memory_bytes=inst.device_memory_bytes,
        fits=total <= FIT_FRACTION * inst.device_memory_bytes,
        flops_per_token=fpt, world_size=world, shard_group=group, assumed_mfu=assumed_mfu,
        tokens_per_second_per_gpu=per_gpu_tps, tokens_per_second=per_gpu_tps * world,
    )


def plan_job(spec: LLMTrainingJobSpec, nodes: int | None = None, strategy: str | None = None) -> Plan:
    inst = instance_type(spec.cluster.instance_type)
    per_node = inst.workers_per_node(spec.cluster.processes_per_node)
    return plan_for(
        resolve_dims(spec.model), inst, nodes or spec.cluster.nodes,
        strategy or spec.fsdp.sharding_strategy, spec.fsdp.mixed_precision,
        spec.fsdp.activation_checkpointing, spec.data.seq_len, spec.training.micro_batch_size,
        spec.fsdp.cpu_offload, per_node)


def _variant(spec: LLMTrainingJobSpec, strategy: str, checkpointing: str) -> LLMTrainingJobSpec:
    fsdp = spec.fsdp.model_copy(update={"sharding_strategy": strategy,
                                        "activation_checkpointing": checkpointing})
    return spec.model_copy(update={"fsdp": fsdp})


def smallest_fitting_nodes(spec: LLMTrainingJobSpec, max_nodes: int = 4096) -> int | None:
    """Fewest nodes (≥ the spec's) on which the job fits; memory per device never grows with nodes."""
    lo = max(spec.cluster.nodes, 2 if spec.fsdp.sharding_strategy == "HYBRID_SHARD" else 1)
    if not plan_job(spec, nodes=max_nodes).fits:
        return None
    hi = max_nodes
    while lo < hi:
        mid = (lo + hi) // 2
        if plan_job(spec, nodes=mid).fits:
            hi = mid
        else:
            lo = mid + 1
    return lo


def suggest_fit(spec: LLMTrainingJobSpec, limit: int = 3) -> str:
    """The cheapest changes that make a job fit: fewest nodes first, the user's own choices first."""
    current = (spec.fsdp.sharding_strategy, spec.fsdp.activation_checkpointing)
    options = []
    for strategy in dict.fromkeys([current[0], *STRATEGIES]):
        for ckpt in dict.fromkeys([current[1], "full"]):
            nodes = smallest_fitting_nodes(_variant(spec, strategy, ckpt))
            if nodes is None:
                continue
            change = [f"spec.cluster.nodes: {nodes}"] if nodes != spec.cluster.nodes else []
            change += [f"spec.fsdp.shardingStrategy: {strategy}"] if strategy != current[0] else []
            change += [f"spec.fsdp.activationCheckpointing: {ckpt}"] if ckpt != current[1] else []
            options.append((nodes, len(change), " with ".join(change)))
    if not options:
        return "a larger instance type, a smaller model, or a shorter sequence"
    options.sort()
    return "; or ".join(dict.fromkeys(text for *_, text in options[:limit]))
