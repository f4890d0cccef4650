"""FSDP and training: what the GPUs support, the batch and schedule, and whether the job fits in memory."""

from __future__ import annotations

from collections.abc import Iterator

from ..catalog import InstanceType, instance_types
from ..planner import plan_job, suggest_fit
from ..snapshot_plan import host_fit_suggestions, host_memory, size
from ..spec import resolve_dims
from .base import Problem, Subject, rule
from .model import MODEL_RULES

# GPU models (the catalog's `gpu` field) with float8 tensor cores, i.e. compute capability ≥ 8.9;
# A100 (8.0) has none. torchao's float8 training needs them.
FLOAT8_GPUS = ("H100", "H200")


def supports_float8(inst: InstanceType) -> bool:
    return inst.is_gpu and inst.gpu.startswith(FLOAT8_GPUS)


# --- FSDP -----------------------------------------------------------------------------------------


@rule("spec.fsdp.shardingStrategy")
def hybrid_shard_needs_nodes(j: Subject) -> Iterator[Problem]:
    """HYBRID_SHARD runs on at least 2 nodes (minNodes too, for an elastic job).

    It shards within a node and replicates across nodes: on one node there is nothing to
    replicate across."""
    c = j.spec.cluster
    if j.spec.fsdp.sharding_strategy == "HYBRID_SHARD" and min(c.nodes, c.min_nodes or c.nodes) < 2:
        yield Problem(
            "spec.fsdp.shardingStrategy",
            "HYBRID_SHARD shards within a node and replicates across nodes, so it needs at least 2 nodes",
            "FULL_SHARD on one node, or nodes ≥ 2",
        )


@rule("spec.fsdp.float8")
def float8_needs_float8_gpus(j: Subject) -> Iterator[Problem]:
    """float8 training runs on GPUs with float8 tensor cores: H100 and H200.

    torchao's float8 matmuls need compute capability 8.9 or more; A100 and CPUs have none."""
    c, inst = j.spec.cluster, j.instance
    if j.spec.fsdp.float8 and not supports_float8(inst):
        fp8 = [n for n, it in instance_types().items() if supports_float8(it)]
        yield Problem(
            "spec.fsdp.float8",
            f"{c.instance_type} has {inst.gpu if inst.is_gpu else 'no'} GPUs; "
            "float8 training needs float8 tensor cores (H100/H200)",
            f"float8: false, or instanceType {' | '.join(fp8)}",
        )


@rule("spec.fsdp.mixedPrecision")
def fp16_on_gpus_only(j: Subject) -> Iterator[Problem]:
    """mixedPrecision fp16 is only used on GPU instance types.

    The CPU workers (gloo) have no fp16 compute; bf16 and fp32 work on both."""
    if j.spec.fsdp.mixed_precision == "fp16" and not j.instance.is_gpu:
        yield Problem(
            "spec.fsdp.mixedPrecision",
            "fp16 compute is not supported on CPU workers",
            "bf16 | fp32 on instanceType cpu",
        )


# --- training -------------------------------------------------------------------------------------


@rule("spec.training.warmupSteps")
def warmup_below_max_steps(j: Subject) -> Iterator[Problem]:
    """warmupSteps is below maxSteps.

    The learning rate would never reach its peak (the default is 10% of maxSteps, at most 100)."""
    t = j.spec.training
    assert t.warmup_steps is not None  # parse_spec() resolved every defaulted field (defaults.resolve)
    if t.warmup_steps >= t.max_steps:
        yield Problem(
            "spec.training.warmupSteps",
            f"{t.warmup_steps} is not below maxSteps ({t.max_steps})",
            f"0..{t.max_steps - 1}",
        )


@rule("spec.training.minLearningRate")
def min_lr_within_lr(j: Subject) -> Iterator[Problem]:
    """minLearningRate, where the cosine schedule ends, is at most learningRate."""
    t = j.spec.training
    if t.min_learning_rate is not None and t.min_learning_rate > t.learning_rate:
        yield Problem(
            "spec.training.minLearningRate",
            f"{t.min_learning_rate} exceeds learningRate ({t.learning_rate})",
            f"0..{t.learning_rate}",
        )


