"""LLMTrainingJob → one attempt's child object (a PyTorchJob or a JobSet), through Jinja2 templates.

This module decides the values (from the spec and the instance catalog) and owns the one piece every
backend shares, the worker pod template (`templates/pod.yaml.j2`: resources, EFA, env, security,
labels, Kueue topology annotations, volumes). Each backend (`llmtrain.backends`) only wraps it in its
own kind's template (`templates/<backend>.yaml.j2`, which includes the pod template) and says where
the c10d rendezvous host is and what its controller does not inject. Choices a user should know about:

- One child per attempt, named `<job>-a<attempt>` (pod_contract.child_name); the rendezvous id
  `<namespace>.<job>-<uid prefix>-a<attempt>` (1-3 dots, rendezvous_keys.tenant_prefix) is never
  reused, so a restarted attempt never meets a closed rendezvous (RendezvousClosedError). What the
  pods and the operator agree on besides the spec (names, environment, exit code, termination
  message) is pod_contract.py's: the policy and the trainer read it without the templates.
- Workers run `torchrun ... -m llmtrain_trainer` with every torchrun setting as an argument (node
  count, processes per node, rendezvous, restarts): nothing depends on what a backend's controller
  injects. The trainer reads the whole spec from the `LLMTRAIN_SPEC` environment variable (JSON), so
  the child object is the complete, reviewable record.
- Two tiers of restarts: torchrun restarts a failed worker process in place up to
  `spec.resilience.inPlaceRestarts` times per pod (`--max-restarts`); the child itself never
  restarts anything (backoff limit 0, restartPolicy Never, no restarts of its own), so a pod that
  has spent them fails the attempt and the operator decides what comes next.
- GPU types request every GPU and EFA interface of the node (`nvidia.com/gpu`,
  `vpc.amazonaws.com/efa` from the catalog; without EFA NCCL silently falls back to TCP), 2 MiB
  hugepages for libfabric, REQUEST_FRACTION of the node's memory and CPUs (the rest is for the
  kubelet and daemonsets), `/dev/shm` as memory, node-local staging for checkpoint shards, and a
  termination grace period that covers torchrun's SIGTERM window.
- Pod Security: workers run as the image's non-root user with seccomp RuntimeDefault, every
  capability dropped and no ServiceAccount token (the trainer never calls the Kubernetes API; EKS
  Pod Identity and IRSA project their own tokens). CPU jobs meet the `restricted` level. EFA
  instance types add IPC_LOCK (libfabric pins the buffers it registers with the EFA device); the
  image gives the Python interpreter that capability as a file capability, which a non-root process
  only gains through exec with privilege escalation allowed, so EFA pods meet the `privileged`
  level only (`baseline` does not allow IPC_LOCK): label their namespace accordingly.
- Env precedence: NCCL/libfabric preset of the family < llmtrain's own (and the backend's) <
  `spec.cluster.env`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Any

import jinja2
import yaml

from . import rendezvous_keys
from .catalog import InstanceType, instance_type
from .pod_contract import METRICS_PORT, STAGING_PATH, child_name, rendezvous_id, worker_env
from .snapshot_plan import REQUEST_FRACTION, pod_memory_gib
from .spec import API_VERSION, KIND, LLMTrainingJobSpec
from .spec_constraints import INSTANCE_TYPE_LABEL

if TYPE_CHECKING:  # rendezvous_auth issues them (I/O); rendering only reads them
    from .rendezvous_auth import Credentials

C10D_PORT = 29400
DEFAULT_ETCD_PORT = 2379
# The SIGTERM checkpoint's window: the workers stop at the next micro-batch, stage their shards and
# upload them (the 70B on 16 x p5 example needs about 46 s: bench/checkpoint_staging.py). The pod
# command is llmtrain_trainer.launch, which hands SIGTERM to the workers so they get this whole
# period rather than torchrun's own 30 s shutdown timeout, and exits 0 on a clean stop.
TERMINATION_GRACE_SECONDS = 120
# The staging volume (pod_contract.STAGING_PATH) is memory (tmpfs) on GPU nodes: a disk-backed
# emptyDir on a default EBS root volume (~125 MB/s) would need ~400 s for the 70B example's 52 GB
# per node, far past the grace period. The size limit bounds what staging may take from the pod's
# memory limit.
STAGING_MEMORY_FRACTION = 0.25
TRAINER_MODULE = "llmtrain_trainer"
COMMAND = ["python", "-m", "llmtrain_trainer.launch"]
GPU_TOLERATIONS = [
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "vpc.amazonaws.com/efa", "operator": "Exists", "effect": "NoSchedule"},
]
# A lost node (kernel panic, power, network) keeps its pods bound for the DefaultTolerationSeconds
# admission plugin's 300 s after the node controller marks it (40 s): five minutes of a gang waiting
# on a rank that is gone. The workers tolerate it for one minute instead, so the pod is evicted and
# the attempt fails over well inside HyperPod's "under 2 minutes"; a shorter wait would evict a
# whole gang over a brief kubelet-to-API-server blip. A user toleration of the same key wins.
NODE_LOST_TOLERATION_SECONDS = 60
NODE_LOST_TAINTS = ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")
JOB_LABEL = "llmtrain.dev/job"
ATTEMPT_LABEL = "llmtrain.dev/attempt"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
# Kueue's topology-aware scheduling asks per pod set (the Worker replicas' pod template)
TOPOLOGY_ANNOTATION = {
    "required": "kueue.x-k8s.io/podset-required-topology",
    "preferred": "kueue.x-k8s.io/podset-preferred-topology",
}
HOSTNAME_LABEL = "kubernetes.io/hostname"


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# What rendering a spec that passed validation can still raise (what validation could not foresee):
# the policy (controller/policy/writes.py) fails the attempt with RenderFailed on these, and names
# them through the backends without importing YAML itself.
RENDER_ERRORS: tuple[type[Exception], ...] = (ValueError, TypeError, yaml.YAMLError)


# The trainer image's user (Dockerfile: ARG UID=65532).
TRAINER_UID = 65532
# Pod Security Standards level each kind of worker pod meets (README "Pod Security").
PSS_LEVEL_CPU = "restricted"
PSS_LEVEL_EFA = "privileged"


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": TRAINER_UID,
        "runAsGroup": TRAINER_UID,
        "fsGroup": TRAINER_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context(inst: InstanceType) -> dict[str, Any]:
    if inst.efa_interfaces:
        # IPC_LOCK reaches the non-root trainer only through the image's file capability on the
        # interpreter, and exec grants file capabilities only without no_new_privs.
        return {
            "allowPrivilegeEscalation": True,
            "privileged": False,
            "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]},
        }
    return {"allowPrivilegeEscalation": False, "privileged": False, "capabilities": {"drop": ["ALL"]}}


def pss_level(inst: InstanceType) -> str:
    return PSS_LEVEL_EFA if inst.efa_interfaces else PSS_LEVEL_CPU


@cache
def _template(name: str, slots: bool = True) -> jinja2.Template:
    """A child template (`<backend>.yaml.j2`, which includes the shared `pod.yaml.j2`). With
    `slots` (what the renderer uses) its `tojson` filter emits a placeholder and keeps the
    value's JSON aside: the YAML left to parse is the document's skeleton, the same for every job
    of the same shape (cached, `_skeleton`), and the values go in as JSON. Without
    (`slots=False`): Jinja's own `tojson`, the whole text for YAML (the reference the tests
    compare with)."""
    env = jinja2.Environment(loader=_PodTemplateLoader(), undefined=jinja2.StrictUndefined, autoescape=False)
    if slots:
        env.filters["tojson"] = _slot
    return env.get_template(name)


_POD_TEMPLATE = "pod.yaml.j2"
_POD_MARKER = re.compile(r"^( *)\{# pod\.yaml\.j2 #\}$", re.MULTILINE)


class _PodTemplateLoader(jinja2.PackageLoader):
    """The templates of llmtrain/templates, with a child template's `{# pod.yaml.j2 #}` line replaced
    by the shared pod template's text, indented to that line's column. Inlined in the source, once
    when the template loads: a Jinja include (and the indent filter around it) cost every render
    ~30 µs, 15% of a PyTorchJob's."""

    def __init__(self):
        super().__init__("llmtrain", "templates")

    def get_source(self, environment, template):
        source, filename, uptodate = super().get_source(environment, template)
        if template != _POD_TEMPLATE and _POD_MARKER.search(source):
            pod = super().get_source(environment, _POD_TEMPLATE)[0].rstrip("\n")

            def inline(m: re.Match) -> str:
                return "\n".join(m.group(1) + line if line else line for line in pod.split("\n"))

            source = _POD_MARKER.sub(inline, source)
        return source, filename, uptodate


