"""The node's network: a Linux bridge of our own with the slot's ``.1`` address, and the CNI
``bridge`` plugin attaching each pod to it with an address from ``host-local``.

The bridge plugin is not the gateway (``isGateway: false``: it would enable the host's
``net.ipv4.ip_forward``) and does no masquerading (``ipMasq: false``: no iptables rule), so pods
get no default route: they reach each other, the node's own address (the kubelet, CoreDNS) and
nothing else. ``hairpinMode`` lets a pod reach itself through a Service-less FQDN. No iptables rule
is ever added and ``ip_forward`` is left as it is.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from ..process import DevClusterError
from .slots import Slot

__all__ = ["CNI_NAME", "bridge_exists", "cni_conflist", "create_bridge", "delete_bridge"]

CNI_NAME = "llmtrain"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise DevClusterError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def bridge_exists(name: str) -> bool:
    return _ip("link", "show", "dev", name, check=False).returncode == 0


def create_bridge(slot: Slot) -> None:
    """The slot's bridge with its address, up; one left by a node that died is replaced."""
    delete_bridge(slot.bridge)
    _ip("link", "add", slot.bridge, "type", "bridge")
    _ip("addr", "add", f"{slot.ip}/{slot.prefix_len}", "dev", slot.bridge)
    _ip("link", "set", slot.bridge, "up")


def delete_bridge(name: str) -> None:
    """Delete it (its pods' veths are gone with their network namespaces)."""
    if bridge_exists(name):
        _ip("link", "del", name)


def cni_conflist(slot: Slot, ipam_dir: Path) -> str:
    start, end = slot.pod_range
    return json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": CNI_NAME,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": slot.bridge,
                    "isGateway": False,
                    "isDefaultGateway": False,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(ipam_dir),
                        "ranges": [[{"subnet": slot.subnet, "rangeStart": start, "rangeEnd": end, "gateway": slot.ip}]],
                    },
                },
            ],
        },
        indent=2,
    )
