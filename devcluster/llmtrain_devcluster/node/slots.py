"""Slots: what keeps two real nodes on one machine (two dev clusters, e.g. two pytest-xdist
workers) apart. A slot ``n`` owns the bridge ``llmt<n>``, the subnet ``10.245.<n>.0/24`` (bridge IP
``.1``), the cgroup root ``/llmtrain-<n>`` and the containerd content store under
``$LLMTRAIN_CACHE/node/slot-<n>``; ports are free_port()'s, sockets and the rest live in the
cluster's state directory.

A slot is claimed with ``flock`` on ``$LLMTRAIN_CACHE/node/slot-<n>.lock``. The lock's open file is
handed to a tiny holder process (``sleep``) that lives until the node's ``down`` has removed the
bridge and the cgroups, and is stopped last: no other node can take the slot while any of it is
still there, and a node that died with its machine frees its slot with its holder.

Not 10.244.x: kwok hands out pod IPs from 10.244.0.0/16 (:data:`..chain.POD_CIDR`), so a simulated
pod's IP could equal a real one's.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..process import DevClusterError
from ..tools import cache_dir

__all__ = ["SLOTS", "Slot", "claim_slot", "slot_dir"]

SLOTS = 16


@dataclass(frozen=True)
class Slot:
    index: int

    @property
    def bridge(self) -> str:
        return f"llmt{self.index}"

    @property
    def subnet(self) -> str:
        return f"10.245.{self.index}.0/24"

    @property
    def ip(self) -> str:
        """The bridge's own address: the node IP, the kubelet's and CoreDNS's bind address."""
        return f"10.245.{self.index}.1"

    @property
    def prefix_len(self) -> int:
        return 24

    @property
    def pod_range(self) -> tuple[str, str]:
        return f"10.245.{self.index}.10", f"10.245.{self.index}.250"

    @property
    def cgroup_root(self) -> str:
        return f"/llmtrain-{self.index}"


def slot_dir(index: int) -> Path:
    """The slot's persistent directory (its lock file sits beside it)."""
    return cache_dir() / "node" / f"slot-{index}"


def claim_slot(log: Path) -> tuple[Slot, subprocess.Popen]:
    """The first free slot and the process now holding its lock (stop it to release the slot)."""
    base = cache_dir() / "node"
    base.mkdir(parents=True, exist_ok=True)
    for i in range(SLOTS):
        fd = os.open(base / f"slot-{i}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            with open(log, "ab") as out:
                holder = subprocess.Popen(
                    ["sleep", "infinity"],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    pass_fds=(fd,),
                )
            slot_dir(i).mkdir(parents=True, exist_ok=True)
            return Slot(i), holder
        finally:
            os.close(fd)  # the holder keeps the lock (same open file description)
    raise DevClusterError(
        f"all {SLOTS} real-node slots are taken (locks in {base}): stop another dev cluster's "
        "real node (python -m llmtrain_devcluster down --state-dir ...) first"
    )
