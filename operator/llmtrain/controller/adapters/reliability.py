"""How often the nodes of an instance type fail, as this operator has seen it: the MTBF that
`spec.checkpoint.intervalMinutes: auto` starts an attempt with (llmtrain/cadence.py has the prior
and the arithmetic).

From the LLMTrainingJobs' own statuses, as the watch last brought them (the work queue keeps each
job's latest object), never from a tally in memory: an operator restart reads the same statuses and
gets the same figure. Deleted jobs' figures are kept in an operator-owned ConfigMap (retired.py),
added when the watch sees the deletion, and count with the live ones. Per instance type
(spec.cluster.instanceType):

  * node-hours: per job, the time its training loop ran (status.goodput's productive, lost work,
    checkpoint stall, data wait and hang seconds; at most its wall time) × spec.cluster.nodes;
  * failures: per job, the attempts whose status.badNodes blames a node for a node fault: an NVIDIA
    XID that the driver documentation lists as a hardware fault (HARDWARE_XIDS: ECC, row remap,
    NVLink, fallen off the bus, GSP), an EFA error, or the node itself gone (pods deleted by the pod
    GC, lost, shut down). A job's own bugs (exit codes, OOM, NCCL errors, application XIDs such as
    13, 31 and 43) do not count: one tenant's crash loop must not shorten everyone's interval.

Hostile input: a tenant writes the termination messages the reasons are read from, so it can fake
an XID. A namespace's failures (its live and deleted jobs') count at most NAMESPACE_CEILING × the
prior's failure rate over its own node-hours, and at least the prior's weight (2): a tenant cannot
claim more failures than it ran nodes for, so one namespace without node-hours to show can at most
halve the MTBF the others start from (the interval by √2), and the interval itself stays within
cadence's clamp. badNodes keeps a job's newest 20 failures.

Cost: one pass over the cached jobs per instance type, at most every TTL seconds (an attempt of an
`auto` job asks when its child is created: observe.more("node_mtbf")).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from ... import cadence
from ...catalog import instance_types
from ..policy.child_status import parse_time

# NVIDIA's Xid catalog: hardware (or board firmware) faults, as opposed to application errors
HARDWARE_XIDS = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120})
# the node went away under the pod: the pod GC's DisruptionTarget, the node controller, a node shutdown
NODE_GONE = frozenset({"DeletionByPodGC", "NodeLost", "TerminationByKubelet", "NodeShutdown"})
EFA = "EFA error"
RAN = ("productive", "lostWork", "checkpointStall", "dataWait", "hang")  # status.goodput.seconds
NAMESPACE_CEILING = 10.0
MAX_NODES = 4096
TTL = 60.0


def node_fault(entry: object) -> bool:
    """Whether a status.badNodes entry blames the node's hardware (or its loss)."""
    if not isinstance(entry, dict):
        return False
    xid, why = entry.get("xid"), entry.get("reason")
    if isinstance(xid, int) and not isinstance(xid, bool):
        return xid in HARDWARE_XIDS
    if not isinstance(why, str):
        return False
    return why == EFA or why.split(" (", 1)[0] in NODE_GONE


def _number(value: object) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return max(0.0, float(value))
    return 0.0


def _dict(parent: dict, key: str) -> dict:
    value = parent.get(key)
    return value if isinstance(value, dict) else {}


def job_record(job: dict, instance: str, now: float) -> tuple[str, int, float] | None:
    """(namespace, failures, node-hours) of one job on `instance`, or None when it runs elsewhere."""
    cluster = _dict(_dict(job, "spec"), "cluster")
    if cluster.get("instanceType") != instance:
        return None
    meta, status = _dict(job, "metadata"), _dict(job, "status")
    raw_nodes = cluster.get("nodes", 1)
    nodes = min(MAX_NODES, max(1, raw_nodes)) if isinstance(raw_nodes, int) and not isinstance(raw_nodes, bool) else 1
    goodput = _dict(status, "goodput")
    seconds = _dict(goodput, "seconds")
    ran = min(sum(_number(seconds.get(k)) for k in RAN), _number(goodput.get("wallSeconds")))
    created_at = meta.get("creationTimestamp")
    try:
        created = parse_time(created_at) if isinstance(created_at, str) else None
    except ValueError:
        created = None
    ran = min(ran, max(0.0, now - created.timestamp())) if created is not None else 0.0
    bad = status.get("badNodes")
    attempts = {b.get("attempt") for b in (bad if isinstance(bad, list) else [])[:64] if node_fault(b)}
    return str(meta.get("namespace") or ""), len(attempts), ran * nodes / 3600.0


def estimate(
    jobs: Iterable[dict], instance: str, now: float, retired: Mapping[str, tuple[int, float]] | None = None
) -> cadence.NodeMTBF:
    """One node's MTBF on `instance`: the prior and the failures and node-hours of `jobs` and of
    the deleted jobs in `retired` (per namespace: failures, node-hours; retired.totals)."""
    gpus = instance_types()[instance].gpus_per_node if instance in instance_types() else 0
    prior = cadence.prior_node_mtbf_hours(gpus)
    per_namespace: dict[str, list[float]] = {ns: [float(f), float(h)] for ns, (f, h) in (retired or {}).items()}
    for job in jobs:
        rec = job_record(job, instance, now) if isinstance(job, dict) else None
        if rec is not None:
            acc = per_namespace.setdefault(rec[0], [0.0, 0.0])
            acc[0] += rec[1]
            acc[1] += rec[2]
    floor = int(cadence.PRIOR_FAILURES)
    failures = sum(
        min(int(f), max(floor, math.ceil(NAMESPACE_CEILING * hours / prior))) for f, hours in per_namespace.values()
    )
    hours = sum(h for _, h in per_namespace.values())
    return cadence.node_mtbf(instance, gpus, failures, hours)


class FleetReliability:
    """`estimate` over the operator's cached jobs and the deleted ones (`retired(instance)`), per
    instance type, at most once per `ttl`."""

    def __init__(
        self,
        jobs: Callable[[], list[dict]],
        ttl: float = TTL,
        clock=time.monotonic,
        wall=time.time,
        retired: Callable[[str], Mapping[str, tuple[int, float]]] | None = None,
    ):
        self._jobs, self._ttl, self._clock, self._wall = jobs, ttl, clock, wall
        self._retired = retired
        self._lock = threading.Lock()
        self._known: dict[str, tuple[float, cadence.NodeMTBF]] = {}

    def forget(self, instance: object) -> None:
        """The next `of(instance)` computes afresh (a deleted job's figures were just added)."""
        with self._lock:
            self._known.pop(instance, None)  # type: ignore[call-overload]  # any key: a miss is a no-op

    def of(self, instance: str) -> cadence.NodeMTBF:
        at = self._clock()
        with self._lock:
            known = self._known.get(instance)
        if known is not None and at - known[0] < self._ttl:
            return known[1]
        retired = self._retired(instance) if self._retired is not None else None
        value = estimate(self._jobs(), instance, self._wall(), retired)
        with self._lock:
            self._known[instance] = (at, value)
        return value
