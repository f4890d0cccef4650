"""Sick nodes: what the cluster already says about a node's health, as facts for decide, and the
move that follows (pure, like decide.py; the node watch that feeds it is in watch.py, its table
in caches.NodeHealth).

The EKS node monitoring agent sets node conditions (AcceleratedHardwareReady: NVIDIA XIDs and
DCGM diagnostics; NetworkingReady, StorageReady, KernelReady, ContainerRuntimeReady) to False on
a node it finds unhealthy; the node stays Ready, so the scheduler keeps placing pods there. When
one of the watched conditions (operator configuration: --node-conditions, chart
nodeHealth.conditions, for clusters that run another node problem detector) is False on a node
holding a pod of a job's current attempt, decide moves the attempt away (situations_nodes.py):
the child is deleted (its pods get their grace period: the trainer saves a checkpoint on
SIGTERM), the next attempt avoids the node (status.avoidNodes, as bad-node avoidance does), and
no restart is spent: the node's fault is not the job's.

What bounds a flapping condition (False, True, False, ...):
  * the node goes into status.avoidNodes at the first move, so the next attempt is not placed on
    it again, and its later flaps do not reach the job (unless too few Ready nodes would remain:
    badnodes.plan_avoidance gives it back rather than make the job unschedulable);
  * every move starts a new attempt, whose pods must be scheduled and start before a later flap
    can find them on a node;
  * at most FREE_MOVES moves per job are free (status.nodeMoves counts them, and only goes up);
    every later one spends the restart budget with its backoff, so spec.resilience.maxRestarts
    ends a job that keeps landing on flapping nodes, as it ends one that keeps failing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from . import badnodes

DEFAULT_CONDITIONS = (
    "AcceleratedHardwareReady",
    "NetworkingReady",
    "StorageReady",
    "KernelReady",
    "ContainerRuntimeReady",
)
FREE_MOVES = 3
# a condition type as Kubernetes accepts one: a qualified name (an optional DNS prefix and "/")
CONDITION_TYPE = re.compile(r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
REASON_CHARS = 128  # of a condition's reason, kept per node
MESSAGE_CHARS = 240  # of a condition's message (badnodes.MESSAGE_CHARS)


@dataclass(frozen=True)
class SickNode:
    """One watched condition False on one node."""

    node: str
    condition: str
    reason: str = ""
    message: str = ""
    since: str | None = None  # its lastTransitionTime

    def words(self) -> str:
        why = ": ".join(p for p in (self.reason, self.message) if p)
        return f"node {self.node} has {self.condition}=False" + (f" ({why})" if why else "")


def sick_conditions(node: dict, watched: Iterable[str]) -> tuple[SickNode, ...]:
    """The watched conditions that are False on `node` (a Node as the API returns it)."""
    name = (node.get("metadata") or {}).get("name") or ""
    wanted = set(watched)
    out = []
    for c in (node.get("status") or {}).get("conditions") or []:
        if not isinstance(c, dict) or c.get("type") not in wanted or c.get("status") != "False":
            continue
        out.append(
            SickNode(
                node=name,
                condition=str(c["type"]),
                reason=str(c.get("reason") or "")[:REASON_CHARS],
                message=str(c.get("message") or "")[:MESSAGE_CHARS],
                since=c.get("lastTransitionTime") if isinstance(c.get("lastTransitionTime"), str) else None,
            )
        )
    return tuple(sorted(out, key=lambda s: s.condition))


def under(pods: Iterable[dict], health: Mapping[str, tuple[SickNode, ...]]) -> tuple[SickNode, ...]:
    """The sick conditions of the nodes the pods (status.pod_summary) are placed on, by node."""
    nodes = sorted({p["node"] for p in pods if p.get("node") and p.get("phase") not in ("Succeeded", "Failed")})
    return tuple(s for n in nodes for s in health.get(n, ()))


def amend_move(
    update: dict, sick: tuple[SickNode, ...], *, attempt: int, bad_nodes: list[dict], ready, needed: int, when: str
) -> tuple[dict, ...]:
    """Add the move's forensics to the restart `update` (in place): each sick node in
    status.badNodes (reason: the condition), the nodes the next attempt avoids. Returns the nodes
    blamed (llmtrain_operator_bad_nodes); none is tainted: the cluster marked them already."""
    first: dict[str, SickNode] = {}
    for s in sick:
        first.setdefault(s.node, s)
    failures = [
        {"node": s.node, "reason": f"{s.condition}=False", "message": ": ".join(p for p in (s.reason, s.message) if p)}
        for s in first.values()
    ]
    bad = badnodes.record(bad_nodes, failures, attempt, when)
    update["badNodes"] = bad
    if update.get("phase") == "Restarting":
        avoid, why = badnodes.plan_avoidance(bad, set(ready) if ready is not None else None, needed)
        update["avoidNodes"] = avoid
        if why:
            update["message"] += f"; {why}"
    return tuple({"node": f["node"], "reason": f["reason"]} for f in failures)
