"""Validation of an LLMTrainingJob: what is wrong, why, and what would be accepted.

Two layers. The CRD schema (generated from `spec.py`) lets the API server reject wrong types,
enums and bounds at `kubectl apply`. This module repeats that offline (`llmtrain validate`) and adds
what a schema cannot express: cross-field rules, URI schemes, the memory fit, batch arithmetic.
The operator runs the same checks and marks a job Failed with these messages.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic
import yaml

from .backends import BACKENDS
from .catalog import instance_types, model_presets
from .defaults import resolve
from .planner import plan_job, suggest_fit
from .spec import (
    API_VERSION,
    DEFAULT_BACKEND,
    DEFAULT_ETCD_ENDPOINT,
    DNS_SUBDOMAIN,
    HOST_PORT,
    IMAGE_REFERENCE,
    INSTANCE_TYPE_LABEL,
    INTERVAL_MINUTES_ACCEPTED,
    INTERVAL_MINUTES_ERROR,
    KIND,
    LABEL_KEY,
    LABEL_VALUE,
    PRIORITY_CLASS_NAME,
    QUEUE_NAME,
    TOPOLOGY_LEVELS,
    LLMTrainingJobSpec,
    resolve_dims,
)

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
INLINE_TOKEN_KEYS = ("hfToken", "huggingFaceToken", "token", "hf_token")
DATA_SCHEMES = ("synthetic", "s3://", "file://")
STORAGE_SCHEMES = ("s3://", "file://")


@dataclass(frozen=True)
class Problem:
    field: str
    reason: str
    accepted: str

    def __str__(self) -> str:
        return f"{self.field}: {self.reason} (accepted: {self.accepted})"


class InvalidJob(ValueError):
    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


@dataclass(frozen=True)
class Policy:
    """A cluster admin's allow-lists: which image registries and ServiceAccounts jobs may use.

    Without them anyone allowed to create an LLMTrainingJob could run any image under any
    ServiceAccount of the namespace through the operator. The chart's `admission.*` values reach
    the operator as the environment variables below (comma-separated); empty means no restriction.
    A registry entry matches the image itself or anything under it (`public.ecr.aws/llmtrain`
    allows `public.ecr.aws/llmtrain/llmtrain-trainer:0.1.0`, not `public.ecr.aws/llmtrain-x/...`).
    A job without serviceAccountName runs as the namespace's `default` and is always allowed.
    """

    image_registries: tuple[str, ...] = ()
    service_accounts: tuple[str, ...] = ()

    ENV_IMAGES = "LLMTRAIN_ALLOWED_IMAGE_REGISTRIES"
    ENV_SERVICE_ACCOUNTS = "LLMTRAIN_ALLOWED_SERVICE_ACCOUNTS"

    @classmethod
    def from_env(cls, env=None) -> Policy:
        env = os.environ if env is None else env

        def split(var):
            return tuple(x.strip() for x in env.get(var, "").replace(",", " ").split() if x.strip())

        return cls(split(cls.ENV_IMAGES), split(cls.ENV_SERVICE_ACCOUNTS))

    def problems(self, spec: LLMTrainingJobSpec) -> list[Problem]:
        p = []
        image = spec.cluster.image
        if self.image_registries and not any(
            image == r.rstrip("/") or image.startswith(r.rstrip("/") + "/") for r in self.image_registries
        ):
            p.append(
                Problem(
                    "spec.cluster.image",
                    f"{image!r} is not from a registry this cluster allows",
                    "an image under " + " | ".join(self.image_registries),
                )
            )
        sa = spec.cluster.service_account_name
        if self.service_accounts and sa is not None and sa not in self.service_accounts:
            p.append(
                Problem(
                    "spec.cluster.serviceAccountName",
                    f"{sa!r} is not a ServiceAccount jobs may use",
                    " | ".join(self.service_accounts) + ", or leave it unset",
                )
            )
        return p


@dataclass(frozen=True)
class Job:
    name: str
    namespace: str
    spec: LLMTrainingJobSpec
    document: dict


def _loc(loc: tuple) -> str:
    path = "spec"
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


# What each name/format pattern of spec.py means, in words: pydantic's own message for a mismatch
# is "String should match pattern '<regex>'", which tells a user nothing.
_STARTS_ENDS = "starting and ending with a letter or digit"
PATTERN_WORDS: dict[str, tuple[str, str]] = {
    DNS_SUBDOMAIN: (
        "is not a DNS subdomain",
        f"lowercase letters, digits, '-' and '.', {_STARTS_ENDS} (e.g. 'llmtrain-trainer')",
    ),
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$": (
        "is not a DNS label",
        f"up to 63 lowercase letters, digits and '-', {_STARTS_ENDS} (e.g. 'scratch-1')",
    ),
    QUEUE_NAME: (
        "is not a Kueue LocalQueue name",
        f"up to 63 lowercase letters, digits, '-' and '.', {_STARTS_ENDS} (e.g. 'team-a')",
    ),
    PRIORITY_CLASS_NAME: (
        "is not a Kueue WorkloadPriorityClass name",
        f"up to 63 lowercase letters, digits, '-' and '.', {_STARTS_ENDS} (e.g. 'production')",
    ),
    LABEL_KEY: (
        "is not a label key",
        f"[prefix/]name: a name of up to 63 letters, digits, '-', '_' and '.', {_STARTS_ENDS}; "
        "the prefix a DNS subdomain (e.g. 'example.com/pool')",
    ),
    LABEL_VALUE: ("is not a label value", f"empty, or up to 63 letters, digits, '-', '_' and '.', {_STARTS_ENDS}"),
    HOST_PORT: (
        "is not host:port",
        "a host name or IP, optionally ':' and a port number; no scheme or path (e.g. 'etcd.infra.svc:2379')",
    ),
    IMAGE_REFERENCE: (
        "is not a container image reference",
        "[registry[:port]/]path[:tag][@sha256:<digest>] with a lowercase path "
        "(e.g. 'public.ecr.aws/llmtrain/llmtrain-trainer:0.1.0')",
    ),
    r"^/": ("is not an absolute path", "a path starting with '/'"),
}


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 5] + "…" + text[-4:]


def _pydantic_problems(err: pydantic.ValidationError) -> list[Problem]:
    problems = []
    for e in err.errors():
        field = _loc(e["loc"])
        kind = e["type"]
        if kind == "extra_forbidden":
            problems.append(
                Problem(field, "unknown field", "the fields the CRD documents (kubectl explain llmtrainingjob.spec)")
            )
        elif kind == "missing":
            problems.append(Problem(field, "is required", "a value"))
        elif kind == INTERVAL_MINUTES_ERROR:
            problems.append(Problem(field, f"{_short(e['input'])} {e['msg']}", INTERVAL_MINUTES_ACCEPTED))
        elif kind in ("literal_error", "enum"):
            expected = e.get("ctx", {}).get("expected", "")
            problems.append(Problem(field, f"{e['input']!r} is not a known value", expected))
        elif kind == "string_pattern_mismatch":
            pattern = e.get("ctx", {}).get("pattern", "")
            reason, accepted = PATTERN_WORDS.get(
                pattern, ("does not have the required format", f"a string matching {pattern}")
            )
            problems.append(Problem(field, f"{_short(e['input'])} {reason}", accepted))
        elif "ctx" in e and any(k in e["ctx"] for k in ("ge", "gt", "le", "lt")):
            bound = ", ".join(
                f"{'≥>≤<'[['ge', 'gt', 'le', 'lt'].index(k)]} {v}"
                for k, v in e["ctx"].items()
                if k in ("ge", "gt", "le", "lt")
            )
            problems.append(Problem(field, f"{e['input']!r} is out of range", bound))
        else:
            problems.append(Problem(field, e["msg"], "see the CRD schema"))
    return problems


def _inline_token_problems(raw: dict) -> list[Problem]:
    model = raw.get("model") if isinstance(raw, dict) else None
    if not isinstance(model, dict):
        return []
    return [
        Problem(
            f"spec.model.{key}",
            "an inline Hugging Face token would be stored in plain text in the object",
            "spec.model.hfTokenSecretRef: {name: <Secret>, key: token}",
        )
        for key in INLINE_TOKEN_KEYS
        if key in model
    ]


def parse_spec(raw: dict) -> LLMTrainingJobSpec:
    """Turn the wire spec into the typed spec, or raise InvalidJob naming every bad field."""
    token = _inline_token_problems(raw)
    if token:
        raw = {**raw, "model": {k: v for k, v in raw["model"].items() if k not in INLINE_TOKEN_KEYS}}
    try:
        spec = resolve(LLMTrainingJobSpec.model_validate(raw))
    except pydantic.ValidationError as err:
        raise InvalidJob(token + _pydantic_problems(err)) from None
    if token:
        raise InvalidJob(token)
    return spec


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


# GPU models (the catalog's `gpu` field) with float8 tensor cores, i.e. compute capability ≥ 8.9;
# A100 (8.0) has none. torchao's float8 training needs them.
FLOAT8_GPUS = ("H100", "H200")


def supports_float8(inst) -> bool:
    return inst.is_gpu and inst.gpu.startswith(FLOAT8_GPUS)


def backend_problems(
    spec: LLMTrainingJobSpec, name: str, backend: str | None = None, enabled: tuple[str, ...] | None = None
) -> list[Problem]:
    """The job's backend (`backend`: the one chosen for it, else spec.cluster.backend or the default)
    must be one the platform enabled (`enabled`; None: any, as offline), and its name must fit the
    names that backend's objects get from it (backends.base.Backend.name_problem)."""
    chosen = backend or spec.cluster.backend or DEFAULT_BACKEND
    out: list[Problem] = []
    if chosen not in BACKENDS:
        return [Problem("spec.cluster.backend", f"unknown backend {_short(chosen)}", " | ".join(BACKENDS))]
    if enabled is not None and chosen not in enabled:
        how = "" if spec.cluster.backend == chosen else " (the default chosen for the job: it names none)"
        out.append(
            Problem(
                "spec.cluster.backend",
                f"backend {chosen!r}{how} is not enabled on this platform",
                f"{' | '.join(enabled)} (the operator chart's backends.enabled), or have the platform enable "
                f"{chosen} (install {BACKENDS[chosen].installs} and add it there)",
            )
        )
    problem = BACKENDS[chosen].name_problem(name, spec.cluster.nodes)
    if problem is not None:
        out.append(Problem("metadata.name", *problem))
    return out