_SLOT = "llmtrain-render-slot-"


@jinja2.pass_context
def _slot(ctx, value) -> str:
    # sort_keys as Jinja's own tojson (its default policy); a value JSON cannot encode raises
    # TypeError here as it did there
    slots = ctx["slots_"]
    slots.append(json.dumps(value, sort_keys=True))
    return f'"{_SLOT}{len(slots) - 1}"'


@lru_cache(maxsize=64)
def _skeleton(text: str):
    """The parsed skeleton (shared: `_fill` builds new objects, never changes it)."""
    return yaml.load(text, Loader=_LOADER)


def _fill(node, slots: list[str]):
    if isinstance(node, dict):
        return {_fill(k, slots): _fill(v, slots) for k, v in node.items()}
    if isinstance(node, list):
        return [_fill(v, slots) for v in node]
    if isinstance(node, str) and node.startswith(_SLOT):
        return json.loads(slots[int(node[len(_SLOT) :])])
    return node


def _rendezvous(
    spec: LLMTrainingJobSpec, c10d_host: str, rdzv_id: str, default_etcd_endpoint: str | None
) -> dict[str, Any]:
    """`c10d_host`: the first worker pod's DNS name, as the backend's controller provides it (the
    c10d store runs in the agent whose address that name resolves to: torch's
    _matches_machine_hostname compares the IPs)."""
    backend = spec.rendezvous.backend
    endpoint: str | None
    if backend == "c10d":
        endpoint = spec.rendezvous.endpoint or f"{c10d_host}:{C10D_PORT}"
    else:
        endpoint = spec.rendezvous.endpoint or default_etcd_endpoint
        if not endpoint:
            raise ValueError("etcd rendezvous needs spec.rendezvous.endpoint or an operator default")
    host, _, port = endpoint.rpartition(":")
    if not host:
        host, port = endpoint, str(C10D_PORT if backend == "c10d" else DEFAULT_ETCD_PORT)
    return {"backend": backend, "host": host, "port": int(port), "id": rdzv_id, "endpoint": f"{host}:{port}"}


