"""The `LLMTrainingJob` spec (llmtrain.dev/v1alpha1): the one definition of the API.

Everything else derives from these classes: the CRD's OpenAPI schema (`llmtrain.crd`), defaults
(resolved in an explicit step, `llmtrain.defaults.resolve`, after validation),
offline validation (`llmtrain validate`), the operator and the trainer's configuration. Field names
are camelCase on the wire (Kubernetes convention) and snake_case in Python.

Mutability: once created, only `spec.resilience`, `spec.suspend` and
`spec.checkpoint.intervalMinutes` / `keep` may change. Everything else shapes the running pods
(their command, resources, rendezvous), so the API server rejects such an update (CEL transition
rule `self == oldSelf`); to change it, delete the job and create a new one that resumes from the
same checkpoint URI.

The formats, bounds and CEL rules that the fields carry into the CRD live in `llmtrain.spec_constraints`.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from .catalog import ModelDims, instance_types, model_preset, model_presets
from .spec_constraints import (
    CHECKPOINT_URI_FIXED,
    CLUSTER_RULES,
    DNS_SUBDOMAIN,
    ENV_RULES,
    HOST_PORT,
    IMAGE_REFERENCE,
    IMMUTABLE,
    INSTANCE_TYPE_LABEL,
    INTERVAL_AUTO,
    LABEL_KEY,
    LABEL_VALUE,
    MAX_ENV,
    MAX_ENV_NAME,
    MAX_ENV_VALUE,
    MAX_TOLERATIONS,
    MAX_URI,
    MAX_VOLUMES,
    NODE_SELECTOR_RULES,
    PRIORITY_CLASS_NAME,
    QUEUE_NAME,
    IntervalMinutes,
    SnapshotInterval,
)

GROUP = "llmtrain.dev"
VERSION = "v1alpha1"
KIND = "LLMTrainingJob"
PLURAL = "llmtrainingjobs"
SINGULAR = "llmtrainingjob"
SHORT_NAMES = ["llmtj"]
API_VERSION = f"{GROUP}/{VERSION}"

DEFAULT_IMAGE = "public.ecr.aws/llmtrain/llmtrain-trainer:0.1.0"
# The training backends (llmtrain.backends, one module each): what runs an attempt's pods. The
# platform's default is the chart's backends.default (the operator's --default-backend).
BACKENDS = ("pytorchjob", "jobset", "job")
DEFAULT_BACKEND = "pytorchjob"
# The etcd the chart can install (release llmtrain in namespace llmtrain-system); the operator's
# --default-etcd-endpoint overrides it. Used when spec.rendezvous.endpoint is unset.
DEFAULT_ETCD_ENDPOINT = "llmtrain-etcd.llmtrain-system.svc:2379"

# Kueue's topology-aware scheduling: the node labels of an EKS Topology (network node layers of the
# EC2 instance topology API, outermost first) and the node itself.
TOPOLOGY_LEVELS = (
    "topology.k8s.aws/network-node-layer-1",
    "topology.k8s.aws/network-node-layer-2",
    "topology.k8s.aws/network-node-layer-3",
    "kubernetes.io/hostname",
)
# spec.resilience.inPlaceRestarts: torchrun's --max-restarts per pod and attempt. The cap: each
# in-place round reloads the newest checkpoint on the same nodes, and a fault that survived ten of
# them is the node's, which only a new attempt (avoiding it: status.avoidNodes) gets away from.
DEFAULT_IN_PLACE_RESTARTS = 3
MAX_IN_PLACE_RESTARTS = 10


class _Spec(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", use_enum_values=True)


class ShardingStrategy(str, Enum):
    FULL_SHARD = "FULL_SHARD"
    HYBRID_SHARD = "HYBRID_SHARD"
    SHARD_GRAD_OP = "SHARD_GRAD_OP"
    NO_SHARD = "NO_SHARD"


MixedPrecision = Literal["bf16", "fp16", "fp32"]
ActivationCheckpointing = Literal["none", "selective", "full"]
LrSchedule = Literal["cosine", "linear", "constant"]
RendezvousBackend = Literal["etcd", "etcd-v2", "c10d"]


class SecretKeyRef(_Spec):
    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN, description="Secret in the job's namespace")
    key: str = Field("token", min_length=1, max_length=253, description="key inside the Secret")


class RopeScalingSpec(_Spec):
    """RoPE scaling of Llama 3.1 / 3.2 / 3.3 (Hugging Face config.json `rope_scaling`, type llama3)."""

    rope_type: Literal["llama3"] = "llama3"
    factor: float = Field(gt=0)
    low_freq_factor: float = Field(gt=0)
    high_freq_factor: float = Field(gt=0)
    original_max_position_embeddings: int = Field(ge=1)


class Dims(_Spec):
    """Explicit Llama dimensions, instead of a preset."""

    hidden_size: int = Field(ge=8, le=65536)
    intermediate_size: int = Field(ge=8, le=262144)
    num_layers: int = Field(ge=1, le=512)
    num_heads: int = Field(ge=1, le=1024)
    num_kv_heads: int = Field(ge=1, le=1024)
    vocab_size: int = Field(ge=2, le=1_048_576)
    max_seq_len: int = Field(4096, ge=8, le=1_048_576)
    rope_theta: float = Field(10000.0, gt=0)
    norm_eps: float = Field(1e-5, gt=0, lt=1)
    rope_scaling: RopeScalingSpec | None = None


class ModelSpec(_Spec):
    preset: str | None = Field(
        None, json_schema_extra={"enum": list(model_presets())}, description="a Llama-family preset; or give dims"
    )
    dims: Dims | None = None
    pretrained_uri: str | None = Field(
        None, max_length=MAX_URI, description="Hugging Face-format safetensors: s3://, file://"
    )
    hf_token_secret_ref: SecretKeyRef | None = Field(
        None,
        description="accepted for compatibility and not passed to the pods: the trainer never "
        "contacts the Hugging Face Hub (pretrainedUri is s3:// or file://)",
    )


class DataSpec(_Spec):
    uri: str = Field(
        "synthetic", max_length=MAX_URI, description="s3://bucket/prefix/, file:///mnt/fsx/path, or synthetic"
    )
    seq_len: int | None = Field(
        None, ge=8, le=1_048_576, description="default: 2048, or the model's context length if shorter"
    )


class Volume(_Spec):
    """A PersistentVolumeClaim (FSx for Lustre, EBS...) mounted into every worker."""

    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    claim_name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)
    mount_path: str = Field(pattern=r"^/", max_length=1024)
    read_only: bool = False


class Toleration(_Spec):
    key: str | None = Field(None, max_length=316, pattern=LABEL_KEY)
    operator: Literal["Exists", "Equal"] = "Exists"
    value: str | None = Field(None, max_length=63, pattern=LABEL_VALUE)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None


class TopologySpec(_Spec):
    """Kueue topology-aware placement of all the job's nodes (pod-template annotations
    kueue.x-k8s.io/podset-required-topology or podset-preferred-topology)."""

    mode: Literal["required", "preferred"] = Field(
        description="required: all nodes under one domain of `level`, or wait in the queue; preferred: "
        "as few domains as Kueue can"
    )
    level: str = Field(
        json_schema_extra={"enum": list(TOPOLOGY_LEVELS)},
        description=(
            "the node label of the domain: topology.k8s.aws/network-node-layer-3 is the closest "
            "(one network spine block), layer-1 the widest; kubernetes.io/hostname one node"
        ),
    )


class ClusterSpec(_Spec):
    instance_type: str = Field(json_schema_extra={"enum": list(instance_types())})
    backend: str | None = Field(
        None,
        json_schema_extra={"enum": list(BACKENDS)},
        description="what runs the attempts' pods: pytorchjob (a Kubeflow PyTorchJob per attempt), jobset "
        "(a JobSet per attempt) or job (a batch/v1 Indexed Job and its headless Service per attempt); unset: "
        "the platform's default (the operator chart's backends.default, or backends.namespaceDefaults for this "
        "namespace). One the platform enabled (backends.enabled); immutable, recorded in status.backend",
    )
    nodes: int = Field(1, ge=1, le=4096)
    min_nodes: int | None = Field(None, ge=1, le=4096, description="elastic lower bound (default: nodes)")
    processes_per_node: int | None = Field(
        None, ge=1, le=64, description="CPU workers per node on instanceType cpu (GPU types: one per GPU)"
    )
    image: str = Field(
        DEFAULT_IMAGE,
        min_length=1,
        max_length=4096,
        pattern=IMAGE_REFERENCE,
        description="[registry/]repository[:tag][@digest]",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    node_selector: dict[str, Annotated[str, Field(max_length=63, pattern=LABEL_VALUE)]] = Field(
        default_factory=dict,
        max_length=64,
        json_schema_extra=NODE_SELECTOR_RULES,
        description=f"extra node labels to match ({INSTANCE_TYPE_LABEL} comes from instanceType)",
    )
    tolerations: list[Toleration] = Field(default_factory=list, max_length=MAX_TOLERATIONS)
    priority_class_name: str | None = Field(None, max_length=253, pattern=DNS_SUBDOMAIN)
    queue_name: str | None = Field(None, max_length=63, pattern=QUEUE_NAME, description="Kueue LocalQueue name")
    workload_priority_class: str | None = Field(
        None,
        max_length=63,
        pattern=PRIORITY_CLASS_NAME,
        description="Kueue WorkloadPriorityClass name "
        "(label kueue.x-k8s.io/priority-class): which queued job Kueue admits first and which it may "
        "preempt; needs queueName",
    )
    topology: TopologySpec | None = Field(None, description="Kueue topology-aware placement; needs queueName")
    scheduler_name: str | None = Field(None, max_length=253, pattern=DNS_SUBDOMAIN)
    service_account_name: str | None = Field(None, max_length=253, pattern=DNS_SUBDOMAIN)
    env: dict[Annotated[str, Field(max_length=MAX_ENV_NAME)], Annotated[str, Field(max_length=MAX_ENV_VALUE)]] = Field(
        default_factory=dict,
        max_length=MAX_ENV,
        json_schema_extra=ENV_RULES,
        description="extra env; overrides the NCCL preset",
    )
    volumes: list[Volume] = Field(default_factory=list, max_length=MAX_VOLUMES)


class FSDPSpec(_Spec):
    sharding_strategy: ShardingStrategy = ShardingStrategy.FULL_SHARD
    mixed_precision: MixedPrecision = "bf16"
    activation_checkpointing: ActivationCheckpointing = "selective"
    compile: bool = False
    cpu_offload: bool = False
    float8: bool = Field(
        False,
        description="train the transformer blocks' Linear layers in float8 (torchao "
        "dynamic scaling; needs GPUs with float8 tensor cores: H100/H200)",
    )


class TrainingSpec(_Spec):
    max_steps: int = Field(1000, ge=1)
    # Unset: derived from the model size, instance type and workers (llmtrain.defaults).
    global_batch_tokens: int | None = Field(
        None,
        ge=1,
        description="tokens per optimizer step, all ranks (default: derived from the model "
        "size and workers; one micro-step of every worker on cpu)",
    )
    micro_batch_size: int = Field(1, ge=1, le=4096, description="sequences per device per micro-step")
    learning_rate: float = Field(3e-4, gt=0, le=1)
    min_learning_rate: float | None = Field(
        None, ge=0, le=1, description="floor of the schedule (default: learningRate / 10)"
    )
    lr_schedule: LrSchedule = "cosine"
    warmup_steps: int | None = Field(None, ge=0, description="default: 10% of maxSteps, at most 100")
    weight_decay: float = Field(0.1, ge=0, le=1)
    grad_clip: float = Field(1.0, ge=0)
    seed: int = Field(0, ge=0)


class MemorySnapshotSpec(_Spec):
    """In-memory snapshots (the trainer's checkpoint/snapshots.py): every intervalSteps each rank
    copies its shard of the state into its pod's /dev/shm, which outlives the worker process, and
    sends a copy to its partner rank on the next node; a restart resumes from the newest snapshot
    every rank can get, without reading the durable checkpoint."""

    interval_steps: SnapshotInterval = Field(
        INTERVAL_AUTO,
        description='steps between snapshots, or "auto": every √(2 × blocking cost × MTBF), the blocking '
        "cost measured by the trainer on its snapshots (the copy into host memory), the MTBF the "
        "same as intervalMinutes auto uses",
    )
    partner: bool = Field(
        True,
        description="also keep a copy of each rank's snapshot on the next node (a ring), so a lost node's "
        "ranks restore from their partners; false: only the pod's own copy (an in-place restart)",
    )


class CheckpointSpec(_Spec):
    uri: str | None = Field(
        None,
        max_length=MAX_URI,
        description="s3://bucket/prefix/ or file:///mnt/fsx/ckpt; unset: no checkpoints; "
        "cannot be set, changed or removed once the job exists",
    )
    interval_minutes: IntervalMinutes = Field(
        60,
        description='minutes between time-based saves, or "auto": every √(2 × blocking cost × MTBF), '
        "the blocking cost measured by the trainer on its saves, the MTBF from the failures the "
        "operator has seen on the instance type (a prior from Llama 3's interruption rate); the "
        "chosen interval and why: status.checkpoint",
    )
    interval_steps: int = Field(0, ge=0, description="also save every N steps (0: by time only)")
    keep: int = Field(3, ge=1, le=1000)
    memory: MemorySnapshotSpec | None = Field(
        None,
        description="snapshots in host memory between durable checkpoints (needs uri); unset: off, "
        "every restart resumes from the newest durable checkpoint",
    )

    @property
    def auto(self) -> bool:
        return self.interval_minutes == INTERVAL_AUTO

    @property
    def fixed_interval_seconds(self) -> float | None:
        """The interval the spec sets, in seconds; None for auto."""
        m = self.interval_minutes
        return None if isinstance(m, str) else m * 60.0


class StragglersSpec(_Spec):
    """What the operator does about a straggler: a rank whose own compute is slower than the other
    ranks' (llmtrain/stragglers.py: its score, from rank 0's metrics), which makes every collective
    of the job wait for it."""

    action: Literal["report", "replace"] = Field(
        "report",
        description="report: a StragglerDetected condition naming the node and the measured slowdown, and an "
        "event; replace: also restart the job away from that node once the slowdown has lasted "
        "durationMinutes, when the time it would save over the rest of the run (remaining × (1 − 1/slowdown)) "
        "beats the measured cost of a restart (start-up and the work since the newest checkpoint); the event "
        "says which way it went",
    )
    threshold: float = Field(
        1.2,
        gt=1,
        le=10,
        description="a rank is a straggler when its compute time is this many times the median of the other "
        "ranks' (and the others measurably waited for it)",
    )
    duration_minutes: int = Field(
        10, ge=1, le=10080, description="how long the slowdown must last before replace acts (and the alert fires)"
    )
    max_replacements: int = Field(
        2,
        ge=0,
        le=100,
        description="replacements per job at most; they spend no restart of maxRestarts",
    )


class ResilienceSpec(_Spec):
    max_restarts: int = Field(10, ge=0, le=1000)
    hang_timeout_minutes: int = Field(30, ge=1, le=10080)
    startup_timeout_minutes: int = Field(
        30,
        ge=1,
        le=10080,
        description="an attempt whose pods are not all running by then is restarted "
        "(counts against maxRestarts); the pods' own reasons show in status.message",
    )
    collective_timeout_minutes: int = Field(10, ge=1, le=1440)
    in_place_restarts: int = Field(
        DEFAULT_IN_PLACE_RESTARTS,
        ge=0,
        le=MAX_IN_PLACE_RESTARTS,
        description="times per attempt each pod's torchrun restarts its failed worker processes in place "
        "(same pods, a new rendezvous round, resuming from the newest checkpoint) before the pod fails "
        "and the operator starts a new attempt; they do not count against maxRestarts and show in "
        "status.progress.inPlaceRestarts. Default 3: a crashed process (a transient NCCL error, a "
        "killed rank) is back in seconds instead of a new attempt's minutes, and a fault that comes "
        "back 3 times on the same pods is left to a new attempt, which avoids the node it blames. 0: off",
    )
    restart_backoff_seconds: int = Field(
        10,
        ge=0,
        le=86400,
        description="wait before the first restart after a failure; doubles with "
        "every restart spent, up to maxRestartBackoffSeconds; never less than the operator's "
        "--min-restart-backoff-seconds (5 s by default), which is also what 0 gives",
    )
    max_restart_backoff_seconds: int = Field(300, ge=0, le=86400, description="cap of the restart backoff")
    # Health rules (operator/llmtrain/controller/policy/health.py); each verdict is a status condition.
    first_step_timeout_minutes: int | None = Field(
        None,
        ge=1,
        le=10080,
        description="an attempt Running this long without its first optimizer "
        "step is restarted (reason NoFirstStep); default: hangTimeoutMinutes plus the time to read the "
        "model state at 100 MB/s per node (llmtrain.defaults)",
    )
    non_finite_loss_steps: int = Field(
        3,
        ge=0,
        le=100000,
        description="restart from the newest checkpoint before the first bad step "
        "after this many consecutive NaN/Inf losses (0: off)",
    )
    loss_spike_factor: float | None = Field(
        None,
        gt=1,
        le=1000,
        description="roll back to the newest checkpoint before a step whose loss "
        "exceeds this factor × the median of the previous lossSpikeWindow steps; the checkpoints from "
        "that step on are kept under <checkpoint.uri>/quarantine/ (unset: off)",
    )
    loss_spike_window: int = Field(
        100,
        ge=3,
        le=100000,
        description="steps in the loss median the spike "
        "rule compares against (read by the trainer when an attempt starts)",
    )
    loss_spike_min_steps: int = Field(
        100, ge=0, description="no spike verdict before this step (the loss falls fast and noisily early on)"
    )
    preflight: bool | None = Field(
        None,
        description="run the health check (GPUs, matmul, memory, all-reduce bandwidth) on every rank "
        "before training; a failing or slow node is avoided and the attempt retried without spending a "
        "restart. Unset: on for GPU jobs of 2 or more nodes",
    )
    stragglers: StragglersSpec = Field(
        default_factory=StragglersSpec,
        description="a rank slower than the others (the Slow and sick nodes page): report it, or replace its node",
    )


class RendezvousSpec(_Spec):
    backend: RendezvousBackend = "etcd-v2"
    endpoint: str | None = Field(
        None, max_length=261, pattern=HOST_PORT, description="etcd host:port (etcd backends); default: the operator's"
    )


class LLMTrainingJobSpec(_Spec):
    model: ModelSpec = Field(json_schema_extra=IMMUTABLE)
    data: DataSpec = Field(default_factory=DataSpec, json_schema_extra=IMMUTABLE)
    cluster: ClusterSpec = Field(json_schema_extra=CLUSTER_RULES)
    fsdp: FSDPSpec = Field(default_factory=FSDPSpec, json_schema_extra=IMMUTABLE)
    training: TrainingSpec = Field(default_factory=TrainingSpec, json_schema_extra=IMMUTABLE)
    # CEL on the section, not on the optional uri: a rule on an optional field only runs when the
    # field is present both before and after, so adding or removing it would slip through.
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, json_schema_extra=CHECKPOINT_URI_FIXED)
    resilience: ResilienceSpec = Field(default_factory=ResilienceSpec)
    rendezvous: RendezvousSpec = Field(default_factory=RendezvousSpec, json_schema_extra=IMMUTABLE)
    suspend: bool = Field(
        False,
        description="true: stop the running attempt (the trainer checkpoints on "
        "SIGTERM) and keep the restart budget; false again: resume from the newest "
        "checkpoint as a new attempt (Kueue's suspend semantics)",
    )

    def wire(self) -> dict[str, Any]:
        """The spec as it appears in the object (camelCase, defaults filled in)."""
        return self.model_dump(by_alias=True, mode="json", exclude_none=True)


def model_summary(model: ModelSpec) -> str:
    """What `kubectl get` shows as MODEL: the preset, or `custom-<layers>L-<hidden>h` for dims."""
    if model.preset:
        return model.preset
    if model.dims is not None:
        return f"custom-{model.dims.num_layers}L-{model.dims.hidden_size}h"
    return ""


def resolve_dims(model: ModelSpec) -> ModelDims:
    """The model's dimensions: the preset's, or the explicit ones (validation ensures exactly one)."""
    if model.dims is not None:
        return ModelDims(**model.dims.model_dump())
    return model_preset(model.preset or "")
