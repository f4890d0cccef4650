"""In-memory snapshots (spec.checkpoint.memory) on paper: the host memory they take, their blocking
copy, their interval, the replication to the partner and the goodput they buy, before a node is
paid for. `llmtrain plan`, validation, the renderer and the docs' case study read these figures.

What a snapshot holds (the trainer's checkpoint/snapshots.py): each rank's own shard of exactly the
tensors of the durable checkpoint, in their stored dtypes, with Ψ parameters sharded over the shard
group N (planner.shard_group):

    fp32 master parameters 4 + AdamW exp_avg 4 + exp_avg_sq 4   = 12 bytes per local parameter
    AdamW's step, one fp32 scalar per parameter tensor           4 · (9·L + 3)
(FSDP2 keeps the sharded parameters in fp32 under bf16 too: planner.py. The 9·L + 3 tensors are each
block's q, k, v, o, gate, up, down and two norms, plus the embedding, final norm and output; FSDP2's
padding of each tensor to whole rows per rank and the RNG/data position and JSON header are left out:
kilobytes.) The same bytes under FULL_SHARD, HYBRID_SHARD (N = GPUs per node) and with CPU offload.

Host memory per node, with R ranks per node and S bytes per rank's snapshot:

    own snapshots       2 · R · S   the committed one stays until the next is committed
    partner's copies    2 · R · S   the previous node's ranks' (a ring), only with partner: true and
                                    more than one node
    checkpoint staging  R · S       GPU only: the durable save's host buffers (trainer staging.py,
                        + R · S     pinned, kept for the run); for an s3:// uri also its shard files in
                                    the staging tmpfs before the upload (render.py)
    CPU offload         R · 20Ψ/N   GPU only, fsdp.cpuOffload: parameters, gradients, AdamW state and
                                    its step temporary (planner.model_state_bytes) on the host
    workers             R · catalog `cpu` only: each worker process's own memory (the catalog's
                        memory/process     gpu_memory_gib, what the planner fits the job into)

It fits when the sum is at most what a worker pod may take: on GPU nodes REQUEST_FRACTION of the
instance's memory (the rest is the kubelet's and the daemonsets'), on `cpu` all of it (its pods
request memory per worker process, not a share of the node). Not counted on GPU nodes: the processes' own
memory (Python, the CUDA context, NCCL's buffers, the data loader), a few GiB per rank.

The blocking cost of a snapshot is the copy of S bytes into host memory, costed as the durable save's
staging copy is (planner.staging_copy_seconds, an assumed 10 GB/s) until the trainer has measured it;
the checksum and the send to the partner run in the background. The replication time is R · S bytes
sent to the next node at the instance's network line rate (the catalog's network_gbps; each node
sends one set and receives one, full duplex): a lower bound, sharing the links with training's own
collectives, and not on the step's path.

intervalSteps: auto is Young/Daly (cadence.py) on the snapshot's blocking cost and the job's MTBF,
τ = √(2 · C · M), clamped to [5 min, 24 h] as the trainer's AutoInterval clamps it; the trainer
snapshots at the first step boundary past τ, so the plan counts whole steps of the planned step
time, ⌈τ / step⌉.

Expected goodput, with E failures over the run (planner.expected_run: Llama 3's rate, times
`failure_scale`) and the durable path's cost per failure unchanged (RESTART_SECONDS + half the
durable interval of lost work):

    wall = steps + durable saves' blocking + snapshots' blocking
           + E · (p · (MEMORY_RESTART_SECONDS + τs/2) + (1 − p) · (RESTART_SECONDS + τd/2))

where p is the share of failures resumed from memory. With a partner on another node, p = 1: a
worker process that dies resumes from its own pod's copy, a lost node's ranks from their partners'.
That is issue 43's whole design, with only the lost node's pod replaced; while a lost pod still
means a new attempt (new pods, empty /dev/shm), only the in-place restarts resume from memory.
(It falls back to durable when a node and its partner fail within one recovery; at the prior's
rate, a node fails within a 10-minute window about once in 38,000 such windows: left out.) Without
a partner, only the failures that leave the node standing resume from memory: Llama 3 attributes
78% of its interruptions to hardware (HARDWARE_SHARE), which takes the node's pod with it; p = 0.22.

MEMORY_RESTART_SECONDS is an assumption, not a measurement: half of RESTART_SECONDS, issue 43's
target (recovery ≥ 2× faster than a new attempt from the durable checkpoint). On CPU an in-place
restart already takes 0.54× a new attempt (docs/performance/recovery.md); HyperPod's checkpointless
training claims over 80% less. The failure storm (bench/failure_storm.py) does not measure it: it
restarts both of its ways alike, in place or with one new node; the operator's single-node
replacement, against a new attempt's new pods, will.
What the model leaves out: failures during a recovery, the durable saves' own interval stretching
once memory covers most failures (the operator keeps it), and the partner traffic's effect on steps.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from . import cadence
from .catalog import GIB, InstanceType, instance_type
from .flops import num_params
from .planner import (
    RESTART_SECONDS,
    ExpectedRun,
    Plan,
    expected_run,
    interval_seconds,
    model_state_bytes,
    optimizer_step_temp_bytes,
    plan_job,
    prior_node,
    staging_copy_seconds,
    train_seconds,
)
from .spec import LLMTrainingJobSpec, MemorySnapshotSpec, resolve_dims
from .spec_constraints import MAX_SNAPSHOT_INTERVAL_STEPS

# The share of a GPU node's memory and CPUs a worker pod requests (render.py); the rest is for the
# kubelet and the daemonsets.
REQUEST_FRACTION = 0.85
STATE_BYTES_PER_PARAM = 12  # fp32 master parameter + AdamW exp_avg + exp_avg_sq
STEP_BYTES = 4  # AdamW's step: an fp32 scalar per parameter tensor
COPIES = 2  # the committed snapshot and the one being written
# Llama 3 (Dubey et al. 2024, §3.3.4, Table 5): 78% of the unexpected interruptions were confirmed or
# suspected hardware issues; here, the failures that take the node's pod with them.
HARDWARE_SHARE = 0.78
MEMORY_RESTART_SECONDS = RESTART_SECONDS / 2  # assumed: issue 43's target (see the module docstring)


def memory_spec(spec: LLMTrainingJobSpec) -> MemorySnapshotSpec:
    """The job's snapshot settings; for a job without them, the defaults (what turning them on gives)."""
    return spec.checkpoint.memory or MemorySnapshotSpec()