def _resources(spec: LLMTrainingJobSpec, inst: InstanceType, procs: int) -> dict[str, Any]:
    # The planner's (snapshot_plan.pod_memory_gib): on CPU the catalog's memory per worker, which the
    # planner fits the job into; on GPU REQUEST_FRACTION of the node. Either way with room for the
    # in-memory snapshots when spec.checkpoint.memory is on: /dev/shm is memory-backed, so what the
    # snapshots keep there counts against this limit.
    memory = f"{pod_memory_gib(spec)}Gi"
    if not inst.is_gpu:
        req = {"cpu": str(procs), "memory": memory}
        return {"requests": req, "limits": {"memory": req["memory"]}}
    exact = {"nvidia.com/gpu": str(inst.gpus_per_node)}
    if inst.efa_interfaces:
        exact["vpc.amazonaws.com/efa"] = str(inst.efa_interfaces)
    if inst.hugepages_2mi:
        exact["hugepages-2Mi"] = inst.hugepages_2mi
    requests = {**exact, "cpu": str(int(inst.vcpus * REQUEST_FRACTION)), "memory": memory}
    # A memory limit at the request: a leaking rank is OOM-killed in its pod, not the kubelet.
    return {"requests": requests, "limits": {**exact, "memory": memory}}


def node_anti_affinity(avoid_nodes) -> dict[str, Any] | None:
    """Required node anti-affinity that keeps an attempt's pods off `avoid_nodes` (the nodes the
    operator blamed for earlier failures; controller/adapters/nodes.py decides which, never so many that
    the job cannot schedule)."""
    names = sorted(set(avoid_nodes or ()))
    if not names:
        return None
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "NotIn", "values": names}]}
                ]
            }
        }
    }


