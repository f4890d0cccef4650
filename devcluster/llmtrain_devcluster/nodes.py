"""Registering kwok-simulated nodes (shaped by :mod:`.chain`) and waiting until kwok has them
Ready."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import chain
from .process import DevClusterError, log_tail, wait_until

__all__ = ["add_nodes"]


def add_nodes(api: Any, shapes: dict[str, int], *, timeout: float, kwok_log: Path) -> list[str]:
    """Create nodes ``{instance_type: count}`` through ``api`` (a kubernetes ``ApiClient``),
    numbered after the existing ones of each type; wait until all are Ready; return their names."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    existing = core.list_node(label_selector="type=kwok").items
    start = {t: sum(1 for n in existing if n.metadata.labels.get(chain.INSTANCE_TYPE_LABEL) == t) for t in shapes}
    names = []
    for node in chain.node_manifests(shapes, start):
        core.create_node(node)
        names.append(node["metadata"]["name"])

    def ready() -> bool:  # one LIST per poll, not one GET per node (hundreds at scale)
        ok = {
            n.metadata.name
            for n in core.list_node(label_selector="type=kwok").items
            if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
        }
        return ok.issuperset(names)

    def fail(msg: str) -> Exception:
        return DevClusterError(f"kwok nodes {msg}\n--- tail of {kwok_log} ---\n{log_tail(kwok_log)}")

    wait_until(ready, timeout=timeout, what=f"{len(names)} kwok nodes Ready", on_fail=fail)
    return names