def check(
    spec: LLMTrainingJobSpec,
    name: str = "job",
    default_etcd_endpoint: str | None = DEFAULT_ETCD_ENDPOINT,
    policy: Policy | None = None,
    backend: str | None = None,
    enabled: tuple[str, ...] | None = None,
) -> list[Problem]:
    """Semantic checks the schema cannot express. Returns every problem found, not just the first.
    `policy`: the allow-lists (default: from the environment, as the operator gets them);
    `backend`, `enabled`: backend_problems'."""
    p: list[Problem] = (policy if policy is not None else Policy.from_env()).problems(spec)
    p += backend_problems(spec, name, backend, enabled)

    m = spec.model
    if (m.preset is None) == (m.dims is None):
        p.append(
            Problem(
                "spec.model",
                "give exactly one of preset and dims",
                f"preset: {' | '.join(model_presets())}, or dims: {{hiddenSize, ...}}",
            )
        )
    elif m.preset is not None and m.preset not in model_presets():
        p.append(Problem("spec.model.preset", f"unknown preset {m.preset!r}", " | ".join(model_presets())))
    elif m.dims is not None:
        d = m.dims
        if d.hidden_size % d.num_heads:
            p.append(
                Problem(
                    "spec.model.dims.numHeads",
                    f"hiddenSize {d.hidden_size} is not divisible by numHeads {d.num_heads}",
                    "a divisor of hiddenSize",
                )
            )
        elif (d.hidden_size // d.num_heads) % 2:
            p.append(
                Problem(
                    "spec.model.dims.numHeads",
                    "the head dimension hiddenSize/numHeads is odd; rotary embeddings rotate pairs",
                    "numHeads giving an even head dimension",
                )
            )
        if d.num_heads % d.num_kv_heads:
            p.append(
                Problem(
                    "spec.model.dims.numKvHeads",
                    f"numHeads {d.num_heads} is not a multiple of "
                    f"numKvHeads {d.num_kv_heads} (grouped-query attention)",
                    "a divisor of numHeads",
                )
            )
    p += _uri_problem("spec.model.pretrainedUri", m.pretrained_uri, STORAGE_SCHEMES)

    p += _uri_problem("spec.data.uri", spec.data.uri, DATA_SCHEMES)
    p += _uri_problem("spec.checkpoint.uri", spec.checkpoint.uri, STORAGE_SCHEMES)

    c = spec.cluster
    types = instance_types()
    if c.instance_type not in types:
        p.append(Problem("spec.cluster.instanceType", f"unknown instance type {c.instance_type!r}", " | ".join(types)))
        return p  # everything below needs the catalog entry
    inst = types[c.instance_type]
    if c.min_nodes is not None and c.min_nodes > c.nodes:
        p.append(Problem("spec.cluster.minNodes", f"{c.min_nodes} is more than nodes ({c.nodes})", f"1..{c.nodes}"))
    for field, value in (("workloadPriorityClass", c.workload_priority_class), ("topology", c.topology)):
        if value is not None and not c.queue_name:
            p.append(
                Problem(
                    f"spec.cluster.{field}",
                    "is read by Kueue, which only manages a job with a queue",
                    "set spec.cluster.queueName (the Kueue LocalQueue) too, or remove it",
                )
            )
    if c.topology is not None and c.topology.level not in TOPOLOGY_LEVELS:
        p.append(
            Problem(
                "spec.cluster.topology.level",
                f"{_short(c.topology.level)} is not a topology level",
                " | ".join(TOPOLOGY_LEVELS),
            )
        )
    if c.processes_per_node is not None and inst.is_gpu:
        p.append(
            Problem(
                "spec.cluster.processesPerNode",
                f"{c.instance_type} runs one worker per GPU ({inst.gpus_per_node})",
                "leave it unset on GPU instance types",
            )
        )
    for key in c.env:
        if not ENV_NAME_RE.match(key):
            p.append(
                Problem(
                    f"spec.cluster.env.{key}",
                    "is not a valid environment variable name",
                    "letters, digits and '_', not starting with a digit",
                )
            )
        elif key in RESERVED_ENV or key.startswith(RESERVED_ENV_PREFIXES):
            p.append(
                Problem(
                    f"spec.cluster.env.{key}",
                    "is set by torchrun/llmtrain for every worker",
                    "any other variable (NCCL_*, FI_* and your own)",
                )
            )
        elif key in LOADER_ENV or key.startswith(LOADER_ENV_PREFIXES):
            p.append(
                Problem(
                    f"spec.cluster.env.{key}",
                    "would load code from outside the image (a loader, import, startup or plugin variable)",
                    "put the code in the image; other variables (NCCL_* settings, FI_* settings, your own) are fine",
                )
            )
    for key in c.node_selector:
        if key == INSTANCE_TYPE_LABEL:
            p.append(
                Problem(
                    f"spec.cluster.nodeSelector.{key}",
                    "is set from spec.cluster.instanceType",
                    "remove it; choose the instance type with spec.cluster.instanceType",
                )
            )
        elif not re.match(LABEL_KEY, key) or len(key.rpartition("/")[0]) > 253:
            p.append(
                Problem(
                    f"spec.cluster.nodeSelector.{key}",
                    "is not a valid label key",
                    "[prefix/]name: name ≤ 63 of letters, digits, '-', '_', '.'; prefix a DNS subdomain",
                )
            )
    mounts = [v.mount_path.rstrip("/") or "/" for v in c.volumes]
    for field, values in (("name", [v.name for v in c.volumes]), ("mountPath", mounts)):
        dupes = sorted({v for v in values if values.count(v) > 1})
        if dupes:
            p.append(Problem(f"spec.cluster.volumes[].{field}", f"duplicated: {', '.join(dupes)}", "unique values"))
    if "/dev/shm" in mounts:
        p.append(
            Problem("spec.cluster.volumes[].mountPath", "/dev/shm is the workers' shared memory", "any other path")
        )
    for i, tol in enumerate(c.tolerations):
        if tol.operator == "Equal" and (tol.key is None or tol.value is None):
            p.append(
                Problem(
                    f"spec.cluster.tolerations[{i}]",
                    "operator Equal needs a key and a value",
                    "key + value, or operator Exists",
                )
            )
        if tol.operator == "Exists" and tol.value is not None:
            p.append(
                Problem(
                    f"spec.cluster.tolerations[{i}].value",
                    "operator Exists takes no value",
                    "remove value, or operator Equal",
                )
            )
    if inst.is_gpu:  # a file:// path in a pod is only shared storage if a volume backs it
        for field, uri in (
            ("spec.data.uri", spec.data.uri),
            ("spec.checkpoint.uri", spec.checkpoint.uri),
            ("spec.model.pretrainedUri", m.pretrained_uri),
        ):
            if uri and uri.startswith("file://") and len(uri) > 7:
                path = uri[len("file://") :]
                if not any(path == mp or path.startswith(mp.rstrip("/") + "/") for mp in mounts):
                    p.append(
                        Problem(
                            field,
                            f"{path} is not under any volume of spec.cluster.volumes, so "
                            "each pod would see only its own empty disk",
                            f"a path under {', '.join(mounts) or 'a mounted FSx/PVC volume'}, or s3://",
                        )
                    )

    f = spec.fsdp
    if f.sharding_strategy == "HYBRID_SHARD" and min(c.nodes, c.min_nodes or c.nodes) < 2:
        p.append(
            Problem(
                "spec.fsdp.shardingStrategy",
                "HYBRID_SHARD shards within a node and replicates across nodes, so it needs at least 2 nodes",
                "FULL_SHARD on one node, or nodes ≥ 2",
            )
        )
    if f.float8 and not supports_float8(inst):
        fp8 = [n for n, it in types.items() if supports_float8(it)]
        p.append(
            Problem(
                "spec.fsdp.float8",
                f"{c.instance_type} has {inst.gpu if inst.is_gpu else 'no'} GPUs; "
                "float8 training needs float8 tensor cores (H100/H200)",
                f"float8: false, or instanceType {' | '.join(fp8)}",
            )
        )
    if f.mixed_precision == "fp16" and not inst.is_gpu:
        p.append(
            Problem(
                "spec.fsdp.mixedPrecision",
                "fp16 compute is not supported on CPU workers",
                "bf16 | fp32 on instanceType cpu",
            )
        )

    t = spec.training
    # parse_spec() resolved every defaulted field (defaults.resolve)
    assert t.warmup_steps is not None and t.global_batch_tokens is not None and spec.data.seq_len is not None
    if t.warmup_steps >= t.max_steps:
        p.append(
            Problem(
                "spec.training.warmupSteps",
                f"{t.warmup_steps} is not below maxSteps ({t.max_steps})",
                f"0..{t.max_steps - 1}",
            )
        )
    if t.min_learning_rate is not None and t.min_learning_rate > t.learning_rate:
        p.append(
            Problem(
                "spec.training.minLearningRate",
                f"{t.min_learning_rate} exceeds learningRate ({t.learning_rate})",
                f"0..{t.learning_rate}",
            )
        )
    world = c.nodes * inst.workers_per_node(c.processes_per_node)
    micro_tokens = spec.data.seq_len * t.micro_batch_size * world
    if t.global_batch_tokens % micro_tokens:
        lo = max(micro_tokens, t.global_batch_tokens // micro_tokens * micro_tokens)
        p.append(
            Problem(
                "spec.training.globalBatchTokens",
                f"{t.global_batch_tokens} is not a multiple of seqLen × microBatchSize × workers "
                f"= {spec.data.seq_len} × {t.micro_batch_size} × {world} = {micro_tokens}",
                f"a multiple of {micro_tokens}, e.g. {lo}",
            )
        )

    model_ok = not any(
        x.field in ("spec.model", "spec.model.preset") or x.field.startswith("spec.model.dims") for x in p
    )
    if model_ok:
        dims = resolve_dims(m)
        if spec.data.seq_len > dims.max_seq_len:
            p.append(
                Problem(
                    "spec.data.seqLen",
                    f"{spec.data.seq_len} exceeds the model's context length {dims.max_seq_len}",
                    f"8..{dims.max_seq_len}",
                )
            )
        plan = plan_job(spec)
        if not plan.fits:
            gib = 1024**3
            p.append(
                Problem(
                    "spec.cluster",
                    f"needs {plan.total_bytes / gib:.1f} GiB per device but "
                    f"{c.instance_type} has {plan.gpu_memory_bytes / gib:.0f} GiB "
                    f"(see `llmtrain plan`)",
                    suggest_fit(spec),
                )
            )

    r = spec.rendezvous
    port = (r.endpoint or "").rpartition(":")[2] if ":" in (r.endpoint or "") else None
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
        p.append(Problem("spec.rendezvous.endpoint", f"{r.endpoint!r} has no valid port", "host:port, port 1..65535"))
    if r.backend.startswith("etcd") and not (r.endpoint or default_etcd_endpoint):
        p.append(
            Problem(
                "spec.rendezvous.endpoint",
                f"backend {r.backend} needs an etcd endpoint and the operator has no default",
                "host:port of an etcd (v2 API enabled), or backend c10d",
            )
        )
    return p


def validate(
    raw_spec: dict,
    name: str = "job",
    default_etcd_endpoint: str | None = DEFAULT_ETCD_ENDPOINT,
    policy: Policy | None = None,
    backend: str | None = None,
    enabled: tuple[str, ...] | None = None,
) -> LLMTrainingJobSpec:
    spec = parse_spec(raw_spec)
    problems = check(spec, name, default_etcd_endpoint, policy, backend, enabled)
    if problems:
        raise InvalidJob(problems)
    return spec


_A_JOB = f"a YAML mapping with apiVersion: {API_VERSION}, kind: {KIND}, metadata and spec"


def load_documents(path: str | Path) -> list[dict[str, Any]]:
    """The non-empty YAML documents of a file ('-': stdin), each a mapping. A syntax error or a
    document that is a list or a scalar is an InvalidJob naming the file, not a traceback further on."""
    text = Path(path).read_text() if str(path) != "-" else __import__("sys").stdin.read()
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise InvalidJob(
            [Problem(str(path), f"is not valid YAML{at}: {getattr(err, 'problem', None) or err}", _A_JOB)]
        ) from None
    for i, d in enumerate(docs, 1):
        if not isinstance(d, dict):
            which = f"document {i}" if len(docs) > 1 else "its YAML"
            kind = {list: "a list", str: "a string", bool: "a boolean"}.get(type(d), "a number")
            raise InvalidJob(
                [Problem(str(path), f"{which} is {kind}, but an LLMTrainingJob mapping was expected", _A_JOB)]
            )
    return [d for d in docs if d]


def job_from_document(
    doc: dict,
    default_etcd_endpoint: str | None = DEFAULT_ETCD_ENDPOINT,
    policy: Policy | None = None,
    backend: str | None = None,
) -> Job:
    """`backend`: the platform's default, for a job whose spec names none."""
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
        raise InvalidJob(
            [
                Problem(
                    "apiVersion/kind",
                    f"{doc.get('apiVersion')}/{doc.get('kind')} is not an LLMTrainingJob",
                    f"apiVersion: {API_VERSION}, kind: {KIND}",
                )
            ]
        )
    meta = doc.get("metadata") or {}
    name = meta.get("name") or ""
    raw = doc.get("spec") or {}
    cluster = raw.get("cluster") if isinstance(raw, dict) else None
    requested = cluster.get("backend") if isinstance(cluster, dict) else None
    spec = validate(raw, name, default_etcd_endpoint, policy, requested if isinstance(requested, str) else backend)
    return Job(name=name, namespace=meta.get("namespace") or "default", spec=spec, document=doc)


def read_job_document(path: str | Path) -> dict:
    """The single LLMTrainingJob document in a YAML file (other kinds in the file are ignored)."""
    docs = [d for d in load_documents(path) if d.get("kind") == KIND]
    if len(docs) != 1:
        raise InvalidJob([Problem(str(path), f"holds {len(docs)} LLMTrainingJobs", "exactly one")])
    return docs[0]


def load_job(
    path: str | Path,
    default_etcd_endpoint: str | None = DEFAULT_ETCD_ENDPOINT,
    policy: Policy | None = None,
    backend: str | None = None,
) -> Job:
    """Read and validate the single LLMTrainingJob in a YAML file (`backend`: job_from_document's)."""
    return job_from_document(read_job_document(path), default_etcd_endpoint, policy, backend)
