"""The node's cgroup root (``/llmtrain-<slot>``), made before the kubelet starts and removed at
``down``.

The kubelet requires its ``cgroupRoot`` to exist in every hierarchy (v1: "cgroup has some missing
paths"), and a new v1 cpuset cgroup starts with empty ``cpuset.cpus``/``cpuset.mems``, which no task
can join: they are copied from the parent. Removal waits for the tree to empty (pause processes sit
in state D for a second or two after SIGKILL) and retries ``rmdir`` on EBUSY, deepest first.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from pathlib import Path

__all__ = ["create", "hierarchies", "pids", "remove"]

CGROUP_FS = Path("/sys/fs/cgroup")


def _v2() -> bool:
    return (CGROUP_FS / "cgroup.controllers").is_file()


def hierarchies() -> list[Path]:
    """Every mounted hierarchy the kubelet looks in (v1: one per controller mount; v2: one)."""
    if _v2():
        return [CGROUP_FS]
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, fstype = left.split(), right.split()[0]
        # cgroup2 beside v1 (a hybrid host's "unified"): runc makes the container's cgroup there too
        if fstype in ("cgroup", "cgroup2") and Path(fields[4]).parent == CGROUP_FS:
            out.append(Path(fields[4]))
    return sorted(set(out))


def create(root: str) -> None:
    for h in hierarchies():
        d = h / root.lstrip("/")
        d.mkdir(exist_ok=True)
        if not _v2() and (d / "cpuset.cpus").exists():
            for f in ("cpuset.cpus", "cpuset.mems"):
                if not (d / f).read_text().strip():
                    (d / f).write_text((h / f).read_text())


def _dirs(root: str) -> list[Path]:
    """Every cgroup directory of the tree in every hierarchy, deepest first."""
    out = []
    for h in hierarchies():
        top = h / root.lstrip("/")
        if top.is_dir():
            out += [Path(d) for d, _, _ in os.walk(top)]
    return sorted(out, key=lambda p: len(p.parts), reverse=True)


def pids(root: str) -> set[int]:
    found: set[int] = set()
    for d in _dirs(root):
        try:
            found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
        except OSError:
            pass
    return found


def kill_all(root: str) -> None:
    for pid in pids(root):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def remove(root: str, timeout: float = 20.0) -> list[str]:
    """SIGKILL whatever is left in the tree, wait until it is empty, rmdir it; returns what is
    left (nothing unless ``timeout`` ran out)."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        kill_all(root)
        left = []
        for d in _dirs(root):
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError as e:
                if e.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                    raise
                left.append(str(d))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(delay)
        delay = min(delay * 1.5, 0.2)