def snapshot_bytes(spec: LLMTrainingJobSpec, plan: Plan) -> int:
    """One rank's snapshot: 12 bytes per local parameter and an fp32 step per parameter tensor."""
    dims = resolve_dims(spec.model)
    local = math.ceil(num_params(dims) / plan.shard_group)
    return STATE_BYTES_PER_PARAM * local + STEP_BYTES * (9 * dims.num_layers + 3)


def has_partner(spec: LLMTrainingJobSpec) -> bool:
    return memory_spec(spec).partner and spec.cluster.nodes > 1


@dataclass(frozen=True)
class HostMemory:
    """Host memory one node's worker pod needs (bytes), by what holds it, and what the pod may take."""

    instance_type: str
    ranks: int
    snapshot_bytes: int  # one rank's snapshot
    own_bytes: int
    partner_bytes: int
    staging_bytes: int
    offload_bytes: int
    workers_bytes: int
    node_bytes: int  # the instance's memory (catalog memory_gib)
    pod_bytes: int  # what a worker pod may take: REQUEST_FRACTION of it on GPU nodes; all of it on `cpu`

    @property
    def total_bytes(self) -> int:
        return self.own_bytes + self.partner_bytes + self.staging_bytes + self.offload_bytes + self.workers_bytes

    @property
    def snapshots_bytes(self) -> int:
        """What the snapshots keep in the pod's /dev/shm (memory-backed: counted in its limit)."""
        return self.own_bytes + self.partner_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.pod_bytes

    def parts(self) -> str:
        """'own snapshots 96.4 GiB, partner's 96.4 GiB, checkpoint staging 96.4 GiB'."""
        named = [
            ("own snapshots", self.own_bytes),
            ("partner's", self.partner_bytes),
            ("checkpoint staging", self.staging_bytes),
            ("CPU offload", self.offload_bytes),
            ("workers", self.workers_bytes),
        ]
        return ", ".join(f"{label} {size(value)}" for label, value in named if value)

    def as_dict(self) -> dict:
        return {**asdict(self), "total_bytes": self.total_bytes, "fits": self.fits}


def size(nbytes: float) -> str:
    """'96.4 GiB', or '12.3 MiB' below a GiB."""
    return f"{nbytes / GIB:,.1f} GiB" if nbytes >= GIB else f"{nbytes / 2**20:,.1f} MiB"


def _durable_staging(spec: LLMTrainingJobSpec, inst: InstanceType, per_rank: int) -> int:
    if not (inst.is_gpu and spec.checkpoint.uri):
        return 0
    return per_rank * (2 if spec.checkpoint.uri.startswith("s3://") else 1)


def _offload(spec: LLMTrainingJobSpec, inst: InstanceType, plan: Plan) -> int:
    if not (inst.is_gpu and spec.fsdp.cpu_offload):
        return 0
    state = sum(
        model_state_bytes(
            plan.num_params, spec.fsdp.sharding_strategy, plan.shard_group, spec.fsdp.mixed_precision, False
        )
    )
    return state + optimizer_step_temp_bytes(plan.num_params, plan.shard_group, False)


