"""What the watches have seen, kept in memory for the reconciler's snapshots (observe.py): the
children (PyTorchJobs, JobSets) of every job, the worker pods of every attempt, the monitor's latest scrape of every
Running attempt, the resolved spec of every job generation, and the jobs per phase (a gauge).

None of them is a kopf index: kopf starts no handler before every index's initial list is
processed, and at ~25 ms of kopf's per-object work per child that held a restarted operator's
re-adoption of 1,000 jobs back for tens of seconds (the pods of 1,000 running jobs, longer).
Written on the event loop and by the workers, so every table is touched under its lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from ...render import JOB_LABEL
from ...spec import LLMTrainingJobSpec
from ...status import Phase
from ...validation import InvalidJob, Policy, validate
from ..policy.progress import Progress
from ..policy.sicknodes import SickNode
from ..workqueue import newer


class PhaseGauge:
    """Jobs per phase for the llmtrain_operator_jobs gauge, counted incrementally."""

    def __init__(self, gauge):
        self._gauge, self._lock = gauge, threading.Lock()
        self._phases: dict[tuple[str, str], str] = {}
        self._counts = {p.value: 0 for p in Phase}

    def track(self, namespace: str, name: str, phase: str | None) -> None:
        with self._lock:
            old = self._phases.pop((namespace, name), None)
            if old in self._counts:
                self._counts[old] -= 1
            if phase:
                self._phases[(namespace, name)] = phase
                if phase in self._counts:
                    self._counts[phase] += 1
            for p in {old, phase} & set(self._counts):
                self._gauge.labels(p).set(self._counts[p])


class AttemptCache:
    """The children the operator's watches have seen (and those it created itself, from the create's
    response), per job: every backend's kind, by name (observe.py keeps the job's backend's)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._by_job: dict[tuple[str, str], dict[str, dict]] = {}

    def put(self, ptj: dict) -> bool:
        """Remember `ptj` unless this version or a later one is known; False then (e.g. the
        watch's echo of our own create, whose response was put here: nothing new to decide on)."""
        meta = ptj["metadata"]
        job = (meta.get("labels") or {}).get(JOB_LABEL)
        if not job:
            return False
        with self._lock:
            known = self._by_job.setdefault((meta["namespace"], job), {})
            old = known.get(meta["name"])
            if old is not None and (
                old["metadata"].get("resourceVersion") == meta.get("resourceVersion") or not newer(ptj, old)
            ):
                return False
            known[meta["name"]] = ptj
            return True

    def drop(self, namespace: str, job: str, name: str, kind: str | None = None) -> None:
        """Forget child `name` (only if it is of `kind`, when given: a deleted PyTorchJob's event
        must not drop a JobSet of the same name, a job re-created on the other backend)."""
        with self._lock:
            known = self._by_job.get((namespace, job))
            if known is not None:
                if kind is not None and name in known and known[name].get("kind") != kind:
                    return
                known.pop(name, None)
                if not known:
                    del self._by_job[(namespace, job)]

    def of(self, namespace: str, job: str) -> dict[str, dict]:
        with self._lock:
            return dict(self._by_job.get((namespace, job)) or {})


class PodCache:
    """The worker pods of every attempt, summarized (`status.pod_summary`): what the start-up
    situations and the scraper need, from one pod watch (no per-job LIST)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._by_attempt: dict[tuple[str, str, str], dict[str, dict]] = {}

    def put(self, namespace: str, job: str, attempt: str, pod: str, summary: dict) -> None:
        with self._lock:
            self._by_attempt.setdefault((namespace, job, str(attempt)), {})[pod] = summary

    def drop(self, namespace: str, job: str, attempt: str, pod: str) -> None:
        with self._lock:
            known = self._by_attempt.get((namespace, job, str(attempt)))
            if known is not None:
                known.pop(pod, None)
                if not known:
                    del self._by_attempt[(namespace, job, str(attempt))]

    def of(self, namespace: str, job: str, attempt: int | str) -> list[dict]:
        with self._lock:
            return list((self._by_attempt.get((namespace, job, str(attempt))) or {}).values())

    def jobs_on(self, node: str) -> set[tuple[str, str]]:
        """The jobs with a pod placed on `node` (a node's health changed: only then, so a scan)."""
        with self._lock:
            return {
                (ns, job)
                for (ns, job, _), pods in self._by_attempt.items()
                if any(p.get("node") == node for p in pods.values())
            }


class NodeHealth:
    """The watched node conditions that are False, per node (the node watch: watch.py), for the
    snapshots of the jobs whose pods run there (sicknodes.py). Only sick nodes are kept."""

    def __init__(self):
        self._lock = threading.Lock()
        self._sick: dict[str, tuple[SickNode, ...]] = {}

    def put(self, node: str, sick: tuple[SickNode, ...]) -> bool:
        """Record `node`'s sick conditions (none: healthy); True when they changed."""
        with self._lock:
            old = self._sick.get(node, ())
            if sick:
                self._sick[node] = sick
            else:
                self._sick.pop(node, None)
            return old != sick

    def of(self, nodes) -> dict[str, tuple[SickNode, ...]]:
        """The sick ones among `nodes`."""
        with self._lock:
            if not self._sick:
                return {}
            return {n: self._sick[n] for n in nodes if n in self._sick}


class ProgressFacts:
    """The monitor's latest scrape of each job's current attempt: a fact for decide's health
    rules (the monitor itself restarts nothing)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._by_job: dict[tuple[str, str], tuple[int, Progress]] = {}

    def put(self, namespace: str, job: str, attempt: int, progress: Progress) -> None:
        with self._lock:
            self._by_job[(namespace, job)] = (attempt, progress)

    def of(self, namespace: str, job: str, attempt: int) -> Progress | None:
        with self._lock:
            known = self._by_job.get((namespace, job))
        return known[1] if known is not None and known[0] == attempt else None

    def forget(self, namespace: str, job: str) -> None:
        with self._lock:
            self._by_job.pop((namespace, job), None)


class SpecCache:
    """Each job's spec, validated and resolved once per generation and backend (a spec never changes
    without a new generation; a job's backend is decided once), keyed by uid: a deleted job's entry
    goes in O(1). The admission policy is the process's (its environment, read once when the
    operator starts), and so are the backends it enables."""

    LIMIT = 20000

    def __init__(
        self,
        default_etcd_endpoint: str | None,
        policy: Policy | None = None,
        enabled: tuple[str, ...] | None = None,
    ):
        self._etcd = default_etcd_endpoint
        self._policy = policy if policy is not None else Policy.from_env()
        self._enabled = enabled
        self._lock = threading.Lock()
        # uid → ((generation, name, backend), (spec, error))
        self._specs: OrderedDict[str, tuple[tuple, tuple[LLMTrainingJobSpec | None, str | None]]] = OrderedDict()

    def resolve(
        self, uid: str, generation: int | None, name: str, raw: dict, backend: str | None = None
    ) -> tuple[LLMTrainingJobSpec | None, str | None]:
        version = (generation, name, backend)
        with self._lock:
            hit = self._specs.get(uid)
            if hit is not None and hit[0] == version:
                self._specs.move_to_end(uid)
                return hit[1]
        try:
            found: tuple = (validate(raw, name, self._etcd, self._policy, backend, self._enabled), None)
        except InvalidJob as err:
            found = (None, str(err))
        with self._lock:
            self._specs[uid] = (version, found)
            self._specs.move_to_end(uid)
            while len(self._specs) > self.LIMIT:
                self._specs.popitem(last=False)
        return found

    def forget(self, uid: str | None) -> None:
        with self._lock:
            self._specs.pop(uid or "", None)
