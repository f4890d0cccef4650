"""The kubelet's configuration, certificates and command line.

What this machine lacks, and how the configuration goes around it:

- cgroup v1 (the kubelet refuses it unless ``failCgroupV1: false``), no systemd
  (``cgroupDriver: cgroupfs``, the cgroup root made beforehand by :mod:`.cgroups`);
- no swap accounting (``failSwapOn: false``), a developer's disk (``evictionHard: {}`` and image GC
  at 100%: dev disk thresholds would otherwise evict pods and delete imported images);
- no iptables (``makeIPTablesUtilChains: false``), no kube-proxy.

Authentication: a client certificate for ``system:node:<name>`` (group ``system:nodes``) signed by
the cluster CA (the Node authorizer and NodeRestriction accept it; no bootstrap token, no CSR);
a serving certificate for the bridge IP; the API server calls it with its own client certificate
(``kubectl logs``/``exec``), checked with x509 against the CA and authorised by webhook
(SubjectAccessReview); anonymous requests are refused. The kubelet listens on the bridge IP only
(a node IP cannot be loopback), its healthz on 127.0.0.1.

The node is tainted ``llmtrain.dev/real-node=true:NoSchedule`` and labelled
``llmtrain.dev/node-kind=real`` and ``node.kubernetes.io/instance-type=cpu`` (the catalog's CPU
type): a pod lands on it only when it tolerates the taint, and no GPU job (which selects a GPU
instance type) ever does.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import yaml

from .. import kubeconfigs, pki
from .slots import Slot

__all__ = [
    "INSTANCE_TYPE",
    "NODE_KIND_LABEL",
    "TAINT",
    "KubeletPaths",
    "argv",
    "config_yaml",
    "write_certs",
]

NODE_KIND_LABEL = "llmtrain.dev/node-kind"
TAINT = {"key": "llmtrain.dev/real-node", "value": "true", "effect": "NoSchedule"}


def job_on_the_node(job: dict, image: str) -> dict:
    """A copy of the LLMTrainingJob ``job`` (a dict, as in examples/) whose pods run on the real
    node: ``image`` (imported there, never pulled) and the node's :func:`placement` in its
    spec.cluster."""
    out = copy.deepcopy(job)
    out["spec"]["cluster"].update(image=image, imagePullPolicy="Never", **placement())
    return out


def placement() -> dict:
    """What a pod (or an LLMTrainingJob's spec.cluster) adds to land on the real node and nowhere
    else: the node's own label as its node selector, and the toleration of its taint."""
    return {
        "nodeSelector": {NODE_KIND_LABEL: "real"},
        "tolerations": [{"key": TAINT["key"], "operator": "Exists", "effect": TAINT["effect"]}],
    }


INSTANCE_TYPE = "cpu"  # operator/llmtrain/data/instances.yaml: the CPU type local and CI jobs use
CLUSTER_DOMAIN = "cluster.local"


@dataclass(frozen=True)
class KubeletPaths:
    dir: Path  # config, kubeconfig, pki
    root: Path
    pod_logs: Path
    volume_plugins: Path
    client_ca: Path
    runtime_socket: Path

    @property
    def config(self) -> Path:
        return self.dir / "config.yaml"

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def pki(self) -> Path:
        return self.dir / "pki"


def write_certs(ca: pki.CertificateAuthority, paths: KubeletPaths, *, name: str, ip: str, server: str) -> None:
    """The kubelet's serving certificate and its kubeconfig (client certificate embedded)."""
    ca.issue_to_files(
        paths.pki / "kubelet.crt",
        paths.pki / "kubelet.key",
        f"system:node:{name}",
        orgs=("system:nodes",),
        server=True,
        dns=(name, "localhost"),
        ips=(ip, "127.0.0.1"),
    )
    cert, key = ca.issue(f"system:node:{name}", orgs=("system:nodes",), client=True)
    kubeconfigs.write_cert_kubeconfig(
        paths.kubeconfig, server=server, ca_pem=ca.cert_pem, user=f"system:node:{name}", cert_pem=cert, key_pem=key
    )


def config_yaml(paths: KubeletPaths, slot: Slot, *, port: int, healthz_port: int, max_pods: int = 20) -> str:
    cfg = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": slot.cgroup_root,
        "cgroupsPerQOS": True,
        "containerRuntimeEndpoint": f"unix://{paths.runtime_socket}",
        "address": slot.ip,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "tlsCertFile": str(paths.pki / "kubelet.crt"),
        "tlsPrivateKeyFile": str(paths.pki / "kubelet.key"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(paths.client_ca)},
        },
        "authorization": {"mode": "Webhook"},
        "staticPodPath": "",
        "clusterDomain": CLUSTER_DOMAIN,
        "clusterDNS": [slot.ip],
        "resolvConf": "",
        "registerNode": True,
        "registerWithTaints": [TAINT],
        "failSwapOn": False,
        "evictionHard": {},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "maxPods": max_pods,
        "podPidsLimit": 4096,
        "protectKernelDefaults": False,
        "makeIPTablesUtilChains": False,
        "podLogsDir": str(paths.pod_logs),
        "volumePluginDir": str(paths.volume_plugins),
        "syncFrequency": "10s",
        "nodeStatusUpdateFrequency": "10s",
        "nodeStatusReportFrequency": "1m",
        "fileCheckFrequency": "20s",
        "shutdownGracePeriod": "0s",
    }
    return yaml.safe_dump(cfg, sort_keys=False)


def argv(kubelet: Path, paths: KubeletPaths, *, name: str, ip: str, verbosity: int = 1) -> list:
    labels = {NODE_KIND_LABEL: "real", "node.kubernetes.io/instance-type": INSTANCE_TYPE}
    return [
        kubelet,
        f"--config={paths.config}",
        f"--kubeconfig={paths.kubeconfig}",
        f"--root-dir={paths.root}",
        f"--cert-dir={paths.pki}",
        f"--hostname-override={name}",
        f"--node-ip={ip}",
        "--node-labels=" + ",".join(f"{k}={v}" for k, v in labels.items()),
        f"--v={verbosity}",
    ]