@rule("spec.training.globalBatchTokens")
def batch_of_whole_micro_steps(j: Subject) -> Iterator[Problem]:
    """globalBatchTokens is a multiple of seqLen × microBatchSize × workers.

    A step is a whole number of micro-steps of every worker (gradient accumulation); the workers
    are nodes × GPUs per node (or processesPerNode on CPU). The default is always a multiple."""
    s, c = j.spec, j.spec.cluster
    t = s.training
    assert t.global_batch_tokens is not None and s.data.seq_len is not None  # resolved by parse_spec()
    world = c.nodes * j.instance.workers_per_node(c.processes_per_node)
    micro_tokens = s.data.seq_len * t.micro_batch_size * world
    if t.global_batch_tokens % micro_tokens:
        lo = max(micro_tokens, t.global_batch_tokens // micro_tokens * micro_tokens)
        yield Problem(
            "spec.training.globalBatchTokens",
            f"{t.global_batch_tokens} is not a multiple of seqLen × microBatchSize × workers "
            f"= {s.data.seq_len} × {t.micro_batch_size} × {world} = {micro_tokens}",
            f"a multiple of {micro_tokens}, e.g. {lo}",
        )


@rule("spec.data.seqLen", needs=MODEL_RULES)
def seq_len_within_context(j: Subject) -> Iterator[Problem]:
    """seqLen is at most the model's context length (maxSeqLen).

    The model (a preset's, or dims.maxSeqLen) is built for sequences up to that length."""
    s = j.spec
    assert s.data.seq_len is not None  # resolved by parse_spec()
    dims = resolve_dims(s.model)
    if s.data.seq_len > dims.max_seq_len:
        yield Problem(
            "spec.data.seqLen",
            f"{s.data.seq_len} exceeds the model's context length {dims.max_seq_len}",
            f"8..{dims.max_seq_len}",
        )


@rule("spec.cluster", needs=MODEL_RULES)
def fits_in_memory(j: Subject) -> Iterator[Problem]:
    """The planner's estimate of the memory per device (weights, gradients, optimizer state,
    activations, over the FSDP shards) fits the instance type's GPU memory.

    What is accepted names up to three changes that would fit, fewest nodes first (more nodes,
    another sharding strategy, full activation checkpointing); `llmtrain plan` shows the
    breakdown."""
    plan = plan_job(j.spec)
    if not plan.fits:
        gib = 1024**3
        yield Problem(
            "spec.cluster",
            f"needs {plan.total_bytes / gib:.1f} GiB per device but "
            f"{j.spec.cluster.instance_type} has {plan.gpu_memory_bytes / gib:.0f} GiB "
            f"(see `llmtrain plan`)",
            suggest_fit(j.spec),
        )


@rule("spec.cluster", needs=MODEL_RULES)
def snapshots_fit_in_host_memory(j: Subject) -> Iterator[Problem]:
    """With checkpoint.memory, the planner's host memory per node (two snapshots of each rank's state,
    two of its partner's, the durable checkpoint's staging, CPU offload) fits a worker pod's memory.

    The snapshots live in the pod's /dev/shm, memory that counts against the pod's limit: a job
    that does not fit would be OOM-killed at its first snapshots, not refused. What is accepted:
    no partner copy, the fewest nodes that fit, or no snapshots; `llmtrain plan` shows the
    breakdown (llmtrain/snapshot_plan.py)."""
    if j.spec.checkpoint.memory is None:
        return
    host = host_memory(j.spec)
    if not host.fits:
        yield Problem(
            "spec.cluster",
            f"the in-memory snapshots (spec.checkpoint.memory) need {size(host.total_bytes)} of host memory per "
            f"node ({host.parts()}) but a {host.instance_type} worker pod gets {size(host.pod_bytes)} "
            f"(of the node's {size(host.node_bytes)}): {size(host.total_bytes - host.pod_bytes)} short",
            host_fit_suggestions(j.spec),
        )
