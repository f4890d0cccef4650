"""The semantic rules of an LLMTrainingJob, as a table: what the CRD schema cannot express.

Each rule is a small function over one `Subject` (the typed, resolved spec and what it is checked
against) that yields a `Problem` per thing it finds wrong: the field, why, and what would be
accepted. `RULES` lists them in the order their problems are reported; `run` tries every one and
returns every problem, not just the first. The `rule` mark records the fields a rule names, the
rules whose passing it needs (`needs`: the memory fit is only computed for a well-formed model), and
whether a problem ends the check (`stop`: an unknown instance type has no catalog entry to check
the rest against). The reference page docs/reference/validation.md is generated from the table
(scripts/gen-docs.py): the docstring's first line says what a rule checks, the rest why.

A new rule is a function here and a row in RULES, with its cases (a good spec, a bad one and the
exact message) in tests/operator_core/test_validation_table.py. validation.py parses the spec and
runs the table.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from .backends import BACKENDS
from .catalog import InstanceType, instance_types, model_presets
from .planner import plan_job, suggest_fit
from .snapshot_plan import host_fit_suggestions, host_memory, size
from .spec import DEFAULT_BACKEND, INSTANCE_TYPE_LABEL, LABEL_KEY, TOPOLOGY_LEVELS, LLMTrainingJobSpec, resolve_dims

if TYPE_CHECKING:
    from .validation import Policy

# A job's name limit is its backend's (backends.base.Backend.max_job_name; 45 on PyTorchJob).
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Variables the renderer and torchrun own; a user value would silently break the rendezvous.
RESERVED_ENV = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
}
RESERVED_ENV_PREFIXES = ("LLMTRAIN_", "PET_")
# Variables that make a program in the image load code from a path or a name the value gives (the
# dynamic loader, Python's import and startup hooks, shells' startup files, NCCL/libfabric/CUDA/
# OpenSSL plugins, PATH), or make the NVIDIA container runtime expose other devices: any of them
# runs code the allowed images never shipped. The chart's ValidatingAdmissionPolicy
# (templates/admission-job-env.yaml) refuses the same list at admission.
LOADER_ENV = frozenset(
    {
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "PYTHONUSERBASE",
        "PYTHONPLATLIBDIR",
        "PYTHONEXECUTABLE",
        "PYTHONINSPECT",
        "PYTHONBREAKPOINT",
        "PYTHONWARNINGS",
        "GCONV_PATH",
        "PATH",
        "BASH_ENV",
        "ENV",
        "NCCL_NET_PLUGIN",
        "NCCL_TUNER_PLUGIN",
        "NCCL_PROFILER_PLUGIN",
        "NCCL_CONF_FILE",
        "FI_PROVIDER_PATH",
        "CUDA_INJECTION64_PATH",
        "OPENSSL_CONF",
        "OPENSSL_MODULES",
        "OPENSSL_ENGINES",
    }
)
LOADER_ENV_PREFIXES = ("LD_", "NVIDIA_")
DATA_SCHEMES = ("synthetic", "s3://", "file://")
STORAGE_SCHEMES = ("s3://", "file://")
# GPU models (the catalog's `gpu` field) with float8 tensor cores, i.e. compute capability ≥ 8.9;
# A100 (8.0) has none. torchao's float8 training needs them.
FLOAT8_GPUS = ("H100", "H200")


@dataclass(frozen=True)
class Problem:
    field: str
    reason: str
    accepted: str

    def __str__(self) -> str:
        return f"{self.field}: {self.reason} (accepted: {self.accepted})"


@dataclass(frozen=True)
class Subject:
    """What every rule looks at: the parsed spec (defaults resolved), the job's name, the
    operator's default etcd endpoint and the cluster admin's allow-lists."""

    spec: LLMTrainingJobSpec
    name: str
    default_etcd_endpoint: str | None
    policy: Policy
    # the job's backend when it is already decided (the operator: status.backend, or the default it
    # gets now); None: spec.cluster.backend, else the default. `enabled`: the backends the platform
    # installed (the operator's --backend); None: any (offline)
    backend: str | None = None
    enabled: tuple[str, ...] | None = None

    @property
    def chosen_backend(self) -> str:
        return self.backend or self.spec.cluster.backend or DEFAULT_BACKEND

    @cached_property
    def instance(self) -> InstanceType:
        """The catalog entry of spec.cluster.instanceType (rules after `known_instance_type` only)."""
        return instance_types()[self.spec.cluster.instance_type]

    @cached_property
    def mounts(self) -> list[str]:
        """The volumes' mount paths, without a trailing '/'."""
        return [v.mount_path.rstrip("/") or "/" for v in self.spec.cluster.volumes]


