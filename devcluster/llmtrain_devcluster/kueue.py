"""Real Kueue in the chain dev cluster (``DevCluster(chain=True, kueue=True)``, ``--kueue``).

The pinned controller (``make tools``: ``sigs.k8s.io/kueue`` in the tools module, ``tools/k8s``)
runs on the host with the integrations of llmtrain's backends, ``kubeflow.org/pytorchjob``,
``jobset.x-k8s.io/jobset`` and ``batch/job`` (:data:`CHAIN_FRAMEWORKS`), or with the release's own defaults
(:func:`release_default_frameworks`: from v0.19 they leave ``kubeflow.org/pytorchjob`` out, so a
suspended PyTorchJob is never admitted). Its webhooks are really called: the API server gets
Kueue's own Mutating/ValidatingWebhookConfigurations (from its module's
``config/components/webhook``, with the release's namespace selector), kept to the paths this
configuration serves (Kueue's objects and the enabled integrations' kinds), pointed at the loopback
URL and the dev cluster CA that signed Kueue's serving cert.

What it queues against is generated from the instance catalog, like the kwok nodes: a
ResourceFlavor per instance type (``node.kubernetes.io/instance-type``, the label the nodes and the
renderer use) and one ClusterQueue with quotas for the nodes registered (``nvidia.com/gpu``,
``vpc.amazonaws.com/efa``, ``hugepages-2Mi``, cpu, memory); :func:`local_queue` is the LocalQueue
a namespace's jobs name in ``spec.cluster.queueName``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from llmtrain.backends import BACKENDS

from . import pki
from .tools import ToolNotFoundError, refuse_in_unmarked_test, tools_dir

__all__ = [
    "CHAIN_FRAMEWORKS",
    "CLUSTER_QUEUE",
    "NAMESPACE",
    "cluster_queue",
    "config_yaml",
    "kueue_dir",
    "local_queue",
    "release_default_frameworks",
    "resource_flavors",
    "webhook_configurations",
]

NAMESPACE = "kueue-system"
CLUSTER_QUEUE = "llmtrain"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
# The integrations the chain enables: the child kinds of llmtrain's backends.
CHAIN_FRAMEWORKS = tuple(b.kueue_framework for b in BACKENDS.values())
# Kueue's own objects' webhook paths (always served).
_KUEUE_PATHS = "-kueue-x-k8s-io-"
# Integrations Kueue names without a group: their kinds' API groups (core is "").
_GROUPLESS = {"pod": "", "deployment": "apps", "statefulset": "apps"}
# What the release's kustomization gives every integration webhook: Kueue's own namespace and
# kube-system are left alone.
_INTEGRATION_NAMESPACES = {
    "matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", NAMESPACE]}
    ]
}
_HINT = "run `make tools` (scripts/install-tools.sh) first"


def kueue_dir() -> Path:
    """``crds/``, ``webhook/`` and ``manager/`` of the pinned Kueue module (its binary is the tools'
    ``bin/kueue``)."""
    refuse_in_unmarked_test("tools", "Kueue (make tools)")
    d = tools_dir() / "kueue"
    if not (d / ".complete").is_file():
        raise ToolNotFoundError(f"Kueue's manifests for this checkout's pins are not installed at {d}; {_HINT}")
    return d


def release_default_frameworks(kdir: Path | None = None) -> tuple[str, ...]:
    """The integrations a default install of the pinned release enables: the ``frameworks`` of its
    own ``config/components/manager/controller_manager_config.yaml`` (a line commented out there,
    as ``kubeflow.org/pytorchjob`` is from v0.19, is not enabled)."""
    cfg = yaml.safe_load(((kdir or kueue_dir()) / "manager" / "controller_manager_config.yaml").read_text())
    return tuple(cfg["integrations"]["frameworks"])


def crd_paths() -> list[Path]:
    return sorted((kueue_dir() / "crds").glob("*.yaml"))


def config_yaml(
    *, webhook_port: int, probe_port: int, cert_dir: Path, frameworks: Sequence[str] = CHAIN_FRAMEWORKS
) -> str:
    """Kueue's Configuration: the ``frameworks`` integrations (default: llmtrain's backends'),
    webhooks on loopback with the given serving certs, no leader election, no metrics listener."""
    cfg = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{probe_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": list(frameworks)},
    }
    return yaml.safe_dump(cfg, sort_keys=False)


def write_serving_cert(ca: pki.CertificateAuthority, cert_dir: Path) -> None:
    cert_dir.mkdir(parents=True, exist_ok=True)
    ca.issue_to_files(
        cert_dir / "tls.crt",
        cert_dir / "tls.key",
        "kueue-webhook",
        server=True,
        dns=(f"kueue-webhook-service.{NAMESPACE}.svc", "localhost"),
        ips=("127.0.0.1",),
    )


# Without its internal cert management, Kueue (v0.17 to v0.19) reads its metrics serving cert from
# this fixed path (cmd/kueue/main.go) and exits when it is missing.
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")
_OVERLAY_SH = """set -e
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1,workdir=$2" /etc
shift 2
exec "$@"
"""


def argv_with_metrics_cert(kdir: Path, argv: list, ca: pki.CertificateAuthority) -> list:
    """``argv`` in a private mount namespace whose /etc is the host's with an overlay from the state
    dir, in which /etc/kueue/metrics/certs holds a cert issued by the dev cluster CA: nothing is
    written outside the state dir. Where the host cannot make one, the cert goes to the real path
    (only when none is there), said on stderr."""
    import subprocess
    import sys

    from .process import _unshare_mount

    upper, work = kdir / "etc-upper", kdir / "etc-work"
    certs_dir = upper / METRICS_CERT_DIR.relative_to("/etc")
    certs_dir.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    ca.issue_to_files(
        certs_dir / "tls.crt",
        certs_dir / "tls.key",
        "kueue-metrics",
        server=True,
        dns=("localhost",),
        ips=("127.0.0.1",),
    )
    prefix = _unshare_mount()
    if prefix is not None:
        wrapped = [*prefix, "sh", "-c", _OVERLAY_SH, "sh", str(upper), str(work)]
        if subprocess.run([*wrapped, "true"], capture_output=True).returncode == 0:
            return [*wrapped, *argv]
    if not (METRICS_CERT_DIR / "tls.crt").exists():
        print(
            f"llmtrain_devcluster: no private mount namespace with overlayfs on this host: writing "
            f"{METRICS_CERT_DIR} for Kueue's metrics server",
            file=sys.stderr,
        )
        METRICS_CERT_DIR.mkdir(parents=True, exist_ok=True)
        for f in ("tls.crt", "tls.key"):
            (METRICS_CERT_DIR / f).write_bytes((certs_dir / f).read_bytes())
    return argv


def _served(path: str, frameworks: Sequence[str]) -> bool:
    """Whether Kueue serves webhook ``path`` (``/mutate-<group with dashes>-<version>-<kind>``)
    with ``frameworks`` enabled: its own objects' always, an integration's when it is on."""
    if _KUEUE_PATHS in path:
        return True
    for fw in frameworks:
        group, _, kind = fw.rpartition("/") if "/" in fw else (_GROUPLESS.get(fw, ""), "/", fw)
        if re.fullmatch(rf"/(mutate|validate)-{re.escape(group.replace('.', '-'))}-v[0-9a-z]+-{re.escape(kind)}", path):
            return True
    return False


def webhook_configurations(
    manifests: str, *, url: str, ca_pem: bytes, frameworks: Sequence[str] = CHAIN_FRAMEWORKS
) -> list[dict]:
    """Kueue's webhook configurations, only the paths served with ``frameworks`` on, each calling
    ``url`` + its path; the integrations' with the release's namespace selector."""
    import base64

    bundle = base64.b64encode(ca_pem).decode()
    out = []
    for doc in yaml.safe_load_all(manifests):
        if not doc:
            continue
        hooks = []
        for hook in doc.get("webhooks") or []:
            path = ((hook.get("clientConfig") or {}).get("service") or {}).get("path") or ""
            if _served(path, frameworks):
                hook = {**hook, "clientConfig": {"url": f"{url}{path}", "caBundle": bundle}}
                if _KUEUE_PATHS not in path:
                    hook["namespaceSelector"] = _INTEGRATION_NAMESPACES
                hooks.append(hook)
        if hooks:
            out.append({**doc, "metadata": {"name": f"kueue-{doc['metadata']['name']}"}, "webhooks": hooks})
    return out


def _per_node(instance_type: str) -> dict[str, Any]:
    """What one node of the type offers (the kwok node's capacity: chain.node_manifest)."""
    from .chain import node_manifest

    return node_manifest(instance_type, 0)["status"]["capacity"]


RESOURCES = ("cpu", "memory", "nvidia.com/gpu", "vpc.amazonaws.com/efa", "hugepages-2Mi")


def flavor_name(instance_type: str) -> str:
    return instance_type.replace(".", "-")


TOPOLOGY = "eks-network"


def topology() -> dict:
    """Kueue's Topology of the kwok nodes' EKS network labels (chain.topology_labels)."""
    from .chain import TOPOLOGY_LABELS

    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Topology",
        "metadata": {"name": TOPOLOGY},
        "spec": {"levels": [{"nodeLabel": label} for label in (*TOPOLOGY_LABELS, "kubernetes.io/hostname")]},
    }


