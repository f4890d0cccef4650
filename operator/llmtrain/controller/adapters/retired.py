"""The node faults and node-hours of deleted jobs, kept for the node MTBF (reliability.py).

reliability.py reads the evidence from the statuses of the jobs the operator caches, so deleting a
job would forget its failures. When the job watch sees a job deleted, its figures (the same
`reliability.job_record`: namespace, node faults, node-hours on its instance type) are added to an
operator-owned ConfigMap in the operator's namespace (`--reliability-configmap`, data key
`retired.json`):

    {"instances": {"p5.48xlarge": {"team-a": [3, 1234.5], ...}, ...}, "uids": [newest deleted jobs]}

Rules: one writer (the leader: only it runs the watch handlers); every write is conditional on the
resourceVersion just read (a 409 reads again and adds again to the fresh state); counters only go
up; a job's uid among the newest MAX_UIDS is not added twice (a write whose answer was lost, then
retried). The operator reads the ConfigMap the first time it estimates an MTBF and keeps what it
wrote since, so a restarted or failed-over operator starts from the same totals. The per-namespace
caps of reliability.py apply to a namespace's live and deleted jobs together. At most
MAX_NAMESPACES namespaces per instance type are kept apart; the others' figures go into one shared
bucket (`*`, not a namespace name), capped as one namespace. A job deleted while no operator
replica runs is not counted (the operator puts no finalizer on jobs).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time

from kubernetes.client.exceptions import ApiException

from . import kube
from .reliability import job_record

log = logging.getLogger("llmtrain.retired")

KEY = "retired.json"
MAX_NAMESPACES = 512
MAX_UIDS = 512
MAX_BYTES = 900_000  # of the ConfigMap's data: under the API server's 1 MiB object limit
SHARED = "*"
ATTEMPTS = 5


def _number(value: object) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return max(0.0, float(value))
    return 0.0


def parse(text: object) -> dict:
    """The ledger from the ConfigMap's data (anything unreadable: empty), in its canonical shape."""
    try:
        raw = json.loads(text) if isinstance(text, str) and len(text) <= MAX_BYTES else {}
    except ValueError:
        raw = {}
    raw = raw if isinstance(raw, dict) else {}
    instances: dict[str, dict[str, list]] = {}
    listed = raw.get("instances")
    for instance, per_ns in listed.items() if isinstance(listed, dict) else []:
        if isinstance(instance, str) and isinstance(per_ns, dict):
            instances[instance] = {
                ns: [int(_number(v[0])), _number(v[1])]
                for ns, v in list(per_ns.items())[: MAX_NAMESPACES + 1]
                if isinstance(ns, str) and isinstance(v, list) and len(v) == 2
            }
    uids = raw.get("uids")
    uids = uids if isinstance(uids, list) else []
    return {"instances": instances, "uids": [u for u in uids if isinstance(u, str)][-MAX_UIDS:]}


def contribution(job: dict, now: float) -> tuple[str, str, str, int, float] | None:
    """(uid, instance type, namespace, node faults, node-hours) of a deleted job, or None when it
    has nothing to add (no uid or instance type, nothing run and no fault)."""
    meta, spec = job.get("metadata"), job.get("spec")
    cluster = spec.get("cluster") if isinstance(spec, dict) else None
    instance = cluster.get("instanceType") if isinstance(cluster, dict) else None
    uid = meta.get("uid") if isinstance(meta, dict) else None
    if not isinstance(instance, str) or not isinstance(uid, str):
        return None
    rec = job_record(job, instance, now)
    if rec is None or (rec[1] == 0 and rec[2] <= 0):
        return None
    return uid, instance, *rec


def fold(ledger: dict, job: dict, now: float) -> dict | None:
    """`ledger` with the deleted `job`'s figures added, or None when there is nothing to add
    (`contribution`) or its uid is counted already. Pure."""
    got = contribution(job, now)
    if got is None or got[0] in ledger["uids"]:
        return None
    uid, instance, namespace, failures, hours = got
    instances = {k: dict(v) for k, v in ledger["instances"].items()}
    per_ns = instances.setdefault(instance, {})
    if namespace not in per_ns and len(per_ns) >= MAX_NAMESPACES:
        namespace = SHARED
    old = per_ns.get(namespace, [0, 0.0])
    per_ns[namespace] = [old[0] + failures, round(old[1] + hours, 6)]
    return {"instances": instances, "uids": [*ledger["uids"], uid][-MAX_UIDS:]}


def totals(ledger: dict, instance: str) -> dict[str, tuple[int, float]]:
    """Per namespace, (node faults, node-hours) of the deleted jobs on `instance`."""
    return {ns: (int(v[0]), float(v[1])) for ns, v in ledger["instances"].get(instance, {}).items()}


class RetiredJobs:
    """The ledger in its ConfigMap: `retire` adds a deleted job (a fresh read, then a conditional
    write), `of` answers from what was last read or written (loading it on first use)."""

    def __init__(self, namespace: str, name: str, api=kube, clock=time.time):
        self.namespace, self.name, self._api, self._clock = namespace, name, api, clock
        self._lock = threading.Lock()
        self._ledger: dict | None = None

    def _read(self) -> tuple[dict, str | None]:
        cm = self._api.get_configmap(self.namespace, self.name)
        if cm is None:
            return parse(None), None
        return parse((cm.get("data") or {}).get(KEY)), (cm.get("metadata") or {}).get("resourceVersion")

    def of(self, instance: str) -> dict[str, tuple[int, float]]:
        with self._lock:
            ledger = self._ledger
        if ledger is None:
            try:
                ledger, _ = self._read()
            except ApiException as err:  # no evidence this time; the next estimate asks again
                log.warning("cannot read ConfigMap %s/%s: %s", self.namespace, self.name, err.reason)
                return {}
            with self._lock:
                self._ledger = self._ledger or ledger
                ledger = self._ledger
        return totals(ledger, instance)

    def retire(self, job: dict) -> bool:
        """Add a deleted job; True if the ledger changed. Conditional writes, retried on conflict.
        A job with nothing to add costs no request (most deleted jobs never ran on a node)."""
        if contribution(job, self._clock()) is None:
            return False
        for _ in range(ATTEMPTS):
            ledger, rv = self._read()
            new = fold(ledger, job, self._clock())
            if new is None:
                with self._lock:
                    self._ledger = ledger
                return False
            data = {KEY: json.dumps(new, separators=(",", ":"), sort_keys=True)}
            try:
                if rv is None:
                    self._api.create_configmap(self.namespace, self.name, data)
                else:
                    self._api.replace_configmap(self.namespace, self.name, data, rv)
            except ApiException as err:
                if err.status == 409:  # someone wrote in between (or created it): read again
                    continue
                raise
            with self._lock:
                self._ledger = new
            return True
        raise RuntimeError(f"ConfigMap {self.namespace}/{self.name}: {ATTEMPTS} conflicting writes in a row")