@dataclass(frozen=True, eq=False)
class Rule:
    """One row of the table. `fields`: what its problems name (`<…>` stands for a key or an index).
    `needs`: it runs only when these rules ran and found nothing. `stop`: a problem here ends the
    check."""

    check: Callable[[Subject], Iterator[Problem]]
    fields: tuple[str, ...]
    needs: tuple[Rule, ...] = ()
    stop: bool = False

    @property
    def name(self) -> str:
        return self.check.__name__

    @property
    def doc(self) -> str:
        return self.check.__doc__ or ""

    def __call__(self, j: Subject) -> list[Problem]:
        return list(self.check(j))


def rule(*fields: str, needs: tuple[Rule, ...] = (), stop: bool = False):
    def mark(fn: Callable[[Subject], Iterator[Problem]]) -> Rule:
        return Rule(fn, fields, needs, stop)

    return mark


def shorten(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 5] + "…" + text[-4:]


def supports_float8(inst: InstanceType) -> bool:
    return inst.is_gpu and inst.gpu.startswith(FLOAT8_GPUS)


# --- who may run what (the cluster admin's allow-lists, validation.Policy) ------------------------


@rule("spec.cluster.image")
def allowed_image_registry(j: Subject) -> Iterator[Problem]:
    """The image comes from a registry the cluster allows (chart: `admission.allowedImageRegistries`).

    Without the allow-list anyone allowed to create an LLMTrainingJob could run any image through the
    operator. An entry matches the image itself or anything under it: `public.ecr.aws/llmtrain`
    allows `public.ecr.aws/llmtrain/llmtrain-trainer:0.1.0`, not `public.ecr.aws/llmtrain-x/...`.
    An empty list allows every image."""
    registries, image = j.policy.image_registries, j.spec.cluster.image
    if registries and not any(image == r.rstrip("/") or image.startswith(r.rstrip("/") + "/") for r in registries):
        yield Problem(
            "spec.cluster.image",
            f"{image!r} is not from a registry this cluster allows",
            "an image under " + " | ".join(registries),
        )


@rule("spec.cluster.serviceAccountName")
def allowed_service_account(j: Subject) -> Iterator[Problem]:
    """The ServiceAccount is one jobs may use (chart: `admission.allowedServiceAccounts`).

    Otherwise a job could run under any ServiceAccount of its namespace, with that account's API
    permissions. A job without serviceAccountName runs as the namespace's `default` and is always
    allowed; an empty list allows every account."""
    allowed, sa = j.policy.service_accounts, j.spec.cluster.service_account_name
    if allowed and sa is not None and sa not in allowed:
        yield Problem(
            "spec.cluster.serviceAccountName",
            f"{sa!r} is not a ServiceAccount jobs may use",
            " | ".join(allowed) + ", or leave it unset",
        )


@rule("spec.cluster.backend", stop=True)
def known_backend(j: Subject) -> Iterator[Problem]:
    """The job's backend is one llmtrain has (llmtrain/backends: pytorchjob, jobset).

    The CRD's enum says the same at `kubectl apply`; this repeats it for a CRD installed without
    the schema and for `llmtrain validate`. The name limit below depends on it."""
    if j.chosen_backend not in BACKENDS:
        yield Problem("spec.cluster.backend", f"unknown backend {shorten(j.chosen_backend)}", " | ".join(BACKENDS))