def resource_flavors(shapes: Mapping[str, int], *, topology_aware: bool = False) -> list[dict]:
    """One ResourceFlavor per instance type, matching its nodes' instance-type label; with
    ``topology_aware`` each names the Topology (Kueue's topology-aware scheduling)."""
    out = []
    for t in shapes:
        spec: dict[str, Any] = {"nodeLabels": {INSTANCE_TYPE_LABEL: t}}
        if topology_aware:
            spec["topologyName"] = TOPOLOGY
        out.append(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ResourceFlavor",
                "metadata": {"name": flavor_name(t)},
                "spec": spec,
            }
        )
    return out


def _times(quantity: str, n: int) -> str:
    for suffix in ("Gi", "Mi"):
        if quantity.endswith(suffix):
            return f"{int(quantity[: -len(suffix)]) * n}{suffix}"
    return str(int(quantity) * n)


def cluster_queue(shapes: Mapping[str, int], *, name: str = CLUSTER_QUEUE) -> dict:
    """A ClusterQueue with quota for exactly the nodes of ``shapes`` ({instance_type: count}),
    open to every namespace, preempting lower priorities within itself."""
    flavors = []
    for t, n in shapes.items():
        cap = _per_node(t)
        flavors.append(
            {
                "name": flavor_name(t),
                "resources": [{"name": r, "nominalQuota": _times(cap[r], n) if r in cap else "0"} for r in RESOURCES],
            }
        )
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "queueingStrategy": "BestEffortFIFO",
            "preemption": {"withinClusterQueue": "LowerPriority"},
            "resourceGroups": [{"coveredResources": list(RESOURCES), "flavors": flavors}],
        },
    }


def local_queue(namespace: str, name: str, *, cluster_queue_name: str = CLUSTER_QUEUE) -> dict:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue_name},
    }
