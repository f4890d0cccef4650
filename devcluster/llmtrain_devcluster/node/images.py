"""Images on the real node: OCI archives imported into its containerd (``ctr images import``, as
``kind load`` does), never pulled from a registry.

:func:`import_image` is what other code calls to put an image on the node (the trainer image, the
node's own pause and busybox): it skips an archive whose manifest digest the node already holds
under the same name, which, with the containerd root kept per slot (:mod:`.slots`), makes a big
image's second import cost one ``ctr images ls``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from ..process import DevClusterError
from ..tools import find_tool
from .oci_archive import read_index

__all__ = ["NAMESPACE", "ctr", "images", "import_image"]

NAMESPACE = "k8s.io"  # the CRI plugin's containerd namespace: what the kubelet sees


def ctr(socket: Path | str, *args: str, timeout: float = 60.0, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [str(find_tool("ctr")), "-a", str(socket), "-n", NAMESPACE, *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise DevClusterError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def images(socket: Path | str) -> dict[str, str]:
    """The node's images: name -> manifest (or index) digest."""
    out = {}
    for line in ctr(socket, "images", "ls").stdout.splitlines()[1:]:
        words = line.split()
        if len(words) >= 3:
            out[words[0]] = words[2]
    return out


def _socket(node: Any) -> Path:
    """The containerd socket of the real node of a dev cluster (a DevCluster or its state dir)."""
    from .lifecycle import read_info

    state_dir = Path(getattr(node, "state_dir", node))
    info = read_info(state_dir)
    if not info.get("socket"):
        raise DevClusterError(f"no real node runs from {state_dir} (start it with up --chain --real-node)")
    return Path(info["socket"])


def import_image(node: Any, archive: Path | str, *, timeout: float = 1800.0) -> bool:
    """Import the OCI archive ``archive`` into the real node of ``node`` (a ``DevCluster`` or its
    state directory) under the name its index gives; returns False when the node already holds
    that name at the same manifest digest (nothing is read but the archive's ``index.json``)."""
    socket = _socket(node)
    want = read_index(archive)
    if images(socket).get(want.name) == want.digest:
        return False
    ctr(socket, "images", "import", str(archive), timeout=timeout)
    got = images(socket).get(want.name)
    if got != want.digest:
        raise DevClusterError(f"imported {archive} but the node holds {want.name} at {got}, not {want.digest}")
    return True