@rule("spec.cluster.backend", needs=(known_backend,))
def enabled_backend(j: Subject) -> Iterator[Problem]:
    """The job's backend is one the platform enabled (the operator chart's `backends.enabled`).

    The operator watches, creates and has RBAC for those kinds only; a job's own
    spec.cluster.backend, or the default chosen for it, must be among them."""
    chosen, enabled = j.chosen_backend, j.enabled
    if enabled is not None and chosen not in enabled:
        how = "" if j.spec.cluster.backend == chosen else " (the default chosen for the job: it names none)"
        yield Problem(
            "spec.cluster.backend",
            f"backend {chosen!r}{how} is not enabled on this platform",
            f"{' | '.join(enabled)} (the operator chart's backends.enabled), or have the platform enable "
            f"{chosen} (install {BACKENDS[chosen].installs} and add it there)",
        )


@rule("metadata.name", needs=(known_backend,))
def job_name(j: Subject) -> Iterator[Problem]:
    """The job's name can name what its backend makes of it: lower-case letters, digits and '-',
    starting with a letter, at most 45 characters on PyTorchJob, 37-40 on JobSet.

    Each attempt's objects are named after it, and each must be a DNS-1035 label of at most 63
    characters: Kubeflow's worker Services `<name>-a<attempt>-worker-<index>`; JobSet's pods
    `<name>-a<attempt>-worker-0-<index>-<5 characters>` (backends.base.Backend.name_problem)."""
    problem = BACKENDS[j.chosen_backend].name_problem(j.name, j.spec.cluster.nodes)
    if problem is not None:
        yield Problem("metadata.name", *problem)


# --- the model ------------------------------------------------------------------------------------


@rule("spec.model")
def preset_or_dims(j: Subject) -> Iterator[Problem]:
    """The model is given by exactly one of `preset` (a catalog model) and `dims` (its dimensions).

    Both would leave it open which one the trainer builds; neither names no model."""
    m = j.spec.model
    if (m.preset is None) == (m.dims is None):
        yield Problem(
            "spec.model",
            "give exactly one of preset and dims",
            f"preset: {' | '.join(model_presets())}, or dims: {{hiddenSize, ...}}",
        )


@rule("spec.model.preset", needs=(preset_or_dims,))
def known_preset(j: Subject) -> Iterator[Problem]:
    """The preset is one of the catalog's models (operator/llmtrain/data/models.yaml).

    The CRD's enum says the same at `kubectl apply`; this repeats it for a CRD installed without
    the schema and for `llmtrain validate`."""
    preset = j.spec.model.preset
    if preset is not None and preset not in model_presets():
        yield Problem("spec.model.preset", f"unknown preset {preset!r}", " | ".join(model_presets()))


@rule("spec.model.dims.numHeads", needs=(preset_or_dims,))
def heads_divide_hidden(j: Subject) -> Iterator[Problem]:
    """numHeads divides hiddenSize.

    Each attention head gets hiddenSize / numHeads of the hidden dimension."""
    d = j.spec.model.dims
    if d is not None and d.hidden_size % d.num_heads:
        yield Problem(
            "spec.model.dims.numHeads",
            f"hiddenSize {d.hidden_size} is not divisible by numHeads {d.num_heads}",
            "a divisor of hiddenSize",
        )