def host_memory(spec: LLMTrainingJobSpec, plan: Plan | None = None) -> HostMemory:
    """The host memory per node of the module docstring; snapshots only when checkpoint.memory is set."""
    plan = plan or plan_job(spec)
    inst = instance_type(spec.cluster.instance_type)
    ranks = inst.workers_per_node(spec.cluster.processes_per_node)
    per_rank = snapshot_bytes(spec, plan)
    own = COPIES * ranks * per_rank if spec.checkpoint.memory else 0
    return HostMemory(
        instance_type=inst.name,
        ranks=ranks,
        snapshot_bytes=per_rank,
        own_bytes=own,
        partner_bytes=own if has_partner(spec) else 0,
        staging_bytes=ranks * _durable_staging(spec, inst, per_rank),
        offload_bytes=ranks * _offload(spec, inst, plan),
        workers_bytes=0 if inst.is_gpu else ranks * inst.device_memory_bytes,
        node_bytes=inst.memory_gib * GIB,
        pod_bytes=int(inst.memory_gib * GIB * (REQUEST_FRACTION if inst.is_gpu else 1)),
    )


def pod_memory_gib(spec: LLMTrainingJobSpec) -> int:
    """A worker pod's memory request and limit, in GiB (render.py). GPU: REQUEST_FRACTION of the
    node, never below what the planner counts on the host when snapshots are on. CPU: the catalog's
    memory per worker process, plus the snapshots' /dev/shm when they are on."""
    inst = instance_type(spec.cluster.instance_type)
    procs = inst.workers_per_node(spec.cluster.processes_per_node)
    base = int(inst.memory_gib * REQUEST_FRACTION) if inst.is_gpu else int(inst.gpu_memory_gib * procs)
    if not spec.checkpoint.memory:
        return base
    host = host_memory(spec)
    return max(base, math.ceil(host.total_bytes / GIB)) if inst.is_gpu else base + math.ceil(host.snapshots_bytes / GIB)


def smallest_fitting_nodes(spec: LLMTrainingJobSpec, max_nodes: int = 4096) -> int | None:
    """Fewest nodes (≥ 2, ≥ the spec's) whose host memory fits; a rank's shard, and so every part,
    shrinks as nodes grow under FULL_SHARD and SHARD_GRAD_OP; None: no count does."""

    def fits(n: int) -> bool:
        return host_memory(_with_cluster(spec, nodes=n)).fits

    lo = max(spec.cluster.nodes, 2)
    if not fits(max_nodes):
        return None
    hi = max_nodes
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _with_cluster(spec: LLMTrainingJobSpec, **update) -> LLMTrainingJobSpec:
    return spec.model_copy(update={"cluster": spec.cluster.model_copy(update=update)})


def host_fit_suggestions(spec: LLMTrainingJobSpec) -> str:
    """What would fit: no partner copy, more nodes, fewer CPU workers, or no snapshots."""
    options = []
    if has_partner(spec):
        alone = host_memory(spec.model_copy(update={"checkpoint": _without_partner(spec)}))
        if alone.fits:
            options.append(f"spec.checkpoint.memory.partner: false ({size(alone.total_bytes)})")
    nodes = smallest_fitting_nodes(spec)
    if nodes is not None and nodes != spec.cluster.nodes:
        options.append(f"spec.cluster.nodes: {nodes}")
    if not instance_type(spec.cluster.instance_type).is_gpu:
        fit = [
            n
            for n in range(1, spec.cluster.processes_per_node or 1)
            if host_memory(_with_cluster(spec, processes_per_node=n)).fits
        ]
        options += [f"spec.cluster.processesPerNode: {fit[-1]}"] if fit else []
    return "; or ".join([*options, "no spec.checkpoint.memory"])


def _without_partner(spec: LLMTrainingJobSpec):
    memory = memory_spec(spec).model_copy(update={"partner": False})
    return spec.checkpoint.model_copy(update={"memory": memory})


# --- blocking, interval, replication and goodput -------------------------------------------------


def snapshot_blocking_estimate(spec: LLMTrainingJobSpec, plan: Plan | None = None) -> float:
    """Seconds one snapshot blocks training before the trainer has measured one: the copy of a
    rank's snapshot into host memory, costed as the durable save's staging copy."""
    return staging_copy_seconds(snapshot_bytes(spec, plan or plan_job(spec)))


def step_seconds(spec: LLMTrainingJobSpec, plan: Plan) -> float:
    steps, _, train = train_seconds(spec, plan)
    return train / max(steps, 1)


