"""Memory and throughput plan for a job, per GPU, before a node is paid for.

Model state (ZeRO paper, Rajbhandari et al. 2019), Ψ parameters, mixed-precision AdamW:

    16 bytes/param = 2 (16-bit params) + 2 (16-bit grads) + 12 (fp32 master, Adam m and v)
    fp32 training: 4 (params) + 4 (grads) + 8 (Adam m, v; the params are the master copy) = 16
(Under bf16, FSDP2 keeps the sharded parameters and gradients in fp32 and casts only the gathered
copies: 4 + 4 + 8. Same total; ZeRO's split over-counts the start of backward, which holds no
gradients, by 2Ψ/N. Not changed: the CPU bench measures fp32 only.)

How much of it one GPU holds between steps: the trainer builds every strategy with FSDP2
(trainer/llmtrain_trainer/distributed/parallel.py), which keeps each parameter, its gradient and its optimizer
state sharded over the shard group N, whatever the strategy:
    FULL_SHARD     params, grads, optimizer / N     (N = all GPUs)        16Ψ/N
    HYBRID_SHARD   params, grads, optimizer / N     (N = GPUs per node)   16Ψ/N
    SHARD_GRAD_OP  params, grads, optimizer / N     (N = all GPUs)        16Ψ/N
    NO_SHARD       everything whole                 (N = 1)               16Ψ
What the strategies differ in is how many whole (gathered) parameters live beside that during
forward and backward: SHARD_GRAD_OP and NO_SHARD keep every block's gathered copy from its forward
to its backward (ZeRO-2's "params whole"; under NO_SHARD FSDP2 still copies each parameter into its
unsharded buffer, as for a shard group of 1), FULL_SHARD and HYBRID_SHARD one or two blocks at a
time (see Workspace). CPU offload moves the sharded state to host memory: the GPU keeps none of it.

Activations: the tensors autograd saves for backward, counted for THIS trainer's block (Llama:
RMSNorm computed in fp32, GQA attention through scaled_dot_product_attention, SwiGLU MLP), with
e = bytes per activation element (2 for bf16/fp16, 4 for fp32), d = hidden, kv = KV heads · head dim,
f = MLP width, per token and layer:
    none:      8d + e·(7d + 2kv + 4f)   two RMSNorms keep an fp32 input (4d) and their normalised
                                       output (e·d) each; q/k/v input, q, k, v, attention output,
                                       o_proj input, MLP input (e·(5d + 2kv)); gate, up, silu(gate)
                                       and their product (4e·f). SDPA (flash / memory-efficient) keeps
                                       no s×s score matrix, so Korthikanti's 5as/h term does not apply.
    selective: e·(5d + 2kv + 2f)       the block input and the outputs of the matmuls and attention,
                                       which the selective policy saves (the rest is recomputed)
    full:      e·d                     only each block's input
times s·b tokens and L layers. With checkpointing, backward rebuilds one block at a time: counted as
workspace. (Korthikanti et al. 2022 give 34·s·b·h for a GPT block with
16-bit activations; for Llama-shaped blocks the formula above is what measurement on the trainer
confirms: bench/planner_accuracy.py.)

Workspace, on top of the standard accounting:
  - the loss: logits in fp32 for b·s tokens — the log-softmax output that cross-entropy keeps, and at
    the start of backward its incoming and outgoing gradients (3 × 4·V bytes per token; measured:
    the peak of a step is inside LogSoftmaxBackward), plus the 16-bit logits themselves under mixed
    precision; the final norm and lm_head input (4d + e·d per token);
  - with checkpointing, one block rebuilt in backward (what the mode did not keep: the whole block
    for `full`, its norms and elementwise ops for `selective`) plus its backward gradient buffers
    (e·(2d + 3f) per token) — never at the same time as the loss buffers (freed before backward
    reaches the blocks), so the larger of the two counts;
  - FSDP's gathered (unsharded) parameters, in the compute dtype (e bytes each), at the start of
    backward: FULL_SHARD and HYBRID_SHARD hold the root module's (embedding, final norm, lm_head:
    2·V·d + d; the root keeps them from forward to the end of backward, reshard_after_forward=False)
    plus two blocks (the one computed and the one prefetched); SHARD_GRAD_OP and NO_SHARD hold all Ψ
    (no block frees its copy after forward).

Peak: gradients are freed after every optimizer step (zero_grad(set_to_none=True)) and fill up only
while backward frees the activations, so the peak is the largest of three moments, not the sum of
all parts; on top of params + optimizer:
    start of backward   activations + workspace (above)
    end of backward     grads + gathered root and 2 blocks (every block frees its copy after its
                        backward) + the root's unsharded fp32 gradients (2·V·d·4): the root is
                        reduced last, and its whole gradients sit beside its reduce buffer
    optimizer step      grads + one fp32 temporary per local parameter (4Ψ/N): foreach AdamW's
                        sqrt(v)/bias-correction + eps, built whole before the update
bench/planner_accuracy.py measures it against the trainer (README, Performance), on all four
strategies: that is where the gathered root, the whole-Ψ copies of SHARD_GRAD_OP/NO_SHARD and the
optimizer-step temporary come from. A job fits when the total stays below FIT_FRACTION of GPU
memory; the rest is CUDA context, NCCL buffers and allocator fragmentation.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from . import cadence
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


def model_state_bytes(psi: int, strategy: str, group: int, precision: str, cpu_offload: bool) -> tuple[int, int, int]:
    """(params, grads, optimizer) bytes one GPU holds between steps: sharded over the group under
    every strategy (FSDP2; SHARD_GRAD_OP's whole parameters are gathered copies: gathered_bytes)."""
    if precision == "fp32":
        p, g, o = 4 * psi, 4 * psi, 8 * psi
    else:
        p, g, o = 2 * psi, 2 * psi, 12 * psi
    if cpu_offload:
        return 0, 0, 0
    return p // group, g // group, o // group


def _elem(precision: str) -> int:
    return 4 if precision == "fp32" else 2


def _block_activation_bytes_per_token(dims: ModelDims, checkpointing: str, e: int) -> int:
    d, f = dims.hidden_size, dims.intermediate_size
    kv = dims.num_kv_heads * dims.head_dim
    if checkpointing == "full":
        return e * d
    if checkpointing == "selective":
        return e * (5 * d + 2 * kv + 2 * f)
    return 8 * d + e * (7 * d + 2 * kv + 4 * f)


def activation_bytes(dims: ModelDims, seq_len: int, micro_batch: int, checkpointing: str, precision: str) -> int:
    """Activations all blocks keep for backward (one block's recomputation is workspace)."""
    e = _elem(precision)
    return _block_activation_bytes_per_token(dims, checkpointing, e) * dims.num_layers * seq_len * micro_batch


def recompute_bytes(dims: ModelDims, seq_len: int, micro_batch: int, checkpointing: str, precision: str) -> int:
    """Under checkpointing, backward rebuilds one block at a time: what the mode did not keep (the
    whole block for `full`; norms and elementwise ops for `selective`), plus that block's backward
    gradient buffers (2 d-wide and 3 f-wide per token)."""
    if checkpointing == "none":
        return 0
    e = _elem(precision)
    rebuilt = _block_activation_bytes_per_token(dims, "none", e)
    if checkpointing == "selective":
        rebuilt -= _block_activation_bytes_per_token(dims, "selective", e)
    grads = e * (2 * dims.hidden_size + 3 * dims.intermediate_size)
    return (rebuilt + grads) * seq_len * micro_batch


def loss_workspace_bytes(dims: ModelDims, seq_len: int, micro_batch: int, precision: str) -> int:
    e, d, V = _elem(precision), dims.hidden_size, dims.vocab_size
    per_token = 3 * 4 * V + (e * V if e != 4 else 0) + 4 * d + e * d
    return per_token * seq_len * micro_batch


def root_params(dims: ModelDims) -> int:
    """Parameters outside the blocks, in the root FSDP module: embedding, final norm, lm_head."""
    return num_params(dims) - dims.num_layers * block_params(dims)


def gathered_bytes(dims: ModelDims, strategy: str, group: int, precision: str) -> int:
    """FSDP's unsharded copies at the start of backward, in the compute dtype. FULL_SHARD and
    HYBRID_SHARD: the root's (kept from forward to the end of backward) and two blocks' (the one
    computed and the one prefetched). SHARD_GRAD_OP and NO_SHARD: every parameter, since no block
    frees its copy after forward. The shard group does not matter: FSDP2 copies into the unsharded
    buffer even for a group of 1."""
    e = _elem(precision)
    if strategy in ("SHARD_GRAD_OP", "NO_SHARD"):
        return e * num_params(dims)
    return end_of_backward_gathered_bytes(dims, precision)


def end_of_backward_gathered_bytes(dims: ModelDims, precision: str) -> int:
    """When backward ends, every block has freed its copy after its own backward (all strategies):
    the root's parameters and at most two blocks' are still gathered."""
    return _elem(precision) * (root_params(dims) + 2 * block_params(dims))


def unsharded_root_grad_bytes(dims: ModelDims, group: int) -> int:
    """The root module (embedding, lm_head) is reduced last, when backward ends: until then its fp32
    gradients (2·V·d) are whole, beside the other gradients; FSDP2 reduces through a copy even for a
    shard group of 1, so this holds under every strategy."""
    return 4 * 2 * dims.vocab_size * dims.hidden_size


def optimizer_step_temp_bytes(psi: int, group: int, cpu_offload: bool) -> int:
    """foreach AdamW builds sqrt(v)/bias-correction + eps for all local parameters at once before the
    update: one fp32 tensor of each local parameter's size (on the host under CPU offload)."""
    return 0 if cpu_offload else 4 * psi // group


def plan_for(
    dims: ModelDims,
    inst: InstanceType,
    nodes: int,
    strategy: str,
    precision: str,
    checkpointing: str,
    seq_len: int,
    micro_batch: int,
    cpu_offload: bool = False,
    per_node: int | None = None,
    assumed_mfu: float = ASSUMED_MFU,
) -> Plan:
    per_node = per_node or inst.devices_per_node
    world = nodes * per_node
    group = shard_group(strategy, nodes, per_node)
    psi = num_params(dims)
    params, grads, optim = model_state_bytes(psi, strategy, group, precision, cpu_offload)
    acts = activation_bytes(dims, seq_len, micro_batch, checkpointing, precision)
    # The loss buffers are gone before backward reaches the first recomputed block: the larger counts.
    workspace = gathered_bytes(dims, strategy, group, precision) + max(
        loss_workspace_bytes(dims, seq_len, micro_batch, precision),
        recompute_bytes(dims, seq_len, micro_batch, checkpointing, precision),
    )
    # Gradients are freed after every optimizer step (zero_grad(set_to_none=True)) and only fill up
    # while backward frees the activations, so the peak is the largest of three moments: the start of
    # backward (activations + workspace, no gradients), its end (all gradients, activations gone) and
    # the optimizer step (all gradients and AdamW's temporary).
    end_of_backward = grads + end_of_backward_gathered_bytes(dims, precision) + unsharded_root_grad_bytes(dims, group)
    optimizer_step = grads + optimizer_step_temp_bytes(psi, group, cpu_offload)
    total = params + optim + max(acts + workspace, end_of_backward, optimizer_step)
    fpt = flops_per_token(dims, seq_len)
    per_gpu_tps = assumed_mfu * inst.peak_flops_per_device / fpt
    return Plan(
        num_params=psi,
        params_bytes=params,
        grads_bytes=grads,
        optimizer_bytes=optim,
        activations_bytes=acts,
        workspace_bytes=workspace,
        total_bytes=total,
        gpu_memory_bytes=inst.device_memory_bytes,
        fits=total <= FIT_FRACTION * inst.device_memory_bytes,
        flops_per_token=fpt,
        world_size=world,
        shard_group=group,
        assumed_mfu=assumed_mfu,
        tokens_per_second_per_gpu=per_gpu_tps,
        tokens_per_second=per_gpu_tps * world,
    )


def plan_job(spec: LLMTrainingJobSpec, nodes: int | None = None, strategy: str | None = None) -> Plan:
    inst = instance_type(spec.cluster.instance_type)
    per_node = inst.workers_per_node(spec.cluster.processes_per_node)
    return plan_for(
        resolve_dims(spec.model),
        inst,
        nodes or spec.cluster.nodes,
        strategy or spec.fsdp.sharding_strategy,
        spec.fsdp.mixed_precision,
        spec.fsdp.activation_checkpointing,
        spec.data.seq_len,  # type: ignore[arg-type]  # a resolved spec
        spec.training.micro_batch_size,
        spec.fsdp.cpu_offload,
        per_node,
    )


def _variant(spec: LLMTrainingJobSpec, strategy: str, checkpointing: str) -> LLMTrainingJobSpec:
    fsdp = spec.fsdp.model_copy(update={"sharding_strategy": strategy, "activation_checkpointing": checkpointing})
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


# --- the expected run: wall time, GPU-hours, checkpoint and restart overhead ----------------------
# Interruptions per GPU-hour: Llama 3 (Dubey et al. 2024, §3.3.4) saw 419 unexpected interruptions
# in 54 days of pre-training on 16,384 H100s (llmtrain.cadence, the prior of intervalMinutes: auto).
FAILURES_PER_GPU_HOUR = cadence.FAILURES_PER_GPU_HOUR
RESTART_SECONDS = 600.0  # assumed per restart: detection, backoff, new pods, rendezvous, resume
STAGING_BYTES_PER_SECOND = 10e9  # assumed device→host copy of a rank's shard while training waits


@dataclass(frozen=True)
class ExpectedRun:
    steps: int
    tokens: int
    train_seconds: float  # the steps alone, at the planned throughput
    checkpoints: int
    checkpoint_seconds: float  # their blocking part (the staging copy)
    restarts: float  # expected interruptions
    restart_seconds: float  # each: RESTART_SECONDS + half a checkpoint interval of lost work
    wall_seconds: float
    gpu_hours: float
    goodput: float

    def as_dict(self) -> dict:
        return asdict(self)


def staging_copy_seconds(nbytes: float) -> float:
    """Seconds training waits while `nbytes` of a rank's state are copied into host memory, before
    the trainer has measured a copy: at STAGING_BYTES_PER_SECOND. A durable save's staging copy and
    an in-memory snapshot (llmtrain.snapshot_plan) are both this copy."""
    return nbytes / STAGING_BYTES_PER_SECOND


def checkpoint_blocking_estimate(plan: Plan) -> float:
    """Seconds one save blocks training, before the trainer has measured one: the staging copy of
    a rank's parameters and optimizer state at STAGING_BYTES_PER_SECOND."""
    return staging_copy_seconds(plan.params_bytes + plan.optimizer_bytes)


def prior_node(spec: LLMTrainingJobSpec, failure_scale: float = 1.0) -> cadence.NodeMTBF:
    """The instance type's node MTBF under the prior (cadence.py), its failure rate times
    `failure_scale` (1: Llama 3's published rate)."""
    inst = instance_type(spec.cluster.instance_type)
    node = cadence.node_mtbf(inst.name, inst.gpus_per_node)
    return node if failure_scale == 1.0 else replace(node, prior_hours=node.prior_hours / failure_scale)


def auto_interval(spec: LLMTrainingJobSpec, plan: Plan, node: cadence.NodeMTBF | None = None) -> tuple[float, str]:
    """(seconds, why) of the interval `intervalMinutes: auto` starts with: the blocking estimate
    and the job's MTBF (`node`: what the operator has seen on the instance type; default the
    prior alone)."""
    node = node or prior_node(spec)
    blocking = checkpoint_blocking_estimate(plan)
    mtbf = node.job_seconds(spec.cluster.nodes)
    why = cadence.reason(blocking, mtbf, node.words(spec.cluster.nodes), "blocking (estimated)")
    return cadence.interval(blocking, mtbf), why


def interval_seconds(spec: LLMTrainingJobSpec, plan: Plan, node: cadence.NodeMTBF | None = None) -> float:
    """The time-based checkpoint interval the job starts with: the spec's, or auto's."""
    fixed = spec.checkpoint.fixed_interval_seconds
    return fixed if fixed is not None else auto_interval(spec, plan, node)[0]


def train_seconds(spec: LLMTrainingJobSpec, plan: Plan) -> tuple[int, int, float]:
    """(steps, tokens per step, seconds of steps alone at the planned throughput)."""
    t, seq = spec.training, spec.data.seq_len
    if seq is None:
        raise ValueError("data.seqLen is not resolved (llmtrain.defaults.resolve)")
    tokens_per_step = max(1, (t.global_batch_tokens or seq) // seq) * seq
    return t.max_steps, tokens_per_step, t.max_steps * tokens_per_step / max(plan.tokens_per_second, 1e-9)


def expected_run(spec: LLMTrainingJobSpec, plan: Plan, failure_scale: float = 1.0) -> ExpectedRun:
    """What `llmtrain plan` promises before the job starts (docs/concepts/goodput.md): the planned
    throughput, a checkpoint every intervalMinutes (auto: the interval it starts with) or every
    intervalSteps, costing the staging copy of a rank's parameters and optimizer state, and
    FAILURES_PER_GPU_HOUR interruptions (times `failure_scale`)."""
    steps, tokens_per_step, train = train_seconds(spec, plan)
    interval = interval_seconds(spec, plan, prior_node(spec, failure_scale))
    saves = int(train // interval)
    if spec.checkpoint.interval_steps:
        saves = max(saves, steps // spec.checkpoint.interval_steps)
    per_save = checkpoint_blocking_estimate(plan)
    ckpt = saves * per_save
    gpus = plan.world_size
    restarts = gpus * (train + ckpt) / 3600 * FAILURES_PER_GPU_HOUR * failure_scale
    lost = min(interval, train) / 2
    restart = restarts * (RESTART_SECONDS + lost)
    wall = train + ckpt + restart
    return ExpectedRun(
        steps=steps,
        tokens=steps * tokens_per_step,
        train_seconds=train,
        checkpoints=saves,
        checkpoint_seconds=ckpt,
        restarts=restarts,
        restart_seconds=restart,
        wall_seconds=wall,
        gpu_hours=wall / 3600 * gpus,
        goodput=train / wall if wall > 0 else 0.0,
    )
