"""CoreDNS, the real node's cluster DNS: a host process (no pod, no Service, no kube-proxy) bound
to the node's bridge IP, which the kubelet gives pods as their nameserver.

It serves ``cluster.local`` and the reverse zones of the pod and service ranges from the API
(``kubernetes`` plugin; ``pods insecure`` answers ``a-b-c-d.<ns>.pod`` names), and answers
NXDOMAIN for every other name: there is no upstream, pods have no route off the node anyway.
A headless Service plus a pod's ``hostname``/``subdomain`` resolve as JobSet's rank-0 FQDN needs.

It reads the API as its own user, ``llmtrain:coredns`` (a client certificate), allowed only to
list and watch what the plugin reads (:func:`rbac`). Readiness: the ``ready`` plugin on a loopback
port, which answers 200 once the plugin has synced.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from ..components import SERVICE_CIDR
from .kubelet import CLUSTER_DOMAIN
from .slots import Slot

__all__ = ["USER", "argv", "corefile", "rbac"]

USER = "llmtrain:coredns"


def _reverse_zone(cidr: str) -> str:
    net = ipaddress.ip_network(cidr)
    octets = str(net.network_address).split(".")[: net.prefixlen // 8]
    return ".".join(reversed(octets)) + ".in-addr.arpa"


def corefile(slot: Slot, *, kubeconfig: Path, ready_port: int) -> str:
    zones = f"{CLUSTER_DOMAIN} {_reverse_zone(slot.subnet)} {_reverse_zone(SERVICE_CIDR)}"
    return f"""{" ".join(f"{z}:53" for z in zones.split())} {{
    bind {slot.ip}
    errors
    ready 127.0.0.1:{ready_port}
    kubernetes {zones} {{
        kubeconfig {kubeconfig}
        pods insecure
        ttl 5
    }}
}}
.:53 {{
    bind {slot.ip}
    errors
    template ANY ANY {{
        rcode NXDOMAIN
    }}
}}
"""


def rbac() -> list[dict]:
    name = "llmtrain:coredns"
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": [
                {"apiGroups": [""], "resources": ["services", "namespaces", "pods"], "verbs": ["list", "watch"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
        },
    ]


def argv(coredns: Path, corefile_path: Path) -> list:
    return [coredns, "-conf", corefile_path]