def snapshot_interval(spec: LLMTrainingJobSpec, plan: Plan, node: cadence.NodeMTBF | None = None) -> tuple[int, str]:
    """(steps, why) between snapshots: the spec's, or auto's, Young/Daly clamped as cadence.interval
    clamps it (the trainer's AutoInterval, by time), taken at the first step boundary past it."""
    given = memory_spec(spec).interval_steps
    step = step_seconds(spec, plan)
    if isinstance(given, int):
        return given, f"{given} steps (spec), {given * step:,.0f} s at the planned step time"
    node = node or prior_node(spec)
    blocking, mtbf = snapshot_blocking_estimate(spec, plan), node.job_seconds(spec.cluster.nodes)
    tau = cadence.interval(blocking, mtbf)
    steps = min(MAX_SNAPSHOT_INTERVAL_STEPS, max(1, math.ceil(tau / step)))
    why = cadence.reason(blocking, mtbf, node.words(spec.cluster.nodes), "blocking (estimated)")
    return steps, f"{why}; {steps:,} steps of {step:,.1f} s"


def replication_seconds(spec: LLMTrainingJobSpec, plan: Plan) -> float:
    """Seconds to send one node's snapshots to its partner at the instance's line rate; 0: no partner."""
    if not has_partner(spec):
        return 0.0
    inst = instance_type(spec.cluster.instance_type)
    ranks = inst.workers_per_node(spec.cluster.processes_per_node)
    return ranks * snapshot_bytes(spec, plan) * 8 / (inst.network_gbps * 1e9)


def memory_share(spec: LLMTrainingJobSpec) -> float:
    """The share of failures resumed from memory: all with a partner; else those that leave the node."""
    return 1.0 if has_partner(spec) else 1.0 - HARDWARE_SHARE


@dataclass(frozen=True)
class MemoryRun:
    """The expected run with snapshots beside the durable checkpoints (the module docstring)."""

    durable: ExpectedRun  # durable checkpoints alone: planner.expected_run at the same failure rate
    snapshots: int
    snapshot_seconds: float  # their blocking part
    restarts: float
    from_memory: float  # the share of failures resumed from memory
    restart_seconds: float  # restarts and lost work
    wall_seconds: float
    goodput: float

    def as_dict(self) -> dict:
        return asdict(self)


def memory_run(spec: LLMTrainingJobSpec, plan: Plan, failure_scale: float = 1.0) -> MemoryRun:
    durable = expected_run(spec, plan, failure_scale)
    node = prior_node(spec, failure_scale)
    steps, train = durable.steps, durable.train_seconds
    every, _ = snapshot_interval(spec, plan, node)
    snapshots = steps // every
    snapshot_s = snapshots * snapshot_blocking_estimate(spec, plan)
    busy = train + durable.checkpoint_seconds + snapshot_s
    restarts = durable.restarts * busy / max(train + durable.checkpoint_seconds, 1e-9)
    p = memory_share(spec)
    from_memory = MEMORY_RESTART_SECONDS + min(every * step_seconds(spec, plan), train) / 2
    from_durable = RESTART_SECONDS + min(interval_seconds(spec, plan, node), train) / 2
    restart = restarts * (p * from_memory + (1 - p) * from_durable)
    wall = busy + restart
    return MemoryRun(durable, snapshots, snapshot_s, restarts, p, restart, wall, train / wall if wall > 0 else 0.0)


@dataclass(frozen=True)
class SnapshotPlan:
    host: HostMemory
    blocking_seconds: float  # per snapshot (estimated)
    interval_steps: int
    interval_why: str
    replication_seconds: float  # per snapshot, at line rate
    network_gbps: int
    run: MemoryRun

    def as_dict(self) -> dict:
        return {**asdict(self), "host": self.host.as_dict()}


def snapshot_plan(spec: LLMTrainingJobSpec, plan: Plan | None = None, failure_scale: float = 1.0) -> SnapshotPlan:
    """Every figure of the module docstring for a job with checkpoint.memory (without it: as if the
    defaults were set), at Llama 3's failure rate times `failure_scale`."""
    plan = plan or plan_job(spec)
    if spec.checkpoint.memory is None:
        spec = spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(update={"memory": memory_spec(spec)})})
    every, why = snapshot_interval(spec, plan, prior_node(spec, failure_scale))
    return SnapshotPlan(
        host=host_memory(spec, plan),
        blocking_seconds=snapshot_blocking_estimate(spec, plan),
        interval_steps=every,
        interval_why=why,
        replication_seconds=replication_seconds(spec, plan),
        network_gbps=instance_type(spec.cluster.instance_type).network_gbps,
        run=memory_run(spec, plan, failure_scale),
    )
