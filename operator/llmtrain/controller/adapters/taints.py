"""The cluster's nodes, through the API (on worker threads, never the event loop): the Ready nodes
of an instance type (for status.avoidNodes), and the optional suspect taint on nodes blamed for a
failure (--suspect-taint-fraction), capped per instance type and per namespace, and expiring.
Moved whole out of nodes.py, which keeps the pod watch's failure forensics."""

from __future__ import annotations

import logging
import math
import re
import threading

from ...spec_constraints import INSTANCE_TYPE_LABEL

log = logging.getLogger("llmtrain.operator.nodes")

SUSPECT_TAINT = "llmtrain.dev/suspect"
# Who tainted a node and until when, on the node itself (so a restarted operator, or another
# replica, counts and expires them): the namespace as a label (counted with a label selector),
# the job and the expiry time as annotations.
SUSPECT_NAMESPACE_LABEL = "llmtrain.dev/suspect-namespace"
SUSPECT_JOB_ANNOTATION = "llmtrain.dev/suspect-job"
SUSPECT_EXPIRES_ANNOTATION = "llmtrain.dev/suspect-expires"


def taint_budget(total: int, tainted: int, fraction: float) -> int:
    """How many more nodes of a group (`total` nodes, `tainted` of them already suspect) may be
    tainted when at most `fraction` of the group may be: floor(fraction × total) − tainted, ≥ 0."""
    if fraction <= 0 or total <= 0:
        return 0
    return max(0, math.floor(fraction * total + 1e-9) - tainted)


def taint_value(reason: str) -> str:
    """A taint value is a label value: ≤ 63 of [A-Za-z0-9._-], alphanumeric at both ends."""
    value = re.sub(r"[^A-Za-z0-9._-]+", "-", reason).strip("-._")[:63].strip("-._")
    return value or "failed"


# --- the cluster's nodes (API calls; run on handler threads) --------------------------------------


def _node_selector(instance_type: str, is_gpu: bool) -> str | None:
    return f"{INSTANCE_TYPE_LABEL}={instance_type}" if is_gpu else None


# Nodes as the API returns them (dicts, camelCase), listed and patched with kube._request; a patch
# is a strategic merge patch, as the client's patch_node sends for an object (NODE_PATCH). The two
# patches stay written out in taint_nodes and untaint_expired: the RBAC test allows node patches
# only there (the chart grants them only with suspectNodeTaint on).
NODE_PATCH = "application/strategic-merge-patch+json"
CONFLICT_RETRIES = 3  # tries of one node's taint patch, each after reading the node again


def _is_ready(node: dict) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _taints(node: dict) -> list[dict]:
    return (node.get("spec") or {}).get("taints") or []


def _name(node: dict) -> str:
    return node["metadata"]["name"]


def _is_suspect(node: dict) -> bool:
    return any(t.get("key") == SUSPECT_TAINT for t in _taints(node))


def _nodes(selector: str | None) -> list[dict]:
    """The nodes matching the label selector (all of them for None); ApiException as the API says."""
    from . import kube

    return kube._request("GET", "/api/v1/nodes", {}, query={"labelSelector": selector} if selector else None)["items"]


def ready_nodes(instance_type: str, is_gpu: bool) -> set[str] | None:
    """Names of the Ready, schedulable nodes of the instance type; None if they cannot be listed."""
    from kubernetes.client.exceptions import ApiException

    try:
        items = _nodes(_node_selector(instance_type, is_gpu))
    except ApiException as err:
        log.warning("cannot list nodes of %s: %s %s", instance_type, err.status, err.reason)
        return None
    return {_name(n) for n in items if _is_ready(n)}


def _suspect_nodes_of(namespace: str) -> set[str]:
    items = _nodes(f"{SUSPECT_NAMESPACE_LABEL}={namespace}")
    return {_name(n) for n in items if _is_suspect(n)}