@rule("spec.model.dims.numHeads", needs=(heads_divide_hidden,))
def even_head_dim(j: Subject) -> Iterator[Problem]:
    """The head dimension hiddenSize / numHeads is even.

    Rotary position embeddings rotate the head dimension's values in pairs."""
    d = j.spec.model.dims
    if d is not None and (d.hidden_size // d.num_heads) % 2:
        yield Problem(
            "spec.model.dims.numHeads",
            "the head dimension hiddenSize/numHeads is odd; rotary embeddings rotate pairs",
            "numHeads giving an even head dimension",
        )


@rule("spec.model.dims.numKvHeads", needs=(preset_or_dims,))
def kv_heads_divide_heads(j: Subject) -> Iterator[Problem]:
    """numKvHeads divides numHeads.

    Grouped-query attention shares each key/value head among numHeads / numKvHeads query heads."""
    d = j.spec.model.dims
    if d is not None and d.num_heads % d.num_kv_heads:
        yield Problem(
            "spec.model.dims.numKvHeads",
            f"numHeads {d.num_heads} is not a multiple of numKvHeads {d.num_kv_heads} (grouped-query attention)",
            "a divisor of numHeads",
        )


MODEL_RULES = (preset_or_dims, known_preset, heads_divide_hidden, even_head_dim, kv_heads_divide_heads)


def _uri_problem(field: str, uri: str | None, schemes: tuple[str, ...]) -> list[Problem]:
    """`schemes` holds URI prefixes ("s3://") and bare keywords ("synthetic")."""
    prefixes = [s for s in schemes if s.endswith("://")]
    if uri is None or (uri in schemes and uri not in prefixes):
        return []
    if not any(uri.startswith(s) for s in prefixes):
        return [
            Problem(field, f"unsupported URI {uri!r}", " | ".join(s + "…" if s in prefixes else s for s in schemes))
        ]
    if uri in prefixes:
        return [Problem(field, f"{uri!r} names no bucket or path", f"{' | '.join(schemes)} with a path")]
    return []


@rule("spec.model.pretrainedUri", "spec.data.uri", "spec.checkpoint.uri")
def uri_schemes(j: Subject) -> Iterator[Problem]:
    """Each URI has a scheme the trainer reads and names a bucket or a path: `s3://…` or `file://…`,
    and for the data also `synthetic`.

    The trainer reads weights, tokens and checkpoints from S3 or from a mounted file system
    (FSx for Lustre, a PVC) and nowhere else."""
    s = j.spec
    yield from _uri_problem("spec.model.pretrainedUri", s.model.pretrained_uri, STORAGE_SCHEMES)
    yield from _uri_problem("spec.data.uri", s.data.uri, DATA_SCHEMES)
    yield from _uri_problem("spec.checkpoint.uri", s.checkpoint.uri, STORAGE_SCHEMES)


# --- the cluster ----------------------------------------------------------------------------------


@rule("spec.cluster.instanceType", stop=True)
def known_instance_type(j: Subject) -> Iterator[Problem]:
    """The instance type is one of the catalog's (operator/llmtrain/data/instances.yaml).

    The rules below it read the instance type's catalog entry (its GPUs, their memory, workers per
    node), so an unknown one ends the check here."""
    types = instance_types()
    if j.spec.cluster.instance_type not in types:
        yield Problem(
            "spec.cluster.instanceType", f"unknown instance type {j.spec.cluster.instance_type!r}", " | ".join(types)
        )


@rule("spec.cluster.minNodes")
def min_nodes(j: Subject) -> Iterator[Problem]:
    """minNodes, for an elastic job, is at most nodes.

    The job runs on between minNodes and nodes nodes."""
    c = j.spec.cluster
    if c.min_nodes is not None and c.min_nodes > c.nodes:
        yield Problem("spec.cluster.minNodes", f"{c.min_nodes} is more than nodes ({c.nodes})", f"1..{c.nodes}")


@rule("spec.cluster.workloadPriorityClass", "spec.cluster.topology")
def kueue_fields_need_a_queue(j: Subject) -> Iterator[Problem]:
    """workloadPriorityClass and topology come with queueName.

    They are read by Kueue, which only manages a job with a LocalQueue: without one they would be
    silently ignored."""
    c = j.spec.cluster
    for field, value in (("workloadPriorityClass", c.workload_priority_class), ("topology", c.topology)):
        if value is not None and not c.queue_name:
            yield Problem(
                f"spec.cluster.{field}",
                "is read by Kueue, which only manages a job with a queue",
                "set spec.cluster.queueName (the Kueue LocalQueue) too, or remove it",
            )


@rule("spec.cluster.topology.level")
def topology_level(j: Subject) -> Iterator[Problem]:
    """topology.level is a node label of EKS's network topology, or the host name.

    Kueue's topology-aware scheduling places the pods within one value of that label."""
    t = j.spec.cluster.topology
    if t is not None and t.level not in TOPOLOGY_LEVELS:
        yield Problem(
            "spec.cluster.topology.level", f"{shorten(t.level)} is not a topology level", " | ".join(TOPOLOGY_LEVELS)
        )


@rule("spec.cluster.processesPerNode")
def processes_per_node_on_cpu_only(j: Subject) -> Iterator[Problem]:
    """processesPerNode is only set on CPU instance types.

    On a GPU instance type there is one worker per GPU."""
    c, inst = j.spec.cluster, j.instance
    if c.processes_per_node is not None and inst.is_gpu:
        yield Problem(
            "spec.cluster.processesPerNode",
            f"{c.instance_type} runs one worker per GPU ({inst.gpus_per_node})",
            "leave it unset on GPU instance types",
        )


@rule("spec.cluster.env.<NAME>")
def env_names(j: Subject) -> Iterator[Problem]:
    """Each environment variable has a valid name that is neither set by torchrun or llmtrain nor
    one that loads code from outside the image.

    torchrun and llmtrain set RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
    MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID, LLMTRAIN_* and PET_* for every worker: a value of
    the job's own would break the rendezvous. Loader, import, startup and plugin variables (LD_*,
    NVIDIA_*, PYTHONPATH and the other PYTHON* hooks, PATH, BASH_ENV, ENV, GCONV_PATH,
    NCCL_NET_PLUGIN, NCCL_TUNER_PLUGIN, NCCL_PROFILER_PLUGIN, NCCL_CONF_FILE, FI_PROVIDER_PATH,
    CUDA_INJECTION64_PATH, OPENSSL_CONF, OPENSSL_MODULES, OPENSSL_ENGINES) would run code the
    allowed images never shipped; the chart's admission policy refuses the same list. One problem
    per variable, the first that applies."""
    for key in j.spec.cluster.env:
        if not ENV_NAME_RE.match(key):
            yield Problem(
                f"spec.cluster.env.{key}",
                "is not a valid environment variable name",
                "letters, digits and '_', not starting with a digit",
            )
        elif key in RESERVED_ENV or key.startswith(RESERVED_ENV_PREFIXES):
            yield Problem(
                f"spec.cluster.env.{key}",
                "is set by torchrun/llmtrain for every worker",
                "any other variable (NCCL_*, FI_* and your own)",
            )
        elif key in LOADER_ENV or key.startswith(LOADER_ENV_PREFIXES):
            yield Problem(
                f"spec.cluster.env.{key}",
                "would load code from outside the image (a loader, import, startup or plugin variable)",
                "put the code in the image; other variables (NCCL_* settings, FI_* settings, your own) are fine",
            )


@rule("spec.cluster.nodeSelector.<key>")
def node_selector_keys(j: Subject) -> Iterator[Problem]:
    """Each nodeSelector key is a valid label key, and not the instance-type label.

    The operator selects `node.kubernetes.io/instance-type` from spec.cluster.instanceType itself;
    a second value could only contradict it. One problem per key, the first that applies."""
    for key in j.spec.cluster.node_selector:
        if key == INSTANCE_TYPE_LABEL:
            yield Problem(
                f"spec.cluster.nodeSelector.{key}",
                "is set from spec.cluster.instanceType",
                "remove it; choose the instance type with spec.cluster.instanceType",
            )
        elif not re.match(LABEL_KEY, key) or len(key.rpartition("/")[0]) > 253:
            yield Problem(
                f"spec.cluster.nodeSelector.{key}",
                "is not a valid label key",
                "[prefix/]name: name ≤ 63 of letters, digits, '-', '_', '.'; prefix a DNS subdomain",
            )


def _duplicated(field: str, values: list[str]) -> Iterator[Problem]:
    dupes = sorted({v for v in values if values.count(v) > 1})
    if dupes:
        yield Problem(f"spec.cluster.volumes[].{field}", f"duplicated: {', '.join(dupes)}", "unique values")


@rule("spec.cluster.volumes[].name")
def unique_volume_names(j: Subject) -> Iterator[Problem]:
    """The volumes' names are unique.

    Each becomes a volume of the pod, and a pod's volumes need distinct names."""
    yield from _duplicated("name", [v.name for v in j.spec.cluster.volumes])


@rule("spec.cluster.volumes[].mountPath")
def unique_mount_paths(j: Subject) -> Iterator[Problem]:
    """The volumes' mount paths are unique (a trailing '/' does not make a path another).

    Two volumes cannot be mounted at one path of the container."""
    yield from _duplicated("mountPath", j.mounts)


@rule("spec.cluster.volumes[].mountPath")
def no_volume_at_dev_shm(j: Subject) -> Iterator[Problem]:
    """No volume is mounted at /dev/shm.

    The operator mounts a memory-backed volume there for the workers' shared memory."""
    if "/dev/shm" in j.mounts:
        yield Problem("spec.cluster.volumes[].mountPath", "/dev/shm is the workers' shared memory", "any other path")


@rule("spec.cluster.tolerations[<i>]", "spec.cluster.tolerations[<i>].value")
def toleration_operators(j: Subject) -> Iterator[Problem]:
    """A toleration with operator Equal has a key and a value; one with operator Exists has no value.

    Kubernetes refuses either when it creates the pods, long after the job was accepted."""
    for i, tol in enumerate(j.spec.cluster.tolerations):
        if tol.operator == "Equal" and (tol.key is None or tol.value is None):
            yield Problem(
                f"spec.cluster.tolerations[{i}]",
                "operator Equal needs a key and a value",
                "key + value, or operator Exists",
            )
        if tol.operator == "Exists" and tol.value is not None:
            yield Problem(
                f"spec.cluster.tolerations[{i}].value",
                "operator Exists takes no value",
                "remove value, or operator Equal",
            )


@rule("spec.data.uri", "spec.checkpoint.uri", "spec.model.pretrainedUri")
def file_uris_on_shared_volumes(j: Subject) -> Iterator[Problem]:
    """On GPU instance types, a file:// URI is under one of spec.cluster.volumes.

    A path in a pod is shared storage only if a volume (FSx for Lustre, a PVC) backs it; otherwise
    each pod would read and write its own empty disk. CPU jobs (the dev cluster) may use a node's
    own path."""
    if not j.instance.is_gpu:
        return
    s = j.spec
    for field, uri in (
        ("spec.data.uri", s.data.uri),
        ("spec.checkpoint.uri", s.checkpoint.uri),
        ("spec.model.pretrainedUri", s.model.pretrained_uri),
    ):
        if uri and uri.startswith("file://") and len(uri) > 7:
            path = uri[len("file://") :]
            if not any(path == mp or path.startswith(mp.rstrip("/") + "/") for mp in j.mounts):
                yield Problem(
                    field,
                    f"{path} is not under any volume of spec.cluster.volumes, so "
                    "each pod would see only its own empty disk",
                    f"a path under {', '.join(j.mounts) or 'a mounted FSx/PVC volume'}, or s3://",
                )


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


# --- resilience -----------------------------------------------------------------------------------


@rule("spec.checkpoint.memory")
def memory_snapshots_need_checkpoints(j: Subject) -> Iterator[Problem]:
    """checkpoint.memory needs a checkpoint.uri.

    In-memory snapshots supplement durable checkpoints, they do not replace them: a node lost with
    its partner, or the whole job, takes its snapshots with it, and without a durable checkpoint
    the next attempt would start the training over from step 0."""
    c = j.spec.checkpoint
    if c.memory is not None and not c.uri:
        yield Problem(
            "spec.checkpoint.memory",
            "in-memory snapshots supplement durable checkpoints: without spec.checkpoint.uri, a node lost "
            "together with its partner (or the whole job) would restart the training from step 0",
            "a spec.checkpoint.uri, or no spec.checkpoint.memory",
        )


@rule("spec.resilience.stragglers.action")
def straggler_replace_needs_checkpoints(j: Subject) -> Iterator[Problem]:
    """stragglers action replace needs a checkpoint.uri.

    A replacement restarts the job away from the slow node and resumes from the newest checkpoint;
    without checkpoints it would start the training over, which no slowdown is worth."""
    s = j.spec
    if s.resilience.stragglers.action == "replace" and not s.checkpoint.uri:
        yield Problem(
            "spec.resilience.stragglers.action",
            "replace restarts the job away from a slow node, and without spec.checkpoint.uri every restart "
            "starts the training over",
            "report, or a spec.checkpoint.uri",
        )


# --- rendezvous -----------------------------------------------------------------------------------


@rule("spec.rendezvous.endpoint")
def endpoint_port(j: Subject) -> Iterator[Problem]:
    """The rendezvous endpoint's port, when given, is a number 1..65535."""
    endpoint = j.spec.rendezvous.endpoint or ""
    port = endpoint.rpartition(":")[2] if ":" in endpoint else None
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
        yield Problem(
            "spec.rendezvous.endpoint", f"{j.spec.rendezvous.endpoint!r} has no valid port", "host:port, port 1..65535"
        )


@rule("spec.rendezvous.endpoint")
def etcd_endpoint(j: Subject) -> Iterator[Problem]:
    """The etcd backends (etcd, etcd-v2) have an endpoint: the spec's, or the operator's default.

    The default is the operator's `--default-etcd-endpoint` (chart: `defaultEtcdEndpoint`); an
    operator started with an empty one has none. c10d needs no etcd."""
    r = j.spec.rendezvous
    if r.backend.startswith("etcd") and not (r.endpoint or j.default_etcd_endpoint):
        yield Problem(
            "spec.rendezvous.endpoint",
            f"backend {r.backend} needs an etcd endpoint and the operator has no default",
            "host:port of an etcd (v2 API enabled), or backend c10d",
        )


RULES: tuple[Rule, ...] = (
    allowed_image_registry,
    allowed_service_account,
    known_backend,
    enabled_backend,
    job_name,
    *MODEL_RULES,
    uri_schemes,
    known_instance_type,
    min_nodes,
    kueue_fields_need_a_queue,
    topology_level,
    processes_per_node_on_cpu_only,
    env_names,
    node_selector_keys,
    unique_volume_names,
    unique_mount_paths,
    no_volume_at_dev_shm,
    toleration_operators,
    file_uris_on_shared_volumes,
    hybrid_shard_needs_nodes,
    float8_needs_float8_gpus,
    fp16_on_gpus_only,
    warmup_below_max_steps,
    min_lr_within_lr,
    batch_of_whole_micro_steps,
    seq_len_within_context,
    fits_in_memory,
    snapshots_fit_in_host_memory,
    straggler_replace_needs_checkpoints,
    memory_snapshots_need_checkpoints,
    endpoint_port,
    etcd_endpoint,
)


def run(j: Subject) -> list[Problem]:
    """Every problem the table finds, in its order."""
    found: list[Problem] = []
    passed: set[Rule] = set()
    for r in RULES:
        if not all(n in passed for n in r.needs):
            continue
        problems = r(j)
        found += problems
        if not problems:
            passed.add(r)
        elif r.stop:
            break
    return found
