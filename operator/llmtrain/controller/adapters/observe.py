"""observe: every read the reconciler makes, into one frozen snapshot (`snapshot.Observed`).

The job comes from the watch (or our last write's response, or a GET after a conflict); its backend
is decided once (backends.choose: status.backend once written) and its spec resolved once per uid
and generation; its children (of its backend's kind), pods, the monitor's latest scrape and the
sick nodes under its pods (sicknodes.py) come from the watch-fed caches (caches.py). Five reads are
made only when a situation asks for them (`Plan.need`, `more`): the failed attempt's pod failures
(nodes.py: they may still be on their way through the pod watch), the Ready nodes of the instance
type (for avoidNodes), the Kueue Workload of a suspended (queued or preempted) child (kueue.py),
for a new attempt of a job with checkpoint.intervalMinutes auto, the instance type's node MTBF
(reliability.py), and, for the write that marks a job Succeeded, the trainer's final summary its
pods left (ending.py).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ... import backends
from ...catalog import instance_type
from ...pod_contract import child_name
from ...render import ATTEMPT_LABEL
from ...status import TERMINAL, Phase, parse
from ..policy import ending, sicknodes
from ..policy.child_status import parse_time, startup_problem
from ..policy.decide import SPEC_HASH
from ..policy.snapshot import Child, Observed
from . import kueue, owners, taints
from .clock import now

if TYPE_CHECKING:
    from ..operator import Operator


def attempt_of(obj: dict) -> int | None:
    try:
        return int(obj["metadata"]["labels"][ATTEMPT_LABEL])
    except (KeyError, ValueError, TypeError):
        return None


def owned_by(obj: dict, uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])


def child_of(obj: dict, uid: str, backend: backends.Backend | None = None) -> Child:
    """The Child fact of one child object (`backend`: its backend; None: the default's)."""
    meta = obj["metadata"]
    state = (backend or backends.get(None)).state(obj)
    return Child(
        name=meta["name"],
        attempt=attempt_of(obj),
        owned=owned_by(obj, uid),
        deleting=bool(meta.get("deletionTimestamp")),
        state=state.state,
        failure_message=state.failure_message,
        spec_hash=(meta.get("annotations") or {}).get(SPEC_HASH),
        rendezvous_id=state.rendezvous_id,
        uid=meta.get("uid") or "",
        suspended=state.suspended,
    )


def is_kind(obj: dict, backend: backends.Backend) -> bool:
    return (obj.get("apiVersion"), obj.get("kind")) == (backend.child.api_version, backend.child.kind)


# the live phases on the wire (a phase this version cannot read is not live: parse() reads it as None)
_LIVE = frozenset(p.value for p in Phase if p not in TERMINAL)
_ACTIVE = (Phase.PENDING, Phase.RUNNING, Phase.RESTARTING)


def job_backend(op: Operator, namespace: str, raw_status: dict, raw_spec: dict) -> str:
    cfg = op.config
    requested = (raw_spec.get("cluster") or {}).get("backend") if isinstance(raw_spec.get("cluster"), dict) else None
    return backends.choose(
        raw_status.get("backend"),
        bool(raw_status.get("phase")),
        requested if isinstance(requested, str) else None,
        namespace,
        cfg.default_backend,
        cfg.namespace_backends,
    )


def unseen_child(raw_status: dict, name: str, children: dict) -> str | None:
    """The child a live job's status records for its current attempt, when the watch has not
    brought it (not in `children`): after an operator restart the jobs' events come before their
    children's."""
    recorded = raw_status.get("child") or raw_status.get("pytorchJob")
    if (
        raw_status.get("phase") in _LIVE
        and recorded == child_name(name, raw_status.get("attempt") or 1)
        and recorded not in children
    ):
        return recorded
    return None


def observe(op: Operator, job: dict, first_sight: bool) -> Observed:
    meta = job["metadata"]
    namespace, name, uid = meta["namespace"], meta["name"], meta.get("uid") or ""
    raw_status, raw_spec = job.get("status") or {}, job.get("spec") or {}
    status = parse(raw_status)
    chosen = job_backend(op, namespace, raw_status, raw_spec)
    backend = backends.BACKENDS.get(chosen)
    spec, error = op.specs.resolve(uid, meta.get("generation"), name, raw_spec, chosen)
    # only the job's backend's kind: anything else labelled with its name is not an attempt of it
    objs = {n: o for n, o in op.attempts.of(namespace, name).items() if backend is not None and is_kind(o, backend)}
    attempt = status.attempt or 1
    awaiting = False
    recorded = unseen_child(raw_status, name, objs)
    if recorded is not None and backend is not None and backend.name in op.config.backends:
        # Right after the start, wait a little for the watch; then one GET tells.
        if first_sight and op.watch_is_fresh():
            awaiting = True
        else:
            found = op.kube.get_child(backend.child, namespace, recorded)
            if found is not None:
                op.attempts.put(found)
                objs[recorded] = found
    children = tuple(child_of(o, uid, backend) for o in objs.values()) if backend is not None else ()
    current = next((c for c in children if c.name == child_name(name, attempt) and c.owned), None)
    pods: tuple[dict, ...] = ()
    if status.phase in (Phase.PENDING, Phase.RESTARTING) and current is not None and backend is not None:
        seen = op.pods.of(namespace, name, attempt)
        # Only the pods of the attempt's own child: anyone can label a pod like a worker. What decide
        # reads of them is why they do not start (startup_problem): with none among the pods seen,
        # none among the trusted ones, so the owner chain (a JobSet's Job: a read) is checked only then.
        if seen and startup_problem(seen) is not None:
            pods = tuple(owners.trusted(seen, op.owners.of(backend, namespace, current)))
    sick: tuple[sicknodes.SickNode, ...] = ()
    if status.phase in _ACTIVE and current is not None and backend is not None and not current.suspended:
        seen = op.pods.of(namespace, name, attempt)
        health = op.node_health.of({p["node"] for p in seen if p.get("node")})
        if health:  # only then the owner chain (a JobSet's Job: a read): a hand-made pod blames no node
            sick = sicknodes.under(owners.trusted(seen, op.owners.of(backend, namespace, current)), health)
    progress = op.progress.of(namespace, name, attempt) if status.phase == Phase.RUNNING else None
    pod_nodes = None
    if progress is not None and progress.stragglers is not None and current is not None and backend is not None:
        trusted = owners.trusted(op.pods.of(namespace, name, attempt), op.owners.of(backend, namespace, current))
        pod_nodes = frozenset(p["node"] for p in trusted if p.get("node"))
    return Observed(
        namespace=namespace,
        name=name,
        uid=uid,
        generation=meta.get("generation"),
        resource_version=meta.get("resourceVersion"),
        raw_spec=raw_spec,
        spec=spec,
        spec_error=error,
        raw_status=raw_status,
        status=status,
        now=now(),
        backend=chosen,
        creation_time=parse_time(meta.get("creationTimestamp")),
        children=children,
        first_sight=first_sight,
        awaiting_watch=awaiting,
        pods=pods,
        progress=progress,
        sick_nodes=sick,
        pod_nodes=pod_nodes,
    )


def more(op: Operator, o: Observed, need: str) -> Observed:
    """The snapshot with the read a situation asked for."""
    if need == "failures":
        current = o.child(child_name(o.name, o.attempt))
        backend = backends.BACKENDS.get(o.backend)
        trusted = (
            op.owners.of(backend, o.namespace, current)
            if current is not None and current.owned and backend is not None
            else frozenset()
        )
        return o.with_(
            failures=tuple(op.failures.wait_for_failures(o.namespace, o.name, o.attempt, owner=trusted)),
            ran_nodes=frozenset(op.failures.attempt_nodes(o.namespace, o.name, o.attempt, trusted)),
        )
    if need == "ready_nodes":
        ready = None
        if o.spec is not None:
            inst = instance_type(o.spec.cluster.instance_type)
            found = taints.ready_nodes(inst.name, inst.is_gpu)
            ready = frozenset(found) if found is not None else None
        return o.with_(ready_nodes=ready, ready_nodes_read=True)
    if need == "workload":
        current = o.child(child_name(o.name, o.attempt))
        return o.with_(workload=kueue.read(o.namespace, current.uid if current is not None else ""), workload_read=True)
    if need == "final":
        return _final(op, o)
    if need == "node_mtbf":
        node = op.reliability.of(o.spec.cluster.instance_type) if o.spec is not None else None
        return o.with_(node_mtbf=node, node_mtbf_read=True)
    raise ValueError(f"unknown need {need!r}")


# How long `_final` waits for an ended pod of the attempt to come through the pod watch: the
# child's Succeeded condition and its pod's end arrive on two watches, in either order (its
# controller writes the condition after it saw the pod end, usually well within this).
FINAL_WAIT_SECONDS = 2.0
ENDED_POD_PHASES = ("Succeeded", "Failed")


def _final(op: Operator, o: Observed, timeout: float = FINAL_WAIT_SECONDS) -> Observed:
    """The snapshot with the current attempt's final summary (`Plan.need` "final"), from its own
    child's pods only (owners.py). Waits up to `timeout` while the pod watch has pods of the
    attempt but none has ended yet; with no pods of the attempt known (deleted, or never seen by
    this process) it does not wait."""
    current = o.child(child_name(o.name, o.attempt))
    backend = backends.BACKENDS.get(o.backend)
    trusted = (
        op.owners.of(backend, o.namespace, current)
        if current is not None and current.owned and backend is not None
        else frozenset()
    )
    deadline = time.monotonic() + timeout
    while True:
        pods = owners.trusted(op.pods.of(o.namespace, o.name, o.attempt), trusted)
        if not pods or any(p.get("phase") in ENDED_POD_PHASES for p in pods) or time.monotonic() >= deadline:
            return o.with_(final=ending.summary_of(pods), final_read=True)
        time.sleep(0.05)