def taint_nodes(
    bad: list[dict],
    instance_type: str,
    is_gpu: bool,
    fraction: float,
    namespace: str = "",
    job: str = "",
    per_namespace: int = 2,
    ttl_seconds: float = 86400.0,
) -> list[str]:
    """Taint the bad nodes `llmtrain.dev/suspect=<reason>:NoSchedule` within the caps: at most
    `fraction` of the instance type's nodes, at most `per_namespace` nodes tainted for one
    namespace's jobs at once (so one tenant's failures cannot fence off a node group), each for
    `ttl_seconds` (`untaint_expired` takes it off). Returns the nodes newly tainted.
    Read-modify-write with the node's resourceVersion: a Node's taints list has no merge key, so a
    plain patch would replace the others' taints."""
    import datetime as dt

    from kubernetes.client.exceptions import ApiException

    from . import kube

    if fraction <= 0 or not bad or per_namespace <= 0:
        return []
    selector = _node_selector(instance_type, is_gpu)
    try:
        group = _nodes(selector)
        ours = _suspect_nodes_of(namespace)
    except ApiException as err:
        log.warning("cannot list nodes to taint: %s %s", err.status, err.reason)
        return []
    tainted = {_name(n) for n in group if _is_suspect(n)}
    budget = min(taint_budget(len(group), len(tainted), fraction), max(0, per_namespace - len(ours)))
    expires = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=ttl_seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")
    done: list[str] = []
    by_name = {_name(n): n for n in group}
    for b in bad:
        node = by_name.get(b["node"])
        if budget <= 0 or node is None or b["node"] in tainted or b["node"] in done:
            continue
        # A 409 means someone else wrote the node since it was read (the TTL controller annotates
        # every new node, kubelets update theirs): read it again and retry, so that a routine
        # write elsewhere does not move the taint onto another of the bad nodes.
        for attempt in range(1, CONFLICT_RETRIES + 1):
            taints = [*_taints(node), {"key": SUSPECT_TAINT, "value": taint_value(b["reason"]), "effect": "NoSchedule"}]
            try:
                kube._request(
                    "PATCH",
                    "/api/v1/nodes/{name}",
                    {"name": b["node"]},
                    {
                        "metadata": {
                            "resourceVersion": node["metadata"].get("resourceVersion"),
                            "labels": {SUSPECT_NAMESPACE_LABEL: namespace[:63]},
                            "annotations": {
                                SUSPECT_JOB_ANNOTATION: f"{namespace}/{job}",
                                SUSPECT_EXPIRES_ANNOTATION: expires,
                            },
                        },
                        "spec": {"taints": taints},
                    },
                    NODE_PATCH,
                )
            except ApiException as err:
                if err.status == 409 and attempt < CONFLICT_RETRIES:
                    try:  # the group's list again: the operator may list nodes, not get one
                        node = next((n for n in _nodes(selector) if _name(n) == b["node"]), None)
                    except ApiException as again:
                        log.warning("cannot read node %s again: %s %s", b["node"], again.status, again.reason)
                        break
                    if node is None or _is_suspect(node):
                        break  # another replica or job tainted it meanwhile: nothing to add
                    continue
                log.warning("cannot taint node %s: %s %s", b["node"], err.status, err.reason)
                break
            done.append(b["node"])
            budget -= 1
            break
    return done


def untaint_expired(now=None) -> list[str]:
    """Take the suspect taint (and its label and annotations) off every node whose taint expired,
    or whose expiry cannot be read. Returns those nodes."""
    import datetime as dt

    from kubernetes.client.exceptions import ApiException

    from . import kube

    now = now or dt.datetime.now(dt.UTC)
    try:
        items = _nodes(SUSPECT_NAMESPACE_LABEL)
    except ApiException as err:
        log.warning("cannot list suspect nodes: %s %s", err.status, err.reason)
        return []
    done = []
    for node in items:
        meta = node["metadata"]
        try:
            until = dt.datetime.fromisoformat(
                ((meta.get("annotations") or {}).get(SUSPECT_EXPIRES_ANNOTATION) or "").replace("Z", "+00:00")
            )
        except ValueError:
            until = now
        if until > now:
            continue
        taints = [t for t in _taints(node) if t.get("key") != SUSPECT_TAINT]
        try:
            kube._request(
                "PATCH",
                "/api/v1/nodes/{name}",
                {"name": meta["name"]},
                {
                    "metadata": {
                        "resourceVersion": meta.get("resourceVersion"),
                        "labels": {SUSPECT_NAMESPACE_LABEL: None},
                        "annotations": {SUSPECT_JOB_ANNOTATION: None, SUSPECT_EXPIRES_ANNOTATION: None},
                    },
                    "spec": {"taints": taints},
                },
                NODE_PATCH,
            )
        except ApiException as err:
            log.warning("cannot untaint node %s: %s %s", meta["name"], err.status, err.reason)
            continue
        log.info("suspect taint on node %s expired: removed", meta["name"])
        done.append(meta["name"])
    return done


def expire_taints_forever(interval: float, stop: threading.Event) -> None:
    """The expiry sweep, every `interval` seconds until `stop` (a daemon thread of the leader)."""
    while not stop.wait(interval):
        try:
            untaint_expired()
        except Exception:
            log.exception("suspect taint expiry failed")
