"""The cluster: the instance type, node counts, Kueue fields, the environment, selectors, volumes, tolerations."""

from __future__ import annotations

import re
from collections.abc import Iterator

from ..catalog import instance_types
from ..spec import TOPOLOGY_LEVELS
from ..spec_constraints import INSTANCE_TYPE_LABEL, LABEL_KEY
from .base import Problem, Subject, rule, shorten

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
