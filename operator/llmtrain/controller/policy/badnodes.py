"""The node verdicts a restart writes, from the failures the pod watch saw (nodes.py): which node
each failed worker pod ran on (status.badNodes, `record`) and which nodes the next attempt keeps
away from (status.avoidNodes, `plan_avoidance`). Pure, like decide.py: forensics.py folds them into
the restart's status write."""

from __future__ import annotations

MAX_BAD_NODES = 20  # status.badNodes keeps the newest this many
MESSAGE_CHARS = 240  # of a termination message, in status and events


def record(
    bad_nodes: list[dict], failures: list[dict], attempt: int, when: str, limit: int = MAX_BAD_NODES
) -> list[dict]:
    """status.badNodes with this attempt's failures added (one entry per node and attempt), newest
    last, at most `limit` entries."""
    out = list(bad_nodes or [])
    seen = {(b.get("node"), b.get("attempt")) for b in out}
    for f in failures:
        if (f["node"], attempt) in seen:
            continue
        seen.add((f["node"], attempt))
        entry = {"node": f["node"], "reason": f["reason"], "attempt": attempt, "time": when}
        for key in ("pod", "exitCode", "xid"):
            if f.get(key) is not None:
                entry[key] = f[key]
        if f.get("message"):
            entry["message"] = f["message"][:MESSAGE_CHARS]
        out.append(entry)
    return out[-limit:]


def plan_avoidance(bad_nodes: list[dict], ready: set[str] | None, needed: int) -> tuple[list[str], str]:
    """(nodes to avoid, why) for the next attempt. Newest bad nodes first; a node is avoided only
    while at least `needed` Ready nodes of the instance type remain outside the avoided set.
    `ready` None: the nodes could not be counted, so nothing is avoided (better a retry on a
    suspect node than a job that can never schedule)."""
    newest_first: list[str] = []
    for b in reversed(bad_nodes or []):
        if b["node"] not in newest_first:
            newest_first.append(b["node"])
    if not newest_first:
        return [], ""
    if ready is None:
        return [], f"not avoiding {', '.join(newest_first)}: the nodes of the instance type could not be counted"
    avoid: list[str] = []
    for node in newest_first:
        if len(ready - set(avoid) - {node}) >= needed:
            avoid.append(node)
    kept = [n for n in newest_first if n not in avoid]
    why = f"avoiding {', '.join(avoid)}" if avoid else ""
    if kept:
        why += ("; " if why else "") + (
            f"not avoiding {', '.join(kept)}: only {len(ready)} Ready node(s) of the instance type for {needed} needed"
        )
    return sorted(avoid), why