def _placement(spec: LLMTrainingJobSpec, inst: InstanceType) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The workers' node selector and tolerations: the user's, with the instance type's pin, the GPU
    nodes' taints and a short wait on a lost node (unless the user tolerates it their own way)."""
    node_selector = dict(spec.cluster.node_selector)
    if inst.is_gpu:  # the pin is authoritative: applied last, over anything the user gave
        node_selector[INSTANCE_TYPE_LABEL] = inst.name
    user_tolerations = [t.model_dump(exclude_none=True) for t in spec.cluster.tolerations]
    node_lost = [
        {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": NODE_LOST_TOLERATION_SECONDS}
        for key in NODE_LOST_TAINTS
        if not any(t.get("key") == key for t in user_tolerations)
    ]
    tolerations = (GPU_TOLERATIONS if inst.is_gpu else []) + node_lost + user_tolerations
    return node_selector, tolerations


def _storage(
    spec: LLMTrainingJobSpec, inst: InstanceType, child: str, credentials: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The worker container's volume mounts and the pod's volumes: /dev/shm, the checkpoint staging
    area, the user's claims and, with `credentials`, the attempt's rendezvous Secret."""
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": "staging", "mountPath": STAGING_PATH}] + [
        {"name": v.name, "mountPath": v.mount_path, "readOnly": v.read_only} for v in spec.cluster.volumes
    ]
    staging = (
        {"medium": "Memory", "sizeLimit": f"{int(inst.memory_gib * STAGING_MEMORY_FRACTION)}Gi"} if inst.is_gpu else {}
    )
    # /dev/shm has no sizeLimit: NCCL and the data loader use it too, and the pod's memory limit
    # (_resources, with room for the in-memory snapshots) bounds it.
    volumes = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}, {"name": "staging", "emptyDir": staging}] + [
        {"name": v.name, "persistentVolumeClaim": {"claimName": v.claim_name, "readOnly": v.read_only}}
        for v in spec.cluster.volumes
    ]
    if credentials:
        mounts.append({"name": RENDEZVOUS_VOLUME, "mountPath": rendezvous_keys.MOUNT_PATH, "readOnly": True})
        # 0440 and the pod's fsGroup: readable by the trainer's group only
        volumes.append(
            {
                "name": RENDEZVOUS_VOLUME,
                "secret": {"secretName": rendezvous_keys.secret_name(child), "defaultMode": 0o440},
            }
        )
    return mounts, volumes


def _args(spec: LLMTrainingJobSpec, procs: int, min_nodes: int, rdzv: dict[str, Any]) -> list[str]:
    conf = [f"--rdzv-conf={rdzv['conf']}"] if rdzv.get("conf") else []
    return [
        f"--nnodes={min_nodes}:{spec.cluster.nodes}",
        f"--nproc-per-node={procs}",
        f"--rdzv-backend={rdzv['backend']}",
        f"--rdzv-endpoint={rdzv['endpoint']}",
        f"--rdzv-id={rdzv['id']}",
        *conf,
        # torchrun's own restarts: a failed worker process restarts in place, every pod's workers
        # meet again in a new rendezvous round and resume from the newest checkpoint, no new pods;
        # once a pod's agent has spent them, the pod fails and the operator starts a new attempt
        f"--max-restarts={spec.resilience.in_place_restarts}",
        "-m",
        TRAINER_MODULE,
    ]


def uses_operator_etcd(spec: LLMTrainingJobSpec) -> bool:
    """The job meets on the operator's etcd (an etcd backend, no endpoint of its own): the one
    that requires the per-namespace credentials when the operator runs with a rendezvous CA."""
    return spec.rendezvous.backend != "c10d" and not spec.rendezvous.endpoint


RENDEZVOUS_VOLUME = "rendezvous-credentials"


def networkpolicy_name(job: str) -> str:
    return f"{job}-peers"


def render_networkpolicy(
    spec: LLMTrainingJobSpec, name: str, namespace: str = "default", uid: str | None = None
) -> dict[str, Any]:
    """The job's NetworkPolicy (one per job, every attempt): its worker pods accept connections
    from the job's own pods only (the c10d rendezvous store, the agents' TCPStore, gloo/NCCL, all
    unauthenticated and some of it pickles), except the trainer's metrics ports, which the
    operator and Prometheus scrape. The selectors hold within the namespace only (no
    namespaceSelector), the trust boundary. It needs a CNI that enforces NetworkPolicy."""
    inst = instance_type(spec.cluster.instance_type)
    procs = inst.workers_per_node(spec.cluster.processes_per_node)
    peers = {JOB_LABEL: name, "app.kubernetes.io/managed-by": "llmtrain-operator"}
    metrics = {"protocol": "TCP", "port": METRICS_PORT}
    if procs > 1:
        metrics["endPort"] = METRICS_PORT + procs - 1
    meta: dict[str, Any] = {
        "name": networkpolicy_name(name),
        "namespace": namespace,
        "labels": {
            "app.kubernetes.io/name": "llmtrain",
            "app.kubernetes.io/managed-by": "llmtrain-operator",
            JOB_LABEL: name,
        },
    }
    if uid:
        meta["ownerReferences"] = [
            {"apiVersion": API_VERSION, "kind": KIND, "name": name, "uid": uid, "blockOwnerDeletion": True}
        ]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta,
        "spec": {
            "podSelector": {"matchLabels": dict(peers)},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": dict(peers)}}]}, {"ports": [metrics]}],
        },
    }


def render_rendezvous_secret(
    name: str, namespace: str, attempt: int, uid: str | None, creds: Credentials
) -> dict[str, Any]:
    """The Secret an attempt's pods mount for the operator's etcd: the CA and the namespace's
    client certificate (owned by the job, so it goes with it)."""
    meta: dict[str, Any] = {
        "name": rendezvous_keys.secret_name(child_name(name, attempt)),
        "namespace": namespace,
        "labels": {
            "app.kubernetes.io/name": "llmtrain",
            "app.kubernetes.io/managed-by": "llmtrain-operator",
            JOB_LABEL: name,
            ATTEMPT_LABEL: str(attempt),
        },
    }
    if uid:
        meta["ownerReferences"] = [
            {"apiVersion": API_VERSION, "kind": KIND, "name": name, "uid": uid, "blockOwnerDeletion": True}
        ]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": meta,
        "data": creds.secret_data(),
    }


def render_attempt(
    template: str,
    spec: LLMTrainingJobSpec,
    name: str,
    namespace: str = "default",
    attempt: int = 1,
    uid: str | None = None,
    default_etcd_endpoint: str | None = None,
    *,
    c10d_host: str,
    backend_env: Mapping[str, str] | None = None,
    restart_policy: str | None = None,
    subdomain: str | None = None,
    resume_before_step: int | None = None,
    avoid_nodes=(),
    rendezvous_credentials: bool = False,
    cadence_inputs: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """Attempt `attempt`'s child object, as a dict ready for the API server: the backend's
    `template` (which includes the shared pod template) filled with the values decided here. A
    backend (llmtrain.backends) passes its template, the c10d host its controller names, what its
    controller does not inject (`backend_env`), and the pods' `restart_policy` and `subdomain` (the
    headless Service of their DNS names) where its controller sets none. `resume_before_step`: a
    loss rollback the operator decided (status.resumeBeforeStep, controller/policy/health.py).
    `cadence_inputs`: (job MTBF, blocking seconds to start from) for intervalMinutes auto
    (llmtrain/cadence.py; without them the trainer uses the prior and the planner's estimate).
    `avoid_nodes`: node names this attempt's pods must not land on (status.avoidNodes).
    `rendezvous_credentials`: the operator's etcd requires client certificates; a job that uses it
    mounts the attempt's Secret (render_rendezvous_secret) and speaks HTTPS."""
    inst = instance_type(spec.cluster.instance_type)
    procs = inst.workers_per_node(spec.cluster.processes_per_node)
    child = child_name(name, attempt)
    rdzv = _rendezvous(spec, c10d_host, rendezvous_id(namespace, name, uid, attempt), default_etcd_endpoint)
    credentials = rendezvous_credentials and uses_operator_etcd(spec)
    if credentials:
        rdzv["conf"] = rendezvous_keys.rdzv_conf(spec.rendezvous.backend, namespace)
    min_nodes = spec.cluster.min_nodes or spec.cluster.nodes
    pod_labels = {
        "app.kubernetes.io/name": "llmtrain",
        "app.kubernetes.io/managed-by": "llmtrain-operator",
        JOB_LABEL: name,
        ATTEMPT_LABEL: str(attempt),
    }
    labels = dict(pod_labels)
    if spec.cluster.queue_name:
        labels[QUEUE_LABEL] = spec.cluster.queue_name
    if spec.cluster.workload_priority_class:
        labels[PRIORITY_CLASS_LABEL] = spec.cluster.workload_priority_class
    pod_annotations = {"prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT)}
    if spec.cluster.topology is not None:
        pod_annotations[TOPOLOGY_ANNOTATION[spec.cluster.topology.mode]] = spec.cluster.topology.level
    node_selector, tolerations = _placement(spec, inst)
    mounts, volumes = _storage(spec, inst, child, credentials)
    owner = {"apiVersion": API_VERSION, "kind": KIND, "name": name, "uid": uid} if uid else None
    slots: list[str] = []
    text = _template(template).render(
        slots_=slots,
        name=child,
        namespace=namespace,
        labels=labels,
        # the child's own children (a JobSet's Jobs) carry the job's and attempt's labels, not
        # Kueue's: Kueue manages the child, never its parts
        pod_labels=pod_labels,
        pod_annotations=pod_annotations,
        owner=owner,
        spec=spec,
        inst=inst,
        rdzv=rdzv,
        nodes=spec.cluster.nodes,
        min_nodes=min_nodes,
        procs_per_node=procs,
        metrics_port=METRICS_PORT,
        grace_seconds=TERMINATION_GRACE_SECONDS,
        restart_policy=restart_policy,
        subdomain=subdomain,
        node_selector=node_selector,
        tolerations=tolerations,
        command=COMMAND,
        args=_args(spec, procs, min_nodes, rdzv),
        in_place_restarts=spec.resilience.in_place_restarts,
        env=worker_env(spec, inst, name, namespace, attempt, resume_before_step, cadence_inputs, backend_env),
        resources=_resources(spec, inst, procs),
        volume_mounts=mounts,
        volumes=volumes,
        pod_security=pod_security_context(),
        container_security=container_security_context(inst),
        affinity=node_anti_affinity(avoid_nodes),
        # each local rank serves its own /metrics on METRICS_PORT + local rank
        ports=[{"name": f"metrics-{i}", "containerPort": METRICS_PORT + i} for i in range(procs)],
    )
    # Every value is a `tojson` slot, so what YAML parses is the skeleton, and only once per shape:
    # parsing the whole text (even with libyaml's loader; the pure-Python one took ~100 ms) was
    # ~1.3 ms of the operator's CPU per job, the values (spec JSON, env, labels) then go in with
    # json.loads. A JSON value parses the same either way, except that YAML 1.1 reads a float
    # written without a dot (1e-05) as a string; no child kind has float fields.
    return _fill(_skeleton(text), slots)
