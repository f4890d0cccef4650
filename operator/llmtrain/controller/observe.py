"""observe: every read the reconciler makes, into one frozen snapshot (`snapshot.Observed`).

The job comes from the watch (or our last write's response, or a GET after a conflict); its spec
is resolved once per uid and generation; its PyTorchJobs, pods and the monitor's latest scrape
come from the watch-fed caches (caches.py). Five reads are made only when a situation asks for
them (`Plan.need`, `more`): the failed attempt's pod failures (nodes.py: they may still be on their
way through the pod watch), the Ready nodes of the instance type (for avoidNodes), the Kueue
Workload of a suspended (queued or preempted) PyTorchJob (kueue.py), for a new attempt of a job
with checkpoint.intervalMinutes auto, the instance type's node MTBF (reliability.py), and, for the
write that marks a job Succeeded, the trainer's final summary its pods left (ending.py).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..catalog import instance_type
from ..render import ATTEMPT_LABEL, pytorchjob_name
from ..status import TERMINAL, Phase, parse
from . import ending, kueue, scrape, taints
from .clock import now
from .decide import SPEC_HASH
from .snapshot import Child, Observed
from .status import failure_message, parse_time, pytorchjob_state

if TYPE_CHECKING:
    from .operator import Operator


def attempt_of(ptj: dict) -> int | None:
    try:
        return int(ptj["metadata"]["labels"][ATTEMPT_LABEL])
    except (KeyError, ValueError, TypeError):
        return None


def owned_by(obj: dict, uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])


def child_of(ptj: dict, uid: str) -> Child:
    meta = ptj["metadata"]
    return Child(
        name=meta["name"],
        attempt=attempt_of(ptj),
        owned=owned_by(ptj, uid),
        deleting=bool(meta.get("deletionTimestamp")),
        state=pytorchjob_state(ptj),
        failure_message=failure_message(ptj),
        spec_hash=(meta.get("annotations") or {}).get(SPEC_HASH),
        rendezvous_id=((ptj.get("spec") or {}).get("elasticPolicy") or {}).get("rdzvId"),
        uid=meta.get("uid") or "",
        suspended=((ptj.get("spec") or {}).get("runPolicy") or {}).get("suspend") is True,
    )


# the live phases on the wire (a phase this version cannot read is not live: parse() reads it as None)
_LIVE = frozenset(p.value for p in Phase if p not in TERMINAL)


def unseen_child(raw_status: dict, name: str, ptjs: dict) -> str | None:
    """The PyTorchJob a live job's status records for its current attempt, when the watch has not
    brought it (not in `ptjs`): after an operator restart the jobs' events come before their
    PyTorchJobs'."""
    recorded = raw_status.get("pytorchJob")
    if (
        raw_status.get("phase") in _LIVE
        and recorded == pytorchjob_name(name, raw_status.get("attempt") or 1)
        and recorded not in ptjs
    ):
        return recorded
    return None


def observe(op: Operator, job: dict, first_sight: bool) -> Observed:
    meta = job["metadata"]
    namespace, name, uid = meta["namespace"], meta["name"], meta.get("uid") or ""
    raw_status, raw_spec = job.get("status") or {}, job.get("spec") or {}
    status = parse(raw_status)
    spec, error = op.specs.resolve(uid, meta.get("generation"), name, raw_spec)
    ptjs = op.attempts.of(namespace, name)
    attempt = status.attempt or 1
    awaiting = False
    recorded = unseen_child(raw_status, name, ptjs)
    if recorded is not None:
        # Right after the start, wait a little for the watch; then one GET tells.
        if first_sight and op.watch_is_fresh():
            awaiting = True
        else:
            found = op.kube.get_pytorchjob(namespace, recorded)
            if found is not None:
                op.attempts.put(found)
                ptjs[recorded] = found
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
        creation_time=parse_time(meta.get("creationTimestamp")),
        children=tuple(child_of(p, uid) for p in ptjs.values()),
        first_sight=first_sight,
        awaiting_watch=awaiting,
        # only the pods of the attempt's own PyTorchJob: anyone can label a pod like a worker
        pods=tuple(
            scrape.owned_pods(op.pods.of(namespace, name, attempt), ptjs.get(pytorchjob_name(name, attempt)), uid)
        )
        if status.phase in (Phase.PENDING, Phase.RESTARTING)
        else (),
        progress=op.progress.of(namespace, name, attempt) if status.phase == Phase.RUNNING else None,
    )


def more(op: Operator, o: Observed, need: str) -> Observed:
    """The snapshot with the read a situation asked for."""
    if need == "failures":
        current = o.child(pytorchjob_name(o.name, o.attempt))
        owner = current.uid if current is not None else ""
        return o.with_(
            failures=tuple(op.failures.wait_for_failures(o.namespace, o.name, o.attempt, owner=owner)),
            ran_nodes=frozenset(op.failures.attempt_nodes(o.namespace, o.name, o.attempt, owner)),
        )
    if need == "ready_nodes":
        ready = None
        if o.spec is not None:
            inst = instance_type(o.spec.cluster.instance_type)
            found = taints.ready_nodes(inst.name, inst.is_gpu)
            ready = frozenset(found) if found is not None else None
        return o.with_(ready_nodes=ready, ready_nodes_read=True)
    if need == "workload":
        current = o.child(pytorchjob_name(o.name, o.attempt))
        return o.with_(workload=kueue.read(o.namespace, current.uid if current is not None else ""), workload_read=True)
    if need == "final":
        return _final(op, o)
    if need == "node_mtbf":
        node = op.reliability.of(o.spec.cluster.instance_type) if o.spec is not None else None
        return o.with_(node_mtbf=node, node_mtbf_read=True)
    raise ValueError(f"unknown need {need!r}")


# How long `_final` waits for an ended pod of the attempt to come through the pod watch: the
# PyTorchJob's Succeeded condition and its pod's end arrive on two watches, in either order (the
# training-operator writes the condition after it saw the pod end, usually well within this).
FINAL_WAIT_SECONDS = 2.0
ENDED_POD_PHASES = ("Succeeded", "Failed")


def _final(op: Operator, o: Observed, timeout: float = FINAL_WAIT_SECONDS) -> Observed:
    """The snapshot with the current attempt's final summary (`Plan.need` "final"). Waits up to
    `timeout` while the pod watch has pods of the attempt but none has ended yet; with no pods of
    the attempt known (deleted, or never seen by this process) it does not wait."""
    ptj = op.attempts.of(o.namespace, o.name).get(pytorchjob_name(o.name, o.attempt))
    deadline = time.monotonic() + timeout
    while True:
        pods = scrape.owned_pods(op.pods.of(o.namespace, o.name, o.attempt), ptj, o.uid)
        if not pods or any(p.get("phase") in ENDED_POD_PHASES for p in pods) or time.monotonic() >= deadline:
            return o.with_(final=ending.summary_of(pods), final_read=True)
        time.sleep(0.05)
