"""The validation rules (llmtrain/validation_rules/) as a table, no cluster: for each rule a good
spec and bad ones, with the exact problems, each written as `field: why (accepted: what)` from the
rule's words, not from running it. Each case is checked twice: the rule alone says exactly
`problems`, and the whole check (every rule, in the table's order, with `needs` and `stop`) says
exactly `check` (by default the same: the spec fails for that rule's reason alone).

Figures that are another module's answer come from that module: the catalog's lists (presets,
instance types) and the planner's memory estimate and suggestion.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest

from llmtrain.catalog import instance_types, model_presets
from llmtrain.planner import plan_job, suggest_fit
from llmtrain.snapshot_plan import host_fit_suggestions, host_memory, size
from llmtrain.spec import DEFAULT_ETCD_ENDPOINT
from llmtrain.validation import Policy, check, parse_spec
from llmtrain.validation_rules import (
    RULES,
    Rule,
    Subject,
    allowed_image_registry,
    allowed_service_account,
    batch_of_whole_micro_steps,
    enabled_backend,
    endpoint_port,
    env_names,
    etcd_endpoint,
    even_head_dim,
    file_uris_on_shared_volumes,
    fits_in_memory,
    float8_needs_float8_gpus,
    fp16_on_gpus_only,
    heads_divide_hidden,
    hybrid_shard_needs_nodes,
    job_name,
    known_backend,
    known_instance_type,
    known_preset,
    kueue_fields_need_a_queue,
    kv_heads_divide_heads,
    memory_snapshots_need_checkpoints,
    min_lr_within_lr,
    min_nodes,
    no_volume_at_dev_shm,
    node_selector_keys,
    preset_or_dims,
    processes_per_node_on_cpu_only,
    seq_len_within_context,
    snapshots_fit_in_host_memory,
    straggler_replace_needs_checkpoints,
    toleration_operators,
    topology_level,
    unique_mount_paths,
    unique_volume_names,
    uri_schemes,
    warmup_below_max_steps,
)

from .invalid_cases import spec_with

# 2 × p5.48xlarge = 16 workers: one micro-step of seqLen 4096 is 65,536 tokens; BASE's batch is 4 of them.
# llama2-70b fits 4 × p4de's GPUs; its snapshots, their partner copies and the S3 staging do not fit the
# nodes' memory (4 × 8 ranks: 12 × 69 B / 32 = 26 GB a rank, 207 GB a node, six times over)
P4DE_70B = {
    "model": {"preset": "llama2-70b"},
    "cluster": {"instanceType": "p4de.24xlarge", "nodes": 4},
    "fsdp": {"activationCheckpointing": "full"},
    "training": {"globalBatchTokens": 4096 * 32 * 4},
    "checkpoint": {"memory": {}},
}
CPU = {
    "model": {"preset": "tiny"},
    "data": {"seqLen": 128},
    "cluster": {"instanceType": "cpu", "nodes": 1},  # 2 workers (data/instances.yaml)
    "training": {"globalBatchTokens": 128 * 2 * 4},
}
PRESETS = " | ".join(model_presets())
TYPES = " | ".join(instance_types())
LEVELS = (
    "topology.k8s.aws/network-node-layer-1 | topology.k8s.aws/network-node-layer-2 | "
    "topology.k8s.aws/network-node-layer-3 | kubernetes.io/hostname"
)
ALLOWED = Policy(("public.ecr.aws/llmtrain", "111122223333.dkr.ecr.us-east-1.amazonaws.com/"), ("llmtrain-trainer",))
NAME_WORDS = "lower-case letters, digits and '-', starting with a letter, ≤ 45 characters"
SHARED = "is not under any volume of spec.cluster.volumes, so each pod would see only its own empty disk"


def dims(hidden: int, heads: int, kv: int, **more) -> dict:
    return {
        "dims": {
            "hiddenSize": hidden,
            "intermediateSize": 256,
            "numLayers": 2,
            "numHeads": heads,
            "numKvHeads": kv,
            "vocabSize": 256,
            **more,
        }
    }


def cpu(**sections) -> dict:
    return {s: {**CPU.get(s, {}), **sections.get(s, {})} for s in {*CPU, *sections}}


def vols(*mounts: str, name=None) -> list[dict]:
    return [{"name": name or f"v{i}", "claimName": f"c{i}", "mountPath": m} for i, m in enumerate(mounts)]


@dataclass
class Case:
    id: str
    rule: Rule
    overrides: dict  # on invalid_cases.BASE (spec_with); `raw` replaces it
    problems: list[str] = field(default_factory=list)  # [] : a good spec for this rule
    check: list[str] | None = None  # the whole check's problems; None: the same as `problems`
    name: str = "job"
    policy: Policy = field(default_factory=Policy)
    etcd: str | None = DEFAULT_ETCD_ENDPOINT
    raw: dict | None = None
    backend: str | None = None  # the job's backend, chosen already (Subject.backend)
    enabled: tuple[str, ...] | None = None  # the platform's backends (Subject.enabled)


CASES = [
    # --- allow-lists ---
    Case(
        "an image under an allowed registry",
        allowed_image_registry,
        {"cluster": {"image": "public.ecr.aws/llmtrain/llmtrain-trainer:0.1.0"}},
        policy=ALLOWED,
    ),
    Case("no allow-list: any image", allowed_image_registry, {"cluster": {"image": "docker.io/someone/x:1"}}),
    Case(
        "a registry that only starts like an allowed one",
        allowed_image_registry,
        {"cluster": {"image": "public.ecr.aws/llmtrain-evil/trainer:1"}},
        [
            "spec.cluster.image: 'public.ecr.aws/llmtrain-evil/trainer:1' is not from a registry this cluster "
            "allows (accepted: an image under public.ecr.aws/llmtrain | 111122223333.dkr.ecr.us-east-1.amazonaws.com/)"
        ],
        policy=ALLOWED,
    ),
    Case(
        "no serviceAccountName: the namespace's default, always allowed",
        allowed_service_account,
        {"cluster": {"image": "public.ecr.aws/llmtrain/t:1"}},
        policy=ALLOWED,
    ),
    Case(
        "a ServiceAccount not on the list",
        allowed_service_account,
        {"cluster": {"serviceAccountName": "admin"}},
        [
            "spec.cluster.serviceAccountName: 'admin' is not a ServiceAccount jobs may use "
            "(accepted: llmtrain-trainer, or leave it unset)"
        ],
        policy=Policy((), ("llmtrain-trainer",)),
    ),
    # --- the backend ---
    Case("no backend named: the default", known_backend, {}),
    Case("jobset", known_backend, {"cluster": {"backend": "jobset"}}),
    Case("job", known_backend, {"cluster": {"backend": "job"}}),
    Case(
        "a backend llmtrain does not have",
        known_backend,
        {"cluster": {"backend": "trainjob"}},
        ["spec.cluster.backend: unknown backend 'trainjob' (accepted: pytorchjob | jobset | job)"],
    ),
    Case("any backend, offline", enabled_backend, {"cluster": {"backend": "jobset"}}),
    Case("an enabled one", enabled_backend, {"cluster": {"backend": "jobset"}}, enabled=("pytorchjob", "jobset")),
    Case(
        "one the platform did not enable",
        enabled_backend,
        {"cluster": {"backend": "jobset"}},
        [
            "spec.cluster.backend: backend 'jobset' is not enabled on this platform (accepted: pytorchjob "
            "(the operator chart's backends.enabled), or have the platform enable jobset (install JobSet (its CRD "
            "and controller, with its webhooks) and add it there))"
        ],
        enabled=("pytorchjob",),
    ),
    Case(
        "the default chosen for a job that names none, not enabled",
        enabled_backend,
        {},
        [
            "spec.cluster.backend: backend 'jobset' (the default chosen for the job: it names none) is not enabled "
            "on this platform (accepted: pytorchjob (the operator chart's backends.enabled), or have the platform "
            "enable jobset (install JobSet (its CRD and controller, with its webhooks) and add it there))"
        ],
        backend="jobset",
        enabled=("pytorchjob",),
    ),
    # --- the job's name ---
    Case("a name of 45 characters", job_name, {}, name="a" * 45),
    Case(
        "a name of 46 characters",
        job_name,
        {},
        [
            f"metadata.name: '{'x' * 46}' cannot name the worker Services (<name>-worker-<n> must be a "
            f"DNS-1035 label) (accepted: {NAME_WORDS})"
        ],
        name="x" * 46,
    ),
    Case(
        "a name starting with a digit",
        job_name,
        {},
        [
            "metadata.name: '7b-run' cannot name the worker Services (<name>-worker-<n> must be a DNS-1035 "
            f"label) (accepted: {NAME_WORDS})"
        ],
        name="7b-run",
    ),
    # JobSet's pods are <name>-a<attempt>-worker-0-<index>-<5 characters>: 40 for 2 nodes, attempt 9999
    Case("a JobSet job's name of 40 characters", job_name, {"cluster": {"backend": "jobset"}}, name="j" * 40),
    Case(
        "a JobSet job's name of 41 characters",
        job_name,
        {"cluster": {"backend": "jobset"}},
        [
            f"metadata.name: '{'j' * 41}' is too long for backend jobset: pod 1 would be named "
            f"'{'j' * 41}-a9999-worker-0-1-abcde' (64 characters; a DNS-1035 label has at most 63) (accepted: "
            "lower-case letters, digits and '-', starting with a letter, ≤ 40 characters on jobset)"
        ],
        name="j" * 41,
    ),
    # --- the model ---
    Case("a preset", preset_or_dims, {}),
    Case("dims", preset_or_dims, {"model": dims(128, 8, 4)}),
    Case(
        "neither preset nor dims",
        preset_or_dims,
        {"model": {}},
        [
            f"spec.model: give exactly one of preset and dims (accepted: preset: {PRESETS}, "
            "or dims: {hiddenSize, ...})"
        ],
    ),
    Case(
        "both preset and dims: nothing that needs the model is checked (seqLen beyond any context)",
        preset_or_dims,
        {
            "model": {"preset": "llama2-7b", **dims(128, 8, 4)},
            "data": {"seqLen": 65536},
            "training": {"globalBatchTokens": 65536 * 16},
        },
        [
            f"spec.model: give exactly one of preset and dims (accepted: preset: {PRESETS}, "
            "or dims: {hiddenSize, ...})"
        ],
    ),
    Case("a catalog preset", known_preset, {"model": {"preset": "llama3-8b"}}),
    Case(
        "an unknown preset",
        known_preset,
        {"model": {"preset": "llama9"}},
        [f"spec.model.preset: unknown preset 'llama9' (accepted: {PRESETS})"],
    ),
    Case("heads divide hidden", heads_divide_hidden, {"model": dims(128, 8, 8)}),
    Case(
        "100 / 3",
        heads_divide_hidden,
        {"model": dims(100, 3, 3)},
        ["spec.model.dims.numHeads: hiddenSize 100 is not divisible by numHeads 3 (accepted: a divisor of hiddenSize)"],
    ),
    Case("head dimension 16", even_head_dim, {"model": dims(128, 8, 8)}),
    Case(
        "head dimension 3",
        even_head_dim,
        {"model": dims(96, 32, 32)},
        [
            "spec.model.dims.numHeads: the head dimension hiddenSize/numHeads is odd; rotary embeddings rotate "
            "pairs (accepted: numHeads giving an even head dimension)"
        ],
    ),
    Case("8 heads in 4 groups", kv_heads_divide_heads, {"model": dims(128, 8, 4)}),
    Case(
        "8 heads in 3 groups",
        kv_heads_divide_heads,
        {"model": dims(128, 8, 3)},
        [
            "spec.model.dims.numKvHeads: numHeads 8 is not a multiple of numKvHeads 3 (grouped-query attention) "
            "(accepted: a divisor of numHeads)"
        ],
    ),
    # --- URIs ---
    Case("s3:// URIs", uri_schemes, {"model": {"preset": "llama2-7b", "pretrainedUri": "s3://b/weights/"}}),
    Case("synthetic data", uri_schemes, {"data": {"uri": "synthetic"}}),
    Case(
        "gs:// data",
        uri_schemes,
        {"data": {"uri": "gs://bucket/tokens/"}},
        ["spec.data.uri: unsupported URI 'gs://bucket/tokens/' (accepted: synthetic | s3://… | file://…)"],
    ),
    Case(
        "each URI, in the order weights, data, checkpoints",
        uri_schemes,
        {
            "model": {"preset": "llama2-7b", "pretrainedUri": "https://example.com/model"},
            "data": {"uri": "synthetic://"},
            "checkpoint": {"uri": "s3://"},
        },
        [
            "spec.model.pretrainedUri: unsupported URI 'https://example.com/model' (accepted: s3://… | file://…)",
            "spec.data.uri: unsupported URI 'synthetic://' (accepted: synthetic | s3://… | file://…)",
            "spec.checkpoint.uri: 's3://' names no bucket or path (accepted: s3:// | file:// with a path)",
        ],
    ),
    # --- the cluster ---
    Case("a catalog instance type", known_instance_type, {"cluster": {"instanceType": "p5e.48xlarge"}}),
    Case(
        "an unknown instance type ends the check (the warmup problem after it is not reported)",
        known_instance_type,
        {"cluster": {"instanceType": "p9.48xlarge"}, "training": {"warmupSteps": 100}},
        [f"spec.cluster.instanceType: unknown instance type 'p9.48xlarge' (accepted: {TYPES})"],
    ),
    Case(
        "the problems before the instance type are still reported",
        known_instance_type,
        {"cluster": {"instanceType": "p9.48xlarge"}, "data": {"uri": "gs://b/t"}},
        [f"spec.cluster.instanceType: unknown instance type 'p9.48xlarge' (accepted: {TYPES})"],
        check=[
            "spec.data.uri: unsupported URI 'gs://b/t' (accepted: synthetic | s3://… | file://…)",
            f"spec.cluster.instanceType: unknown instance type 'p9.48xlarge' (accepted: {TYPES})",
        ],
    ),
    Case("minNodes 1 of 2", min_nodes, {"cluster": {"minNodes": 1}}),
    Case(
        "minNodes 3 of 2",
        min_nodes,
        {"cluster": {"minNodes": 3}},
        ["spec.cluster.minNodes: 3 is more than nodes (2) (accepted: 1..2)"],
    ),
    Case(
        "a priority class with a queue",
        kueue_fields_need_a_queue,
        {"cluster": {"queueName": "team-a", "workloadPriorityClass": "production"}},
    ),
    Case(
        "a priority class and a topology without a queue",
        kueue_fields_need_a_queue,
        {
            "cluster": {
                "workloadPriorityClass": "production",
                "topology": {"mode": "required", "level": "kubernetes.io/hostname"},
            }
        },
        [
            "spec.cluster.workloadPriorityClass: is read by Kueue, which only manages a job with a queue "
            "(accepted: set spec.cluster.queueName (the Kueue LocalQueue) too, or remove it)",
            "spec.cluster.topology: is read by Kueue, which only manages a job with a queue "
            "(accepted: set spec.cluster.queueName (the Kueue LocalQueue) too, or remove it)",
        ],
    ),
    Case(
        "one network spine block",
        topology_level,
        {
            "cluster": {
                "queueName": "q",
                "topology": {"mode": "required", "level": "topology.k8s.aws/network-node-layer-3"},
            }
        },
    ),
    Case(
        "a rack",
        topology_level,
        {"cluster": {"queueName": "q", "topology": {"mode": "preferred", "level": "rack"}}},
        [f"spec.cluster.topology.level: 'rack' is not a topology level (accepted: {LEVELS})"],
    ),
    Case("4 processes per CPU node", processes_per_node_on_cpu_only, {}, raw=cpu(cluster={"processesPerNode": 4})),
    Case(
        "4 processes per p5 node",
        processes_per_node_on_cpu_only,
        {"cluster": {"processesPerNode": 4}},
        [
            "spec.cluster.processesPerNode: p5.48xlarge runs one worker per GPU (8) "
            "(accepted: leave it unset on GPU instance types)"
        ],
    ),
    Case("NCCL settings and the job's own", env_names, {"cluster": {"env": {"NCCL_DEBUG": "INFO", "my_flag": "1"}}}),
    Case(
        "MASTER_ADDR",
        env_names,
        {"cluster": {"env": {"MASTER_ADDR": "10.0.0.1"}}},
        [
            "spec.cluster.env.MASTER_ADDR: is set by torchrun/llmtrain for every worker "
            "(accepted: any other variable (NCCL_*, FI_* and your own))"
        ],
    ),
    Case(
        "one problem per variable, in the spec's order",
        env_names,
        {
            "cluster": {
                "env": {"LD_PRELOAD": "/x.so", "OK": "1", "2FAST": "1", "PET_NNODES": "9", "NCCL_NET_PLUGIN": "x"}
            }
        },
        [
            "spec.cluster.env.LD_PRELOAD: would load code from outside the image (a loader, import, startup or "
            "plugin variable) (accepted: put the code in the image; other variables (NCCL_* settings, FI_* "
            "settings, your own) are fine)",
            "spec.cluster.env.2FAST: is not a valid environment variable name "
            "(accepted: letters, digits and '_', not starting with a digit)",
            "spec.cluster.env.PET_NNODES: is set by torchrun/llmtrain for every worker "
            "(accepted: any other variable (NCCL_*, FI_* and your own))",
            "spec.cluster.env.NCCL_NET_PLUGIN: would load code from outside the image (a loader, import, startup "
            "or plugin variable) (accepted: put the code in the image; other variables (NCCL_* settings, FI_* "
            "settings, your own) are fine)",
        ],
    ),
    Case("a prefixed label", node_selector_keys, {"cluster": {"nodeSelector": {"example.com/pool": "a"}}}),
    Case(
        "the instance-type label",
        node_selector_keys,
        {"cluster": {"nodeSelector": {"node.kubernetes.io/instance-type": "p4d.24xlarge"}}},
        [
            "spec.cluster.nodeSelector.node.kubernetes.io/instance-type: is set from spec.cluster.instanceType "
            "(accepted: remove it; choose the instance type with spec.cluster.instanceType)"
        ],
    ),
    Case(
        "a key with a space, and a prefix of 254 characters",
        node_selector_keys,
        {"cluster": {"nodeSelector": {"bad key!": "x", "a." * 126 + "ab/pool": "y"}}},
        [
            "spec.cluster.nodeSelector.bad key!: is not a valid label key (accepted: [prefix/]name: name ≤ 63 of "
            "letters, digits, '-', '_', '.'; prefix a DNS subdomain)",
            f"spec.cluster.nodeSelector.{'a.' * 126}ab/pool: is not a valid label key (accepted: [prefix/]name: "
            "name ≤ 63 of letters, digits, '-', '_', '.'; prefix a DNS subdomain)",
        ],
    ),
    Case("two volumes", unique_volume_names, {"cluster": {"volumes": vols("/data", "/scratch")}}),
    Case(
        "two volumes named a",
        unique_volume_names,
        {"cluster": {"volumes": vols("/data", "/scratch", name="a")}},
        ["spec.cluster.volumes[].name: duplicated: a (accepted: unique values)"],
    ),
    Case("two mount paths", unique_mount_paths, {"cluster": {"volumes": vols("/data", "/data2")}}),
    Case(
        "/data and /data/",
        unique_mount_paths,
        {"cluster": {"volumes": vols("/data", "/data/")}},
        ["spec.cluster.volumes[].mountPath: duplicated: /data (accepted: unique values)"],
    ),
    Case(
        "a name and a path twice: both rules, names first",
        unique_volume_names,
        {"cluster": {"volumes": vols("/data", "/data/", name="a")}},
        ["spec.cluster.volumes[].name: duplicated: a (accepted: unique values)"],
        check=[
            "spec.cluster.volumes[].name: duplicated: a (accepted: unique values)",
            "spec.cluster.volumes[].mountPath: duplicated: /data (accepted: unique values)",
        ],
    ),
    Case("a volume at /dev/shm2", no_volume_at_dev_shm, {"cluster": {"volumes": vols("/dev/shm2")}}),
    Case(
        "a volume at /dev/shm/",
        no_volume_at_dev_shm,
        {"cluster": {"volumes": vols("/dev/shm/")}},
        ["spec.cluster.volumes[].mountPath: /dev/shm is the workers' shared memory (accepted: any other path)"],
    ),
    Case(
        "Equal with key and value; Exists with a key",
        toleration_operators,
        {
            "cluster": {
                "tolerations": [
                    {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},
                    {"key": "nvidia.com/gpu"},
                ]
            }
        },
    ),
    Case(
        "Exists with a value; Equal without a value",
        toleration_operators,
        {"cluster": {"tolerations": [{"key": "a", "value": "v"}, {"key": "dedicated", "operator": "Equal"}]}},
        [
            "spec.cluster.tolerations[0].value: operator Exists takes no value "
            "(accepted: remove value, or operator Equal)",
            "spec.cluster.tolerations[1]: operator Equal needs a key and a value "
            "(accepted: key + value, or operator Exists)",
        ],
    ),
    Case(
        "GPU data on a mounted FSx volume",
        file_uris_on_shared_volumes,
        {"data": {"uri": "file:///mnt/fsx/tokens/"}, "cluster": {"volumes": vols("/mnt/fsx/")}},
    ),
    Case("CPU data on a node's own disk", file_uris_on_shared_volumes, {}, raw=cpu(data={"uri": "file:///data/t/"})),
    Case(
        "GPU data with no volume",
        file_uris_on_shared_volumes,
        {"data": {"uri": "file:///fsx/tokens/"}},
        [f"spec.data.uri: /fsx/tokens/ {SHARED} (accepted: a path under a mounted FSx/PVC volume, or s3://)"],
    ),
    Case(
        "GPU checkpoints and weights beside the volume, not under it",
        file_uris_on_shared_volumes,
        {
            "model": {"preset": "llama2-7b", "pretrainedUri": "file:///mnt/fsx2/w"},
            "checkpoint": {"uri": "file:///ckpt"},
            "cluster": {"volumes": vols("/mnt/fsx", "/scratch")},
        },
        [
            f"spec.checkpoint.uri: /ckpt {SHARED} (accepted: a path under /mnt/fsx, /scratch, or s3://)",
            f"spec.model.pretrainedUri: /mnt/fsx2/w {SHARED} (accepted: a path under /mnt/fsx, /scratch, or s3://)",
        ],
    ),
    # --- resilience ---
    Case(
        "stragglers replace with checkpoints",
        straggler_replace_needs_checkpoints,
        {"resilience": {"stragglers": {"action": "replace"}}},
    ),
    Case("stragglers report without checkpoints", straggler_replace_needs_checkpoints, {"checkpoint": None}),
    Case(
        "stragglers replace without checkpoints",
        straggler_replace_needs_checkpoints,
        {"resilience": {"stragglers": {"action": "replace"}}, "checkpoint": None},
        [
            "spec.resilience.stragglers.action: replace restarts the job away from a slow node, and without "
            "spec.checkpoint.uri every restart starts the training over (accepted: report, or a spec.checkpoint.uri)"
        ],
    ),
    Case(
        "memory snapshots beside durable checkpoints", memory_snapshots_need_checkpoints, {"checkpoint": {"memory": {}}}
    ),
    Case("no memory snapshots, no checkpoints", memory_snapshots_need_checkpoints, {"checkpoint": None}),
    Case(
        "memory snapshots without durable checkpoints",
        memory_snapshots_need_checkpoints,
        {"checkpoint": None, "checkpoint.memory": {"intervalSteps": 50}},
        [
            "spec.checkpoint.memory: in-memory snapshots supplement durable checkpoints: without "
            "spec.checkpoint.uri, a node lost together with its partner (or the whole job) would restart the "
            "training from step 0 (accepted: a spec.checkpoint.uri, or no spec.checkpoint.memory)"
        ],
    ),
    # --- FSDP ---
    Case("HYBRID_SHARD on 2 nodes", hybrid_shard_needs_nodes, {"fsdp": {"shardingStrategy": "HYBRID_SHARD"}}),
    Case(
        "HYBRID_SHARD on 1 node",
        hybrid_shard_needs_nodes,
        {
            "cluster": {"nodes": 1},
            "fsdp": {"shardingStrategy": "HYBRID_SHARD"},
            "training": {"globalBatchTokens": 4096 * 8 * 4},
        },
        [
            "spec.fsdp.shardingStrategy: HYBRID_SHARD shards within a node and replicates across nodes, so it needs "
            "at least 2 nodes (accepted: FULL_SHARD on one node, or nodes ≥ 2)"
        ],
    ),
    Case(
        "HYBRID_SHARD on 2 nodes that may shrink to 1",
        hybrid_shard_needs_nodes,
        {"cluster": {"minNodes": 1}, "fsdp": {"shardingStrategy": "HYBRID_SHARD"}},
        [
            "spec.fsdp.shardingStrategy: HYBRID_SHARD shards within a node and replicates across nodes, so it needs "
            "at least 2 nodes (accepted: FULL_SHARD on one node, or nodes ≥ 2)"
        ],
    ),
    Case(
        "float8 on H200",
        float8_needs_float8_gpus,
        {"cluster": {"instanceType": "p5en.48xlarge"}, "fsdp": {"float8": True}},
    ),
    Case(
        "float8 on A100",
        float8_needs_float8_gpus,
        {"cluster": {"instanceType": "p4de.24xlarge"}, "fsdp": {"float8": True}},
        [
            "spec.fsdp.float8: p4de.24xlarge has A100-SXM4-80GB GPUs; float8 training needs float8 tensor cores "
            "(H100/H200) (accepted: float8: false, or instanceType p5.48xlarge | p5e.48xlarge | p5en.48xlarge)"
        ],
    ),
    Case(
        "float8 on CPU",
        float8_needs_float8_gpus,
        {},
        [
            "spec.fsdp.float8: cpu has no GPUs; float8 training needs float8 tensor cores (H100/H200) "
            "(accepted: float8: false, or instanceType p5.48xlarge | p5e.48xlarge | p5en.48xlarge)"
        ],
        raw=cpu(fsdp={"float8": True}),
    ),
    Case("fp16 on GPUs", fp16_on_gpus_only, {"fsdp": {"mixedPrecision": "fp16"}}),
    Case(
        "fp16 on CPU",
        fp16_on_gpus_only,
        {},
        [
            "spec.fsdp.mixedPrecision: fp16 compute is not supported on CPU workers "
            "(accepted: bf16 | fp32 on instanceType cpu)"
        ],
        raw=cpu(fsdp={"mixedPrecision": "fp16"}),
    ),
    # --- training ---
    Case("99 warmup steps of 100", warmup_below_max_steps, {"training": {"warmupSteps": 99}}),
    Case(
        "100 warmup steps of 100",
        warmup_below_max_steps,
        {"training": {"warmupSteps": 100}},
        ["spec.training.warmupSteps: 100 is not below maxSteps (100) (accepted: 0..99)"],
    ),
    Case("min 1e-5 under 1e-4", min_lr_within_lr, {"training": {"learningRate": 1e-4, "minLearningRate": 1e-5}}),
    Case(
        "min 1e-3 over 1e-4",
        min_lr_within_lr,
        {"training": {"learningRate": 1e-4, "minLearningRate": 1e-3}},
        ["spec.training.minLearningRate: 0.001 exceeds learningRate (0.0001) (accepted: 0..0.0001)"],
    ),
    Case("4 micro-steps of 16 workers", batch_of_whole_micro_steps, {}),
    Case(
        "1000 tokens: less than one micro-step",
        batch_of_whole_micro_steps,
        {"training": {"globalBatchTokens": 1000}},
        [
            "spec.training.globalBatchTokens: 1000 is not a multiple of seqLen × microBatchSize × workers "
            "= 4096 × 1 × 16 = 65536 (accepted: a multiple of 65536, e.g. 65536)"
        ],
    ),
    Case(
        "3 CPU processes of 2 sequences: the multiple below is suggested",
        batch_of_whole_micro_steps,
        {},
        [
            "spec.training.globalBatchTokens: 1024 is not a multiple of seqLen × microBatchSize × workers "
            "= 128 × 2 × 3 = 768 (accepted: a multiple of 768, e.g. 768)"
        ],
        raw=cpu(cluster={"processesPerNode": 3}, training={"microBatchSize": 2}),
    ),
    Case("4096 of llama2's 4096", seq_len_within_context, {}),
    Case(
        "8192 of llama2's 4096",
        seq_len_within_context,
        {"data": {"seqLen": 8192}, "training": {"globalBatchTokens": 8192 * 16 * 4}},
        ["spec.data.seqLen: 8192 exceeds the model's context length 4096 (accepted: 8..4096)"],
    ),
    Case(
        "dims with maxSeqLen 512",
        seq_len_within_context,
        {
            "model": dims(128, 8, 8, maxSeqLen=512),
            "data": {"seqLen": 1024},
            "training": {"globalBatchTokens": 1024 * 16},
        },
        ["spec.data.seqLen: 1024 exceeds the model's context length 512 (accepted: 8..512)"],
    ),
    Case(
        "an odd head dimension: the context is not judged",
        even_head_dim,
        {
            "model": dims(96, 32, 32, maxSeqLen=512),
            "data": {"seqLen": 1024},
            "training": {"globalBatchTokens": 1024 * 16},
        },
        [
            "spec.model.dims.numHeads: the head dimension hiddenSize/numHeads is odd; rotary embeddings rotate "
            "pairs (accepted: numHeads giving an even head dimension)"
        ],
    ),
    Case("llama2-7b on 2 × p5", fits_in_memory, {}),
    # the expected message's figures are the planner's (tested in test_flops_planner.py)
    Case(
        "llama2-70b on 1 × p4d",
        fits_in_memory,
        {
            "model": {"preset": "llama2-70b"},
            "cluster": {"instanceType": "p4d.24xlarge", "nodes": 1},
            "training": {"globalBatchTokens": 4096 * 8 * 4},
        },
        ["PLANNER"],
    ),
    Case("memory snapshots of llama2-7b on 2 × p5", snapshots_fit_in_host_memory, {"checkpoint": {"memory": {}}}),
    Case("llama2-70b on 4 × p4de without snapshots", snapshots_fit_in_host_memory, {**P4DE_70B, "checkpoint": {}}),
    # the expected message's figures are the planner's (tested in test_snapshot_plan.py)
    Case("memory snapshots of llama2-70b on 4 × p4de", snapshots_fit_in_host_memory, P4DE_70B, ["HOST"]),
    Case(
        "memory snapshots of 3 CPU workers",
        snapshots_fit_in_host_memory,
        {
            "model": {"preset": "tiny"},
            "data": {"seqLen": 128},
            "cluster": {"instanceType": "cpu", "nodes": 2, "processesPerNode": 3},
            "training": {"globalBatchTokens": 128 * 6},
            "fsdp": {"mixedPrecision": "fp32"},
            "checkpoint": {"memory": {"partner": False}},
        },
        ["HOST"],
    ),
    # --- rendezvous ---
    Case("host:port", endpoint_port, {"rendezvous": {"endpoint": "etcd.infra.svc:2379"}}),
    Case("a host alone", endpoint_port, {"rendezvous": {"endpoint": "etcd.infra.svc"}}),
    Case(
        "port 99999",
        endpoint_port,
        {"rendezvous": {"endpoint": "etcd:99999"}},
        ["spec.rendezvous.endpoint: 'etcd:99999' has no valid port (accepted: host:port, port 1..65535)"],
    ),
    Case("etcd-v2, the operator's default endpoint", etcd_endpoint, {"rendezvous": {"backend": "etcd-v2"}}),
    Case("c10d and an operator without etcd", etcd_endpoint, {"rendezvous": {"backend": "c10d"}}, etcd=None),
    Case(
        "etcd-v2 and an operator without etcd",
        etcd_endpoint,
        {"rendezvous": {"backend": "etcd-v2"}},
        [
            "spec.rendezvous.endpoint: backend etcd-v2 needs an etcd endpoint and the operator has no default "
            "(accepted: host:port of an etcd (v2 API enabled), or backend c10d)"
        ],
        etcd=None,
    ),
]


def _subject(case: Case) -> Subject:
    overrides = {k: v for k, v in case.overrides.items() if k != "checkpoint.memory"}
    raw = case.raw if case.raw is not None else spec_with(overrides)
    if "checkpoint.memory" in case.overrides:  # a memory section in a spec that has no checkpoint.uri
        raw["checkpoint"] = {"memory": case.overrides["checkpoint.memory"]}
    return Subject(parse_spec(raw), case.name, case.etcd, case.policy, case.backend, case.enabled)


def _expected(case: Case, j: Subject) -> list[str]:
    if case.problems == ["HOST"]:
        host = host_memory(j.spec)
        return [
            f"spec.cluster: the in-memory snapshots (spec.checkpoint.memory) need {size(host.total_bytes)} of host "
            f"memory per node ({host.parts()}) but a {j.spec.cluster.instance_type} worker pod gets "
            f"{size(host.pod_bytes)} (of the node's {size(host.node_bytes)}): "
            f"{size(host.total_bytes - host.pod_bytes)} short (accepted: {host_fit_suggestions(j.spec)})"
        ]
    if case.problems != ["PLANNER"]:
        return case.problems
    plan, gib = plan_job(j.spec), 1024**3
    return [
        f"spec.cluster: needs {plan.total_bytes / gib:.1f} GiB per device but {j.spec.cluster.instance_type} has "
        f"{plan.gpu_memory_bytes / gib:.0f} GiB (see `llmtrain plan`) (accepted: {suggest_fit(j.spec)})"
    ]


@pytest.mark.parametrize("case", CASES, ids=[f"{c.rule.name}: {c.id}" for c in CASES])
def test_rule(case: Case):
    j = _subject(case)
    assert [str(p) for p in case.rule(j)] == _expected(case, j)


@pytest.mark.parametrize("case", CASES, ids=[f"{c.rule.name}: {c.id}" for c in CASES])
def test_check_finds_exactly_these(case: Case):
    j = _subject(case)
    expected = case.check if case.check is not None else _expected(case, j)
    found = check(j.spec, j.name, j.default_etcd_endpoint, j.policy, j.backend, j.enabled)
    assert [str(p) for p in found] == expected


def test_every_rule_has_a_good_and_a_bad_case():
    good = {c.rule.name for c in CASES if not c.problems}
    bad = {c.rule.name for c in CASES if c.problems}
    names = [r.name for r in RULES]
    assert len(set(names)) == len(names), names
    assert {"good": set(names) - good, "bad": set(names) - bad} == {"good": set(), "bad": set()}


@pytest.mark.parametrize("case", [c for c in CASES if c.problems], ids=lambda c: f"{c.rule.name}: {c.id}")
def test_problems_name_the_fields_the_rule_declares(case: Case):
    """The reference page lists each rule's fields (scripts/gen-docs.py): they are the ones it names."""
    j = _subject(case)
    declared = [re.escape(f).replace(re.escape("<i>"), r"\d+") for f in case.rule.fields]
    declared = [re.sub(r"<[A-Za-z]+>", ".+", f) for f in declared]
    for p in case.rule(j):
        assert any(re.fullmatch(f, p.field) for f in declared), (p.field, case.rule.fields)


def test_needs_name_earlier_rules():
    """A rule's `needs` come before it in the table: otherwise it would never run."""
    for i, r in enumerate(RULES):
        assert all(n in RULES[:i] for n in r.needs), r.name
