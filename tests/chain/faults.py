"""Random faults on the real chain, and the invariants the operator keeps through them.

Used by ``test_random_faults.py`` (a short run in the suite) and ``bench/random_faults.py`` (a long
soak), both through ``run``. Its parts:

The jobs run on one backend per run (``run(..., backend=)``: PyTorchJob or JobSet, each attempt's
"child"); what differs is read from the backend (llmtrain.backends): the child's kind and its state.
An attempt's pods are found by the renderer's job and attempt labels, on either backend.

- ``History``: one WATCH per kind (LLMTrainingJobs, the backend's children) in the namespace, from a
  resourceVersion taken before the first job exists, so every status the operator wrote and every
  child it created is seen, not just what a poll happens to catch.
- ``Faults``: a seeded schedule of what a cluster does to a job: a worker pod failing (kwok's chaos
  stage, the exit code a kubelet reports), a pod deleted, the child deleted by hand, the
  node under a pod deleted (a replacement node registered, so capacity comes back; the pods on the
  deleted one are left to the controller-manager's pod GC, as on a real cluster), the node under a
  pod going NotReady (``Faults.node_not_ready`` says what of a real cluster's response is
  emulated), an attempt's pods all exiting 0 (the training run finished: the training-operator
  marks the PyTorchJob Succeeded, the Job and JobSet controllers the JobSet Completed), and the
  operator SIGKILLed and started again. Faults land on what a finished job leaves too (its
  Succeeded pods, its child).
- ``settled`` / ``unsettled``: the namespace at rest, or why not.
- ``violations``: the invariants, over the whole watched history, as a list of sentences (empty:
  all hold).

``wait`` is how the caller waits for a readiness condition (the tests' ``wait_for``, the bench's).
"""

from __future__ import annotations

import itertools
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from llmtrain.backends import Backend
from llmtrain.backends import get as get_backend
from llmtrain.pod_contract import child_name
from llmtrain.render import ATTEMPT_LABEL, JOB_LABEL
from llmtrain.spec import API_VERSION, GROUP, KIND, PLURAL, VERSION
from llmtrain.status import Reason
from llmtrain_devcluster.chain import (
    COMPLETE_POD_LABEL,
    FAIL_EXIT_CODE_ANNOTATION,
    FAIL_POD_LABEL,
    NOT_READY_NODE_LABEL,
    node_manifest,
)

DEFAULT_BACKEND = "pytorchjob"
CPU = "cpu"
NODE_PREFIX = "kwok-cpu-"
TERMINAL = ("Succeeded", "Failed")
FAULT_KINDS = (
    "pod_failed",
    "pod_deleted",
    "child_deleted",
    "node_deleted",
    "operator_killed",
    "node_not_ready",
    "attempt_succeeded",
)
# how often each kind is drawn; an operator restart costs a few seconds of the window, so it is
# rarer; a success takes its job out of the rest of the run, so it is rarer still
WEIGHTS = (5, 2, 2, 1.5, 1, 1.5, 0.5)
# what the node lifecycle controller puts on a node whose Ready condition is False
NOT_READY_TAINT = "node.kubernetes.io/not-ready"


# --- the jobs ------------------------------------------------------------------------------------


def job_doc(name: str, nodes: int, max_restarts: int, backend: str = DEFAULT_BACKEND) -> dict:
    """A CPU job (one pod per simulated cpu node) on ``backend`` that restarts after the operator's
    1 s floor."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {
            "model": {"preset": "tiny"},
            "data": {"uri": "synthetic", "seqLen": 128},
            "cluster": {"instanceType": CPU, "nodes": nodes, "processesPerNode": 2, "backend": backend},
            "fsdp": {"shardingStrategy": "FULL_SHARD", "mixedPrecision": "fp32", "activationCheckpointing": "none"},
            "training": {"maxSteps": 1000000, "globalBatchTokens": 2048, "microBatchSize": 4},
            "resilience": {"maxRestarts": max_restarts, "restartBackoffSeconds": 0, "maxRestartBackoffSeconds": 1},
        },
    }


def draw_jobs(rng: random.Random, count: int) -> list[tuple[str, int, int]]:
    """(name, nodes, maxRestarts): budgets from 0 (the first failure ends it) to 20 (never spent),
    so that some jobs run out and some do not; a third of the jobs are two-node gangs."""
    budgets = [0, 1, 2, 20] * (count // 4 + 1)
    rng.shuffle(budgets)
    return [(f"chaos-{i}", 2 if i % 3 == 2 else 1, budgets[i]) for i in range(count)]


# --- the watched history -------------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """One watch event of an LLMTrainingJob: what its status said."""

    type: str
    at: float  # when the watch delivered it (monotonic)
    rv: int
    phase: str | None
    attempt: int | None
    restarts: int | None
    reason: str | None


def attempt_of(pod_labels: dict) -> str | None:
    """The child a pod belongs to, by the renderer's job and attempt labels (any backend)."""
    job, attempt = pod_labels.get(JOB_LABEL), pod_labels.get(ATTEMPT_LABEL)
    return child_name(job, int(attempt)) if job and attempt and attempt.isdigit() else None


class History:
    """Watches the jobs and the backend's children in ``ns`` from ``since`` (a LIST's
    resourceVersion) until ``stop()``; a stream the API server ends is resumed from the last
    resourceVersion seen. A 410 (history compacted) is recorded as an error: the history would have
    a hole, so the run cannot pass."""

    def __init__(self, api: client.ApiClient, ns: str, since: str, backend: Backend | None = None):
        self.custom = client.CustomObjectsApi(api)
        self.ns = ns
        self.backend = backend or get_backend(DEFAULT_BACKEND)
        kind = self.backend.child
        self.jobs: dict[str, list[Seen]] = {}
        self.child_added: Counter[str] = Counter()
        self.child_failed: dict[str, float] = {}  # "name uid" -> when the watch first saw it Failed (monotonic)
        self.child_succeeded: dict[str, float] = {}  # name -> when the watch first saw it Succeeded
        self.child_events: list[tuple[float, str]] = []  # (monotonic time, "ADDED name" / "DELETED name")
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watches: list[watch.Watch] = []
        self._threads = [
            threading.Thread(target=self._run, args=(plural, group, version, since), daemon=True)
            for group, version, plural in ((GROUP, VERSION, PLURAL), (kind.group, kind.version, kind.plural))
        ]
        for t in self._threads:
            t.start()

    def _run(self, plural: str, group: str, version: str, rv: str) -> None:
        while not self._stop.is_set():
            w = watch.Watch()
            self._watches.append(w)
            try:
                for ev in w.stream(
                    self.custom.list_namespaced_custom_object,
                    group,
                    version,
                    self.ns,
                    plural,
                    resource_version=rv,
                    timeout_seconds=300,
                ):
                    obj = ev["object"]
                    if ev["type"] == "ERROR":
                        self.errors.append(f"{plural} watch: {obj}")
                        return
                    rv = obj["metadata"]["resourceVersion"]
                    self._record(plural, ev["type"], obj)
            except ApiException as err:
                if self._stop.is_set():
                    return
                self.errors.append(f"{plural} watch from resourceVersion {rv}: {err.status} {err.reason}")
                return
            except Exception as err:  # noqa: BLE001 - the connection closed under us (stop(), or the server)
                if self._stop.is_set():
                    return
                time.sleep(0.2)
                if not isinstance(err, OSError | ValueError):
                    self.errors.append(f"{plural} watch: {err!r}")
                    return

    def _record(self, plural: str, type_: str, obj: dict) -> None:
        name = obj["metadata"]["name"]
        with self._lock:
            if plural == self.backend.child.plural:
                kind = self.backend.child.kind
                if type_ == "ADDED":
                    self.child_added[name] += 1
                if type_ in ("ADDED", "DELETED"):
                    self.child_events.append((time.monotonic(), f"  {kind} {name} {type_}"))
                state = self.backend.state(obj).state
                if state == "Failed":
                    self.child_failed.setdefault(f"{name} {obj['metadata']['uid'][:8]}", time.monotonic())
                if state == "Succeeded":
                    self.child_succeeded.setdefault(name, time.monotonic())
                return
            st = obj.get("status") or {}
            self.jobs.setdefault(name, []).append(
                Seen(
                    type_,
                    time.monotonic(),
                    int(obj["metadata"]["resourceVersion"]),
                    st.get("phase"),
                    st.get("attempt"),
                    st.get("restarts"),
                    st.get("reason"),
                )
            )

    def snapshot(self) -> tuple[dict[str, list[Seen]], Counter[str]]:
        with self._lock:
            return {k: list(v) for k, v in self.jobs.items()}, Counter(self.child_added)

    def succeeded(self) -> frozenset[str]:
        """The children the watch saw Succeeded."""
        with self._lock:
            return frozenset(self.child_succeeded)

    def child_timeline(self) -> list[tuple[float, str]]:
        """When each child was added, seen Failed or Succeeded, and deleted."""
        kind = self.backend.child.kind
        with self._lock:
            failed = [(t, f"  {kind} {name} Failed") for name, t in self.child_failed.items()]
            done = [(t, f"  {kind} {name} Succeeded") for name, t in self.child_succeeded.items()]
            return self.child_events + failed + done

    def caught_up(self, rvs: dict[str, int]) -> bool:
        """Every job's watched history reaches at least resourceVersion ``rvs[name]``."""
        with self._lock:
            return all(self.jobs.get(n) and self.jobs[n][-1].rv >= rv for n, rv in rvs.items())

    def stop(self) -> None:
        self._stop.set()
        for w in self._watches:
            w.stop()
        for t in self._threads:
            t.join(10)


# --- faults --------------------------------------------------------------------------------------


@dataclass
class Faults:
    """Draws and applies faults; counts what it did (``done``), which children it deleted by
    hand (each lets its attempt's child be created once more) and which of those it deleted
    after their job had already ended (``after_end``: those must stay deleted). What a fault sets
    in motion for later (a NotReady node's pods evicted, the node back) is in ``later``, run by
    ``pause`` at its time."""

    api: client.ApiClient
    ns: str
    rng: random.Random
    kill_operator: Callable[[float], bool]  # SIGKILL, start it again after that many s (False: still starting)
    node_index: int  # the next cpu node's number
    t0: float = field(default_factory=time.monotonic)  # the timeline's zero
    done: Counter[str] = field(default_factory=Counter)
    hand_deleted: Counter[str] = field(default_factory=Counter)
    after_end: Counter[str] = field(default_factory=Counter)
    log: list[tuple[float, str]] = field(default_factory=list)  # (monotonic time, what)
    later: list[tuple[float, str, Callable[[], str | None]]] = field(default_factory=list)  # (due, kind, act)
    backend: Backend = field(default_factory=lambda: get_backend(DEFAULT_BACKEND))

    def __post_init__(self):
        self._lock = threading.Lock()
        self.pick, self.exit_code, self.outage = 0.0, 1, 0.0
        self.evict_after, self.back_after, self.replace = 0.0, 0.0, False
        self.down: set[str] = set()  # nodes NotReady now (by node_not_ready)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)

    def _pods(self, *phases: str) -> list:
        return [
            p
            for p in self.core.list_namespaced_pod(self.ns).items
            if p.metadata.deletion_timestamp is None and p.status.phase in phases
        ]

    def _live_pods(self) -> list:
        return self._pods("Running")

    def note(self, what: str) -> None:
        with self._lock:
            self.log.append((time.monotonic(), what))

    def one(self) -> float:
        """One fault; returns the pause before the next. Every step draws the same numbers (kind,
        which of the candidates, exit code, outage, pause, a NotReady node's eviction and return),
        so a seed gives the same kinds at the same moments; which pod or node a pick lands on
        depends on what exists then."""
        kind = self.rng.choices(FAULT_KINDS, WEIGHTS)[0]
        self.pick, self.exit_code = self.rng.random(), self.rng.choice((1, 137, 139))
        self.outage, gap = self.rng.uniform(0, 3), self.rng.uniform(0.3, 2.5)
        self.evict_after, self.back_after = self.rng.uniform(0.5, 4), self.rng.uniform(0.5, 8)
        self.replace = self.rng.random() < 0.3
        what = getattr(self, kind)()
        if what:
            self.done[kind] += 1
            self.note(f"{kind} {what}")
        return gap

    def pause(self, seconds: float) -> None:
        """The drawn pause between two faults, running what falls due in it."""
        end = time.monotonic() + seconds
        while True:
            now = time.monotonic()
            for due, kind, act in sorted((x for x in self.later if x[0] <= now), key=lambda x: x[0]):
                self.later.remove((due, kind, act))
                what = act()
                if what:
                    self.note(f"  {kind} {what}")
            if now >= end:
                return
            time.sleep(max(0.0, min([end] + [d for d, _, _ in self.later]) - now))

    def finish(self) -> None:
        """The window is over: what the faults set in motion happens now, in its order (a NotReady
        node's pods evicted, the node back), so the window keeps its length."""
        for _, kind, act in sorted(self.later, key=lambda x: x[0]):
            what = act()
            if what:
                self.note(f"  {kind} {what}")
        self.later.clear()

    def _choose(self, items: list):
        return items[int(self.pick * len(items))]

    def pod_failed(self) -> str | None:
        pods = self._live_pods()
        if not pods:
            return None
        pod = self._choose(sorted(pods, key=lambda p: p.metadata.name))
        code = self.exit_code
        self.core.patch_namespaced_pod(
            pod.metadata.name,
            self.ns,
            {"metadata": {"labels": {FAIL_POD_LABEL: "true"}, "annotations": {FAIL_EXIT_CODE_ANNOTATION: str(code)}}},
        )
        return f"{pod.metadata.name} exit {code}"

    def pod_deleted(self) -> str | None:
        """A running pod, or one a finished attempt left (Succeeded), deleted by hand."""
        pods = self._pods("Running", "Succeeded")
        if not pods:
            return None
        pod = self._choose(sorted(pods, key=lambda p: p.metadata.name))
        try:
            self.core.delete_namespaced_pod(pod.metadata.name, self.ns)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return pod.metadata.name + (" (Succeeded)" if pod.status.phase == "Succeeded" else "")

    def _job_phase(self, job: str | None) -> str | None:
        if not job:
            return None
        try:
            obj = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, job)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return (obj.get("status") or {}).get("phase")

    def child_deleted(self) -> str | None:
        """An attempt's child (a PyTorchJob, a JobSet) deleted by hand, live or left by an end."""
        kind = self.backend.child
        items = self.custom.list_namespaced_custom_object(kind.group, kind.version, self.ns, kind.plural)["items"]
        live = sorted(
            (p["metadata"]["name"], (p["metadata"].get("labels") or {}).get(JOB_LABEL))
            for p in items
            if not p["metadata"].get("deletionTimestamp")
        )
        if not live:
            return None
        name, job = self._choose(live)
        phase = self._job_phase(job)  # read before the delete: a terminal phase is so at the delete too
        try:
            # as kubectl deletes it (and the operator does): its pods with it. Without a policy the
            # API orphans a batch Job's pods (batch/v1's legacy default; a CRD's default is
            # Background), which is another fault: the pods outlive their child
            self.custom.delete_namespaced_custom_object(
                kind.group, kind.version, self.ns, kind.plural, name, propagation_policy="Background"
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        self.hand_deleted[name] += 1
        if phase in TERMINAL:
            self.after_end[name] += 1
            return f"{name} (its job already {phase})"
        return name

    def _replace_node(self, node: str) -> str | None:
        """Delete ``node`` and register one of the same shape; None if it was gone already."""
        try:
            self.core.delete_node(node)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        replacement = node_manifest(CPU, self.node_index)
        self.node_index += 1
        self.core.create_node(replacement)
        return replacement["metadata"]["name"]

    def node_deleted(self) -> str | None:
        """The node under a running pod goes away (a spot reclaim, a scale-down); a replacement of
        the same shape registers, so the jobs get their capacity back."""
        live = self._live_pods()
        busy = sorted({p.spec.node_name for p in live if p.spec.node_name})
        if not busy:
            return None
        node = self._choose(busy)
        on_it = ", ".join(sorted(p.metadata.name for p in live if p.spec.node_name == node))
        replacement = self._replace_node(node)
        if replacement is None:
            return None
        self.down.discard(node)
        return f"{node} under {on_it} (replaced by {replacement})"

    def _taint_not_ready(self, node: str, on: bool) -> None:
        """Put on (or take off) the node lifecycle controller's not-ready taints, NoSchedule and
        NoExecute; a write conditional on the node's resourceVersion, read again on a conflict."""
        for _ in range(10):
            n = self.core.read_node(node)
            taints = [self.api.sanitize_for_serialization(t) for t in n.spec.taints or [] if t.key != NOT_READY_TAINT]
            if on:
                now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                taints += [
                    {"key": NOT_READY_TAINT, "effect": "NoSchedule"},
                    {"key": NOT_READY_TAINT, "effect": "NoExecute", "timeAdded": now},
                ]
            try:
                self.core.patch_node(
                    node, {"metadata": {"resourceVersion": n.metadata.resource_version}, "spec": {"taints": taints}}
                )
                return
            except ApiException as err:
                if err.status != 409:
                    raise
        raise AssertionError(f"node {node}: taints not written after 10 conflicts")

    def node_not_ready(self) -> str | None:
        """The node under a running pod reports NotReady (kwok's chaos stage node-not-ready: its
        Ready condition False, as a kubelet that lost its container runtime or network reports).

        The dev cluster runs no node lifecycle controller and no taint-eviction controller, so
        what they do on a real cluster is emulated here, compressed in time:
        - at once, the lifecycle controller's taints node.kubernetes.io/not-ready, NoSchedule (no
          new pod lands there) and NoExecute;
        - after ``evict_after`` seconds (standing in for the pods' tolerationSeconds, 300 s by
          default), unless the node is back by then, the taint-eviction controller's eviction of
          every pod on it: a DisruptionTarget condition (reason DeletionByTaintManager), then a
          delete; kwok, as the node's kubelet, finishes it, and the training-operator makes the
          pod again, elsewhere;
        - after ``back_after`` seconds the node is Ready again (the label goes, kwok reports it
          Ready, the taints go) or, one time in three or so, replaced (deleted, a node of the
          same shape registered: a cloud's node auto-repair), so capacity comes back.
        Not emulated: an unreachable node (Ready Unknown, its Lease expired), whose kubelet could
        not finish the deletions (kwok renews every node's Lease)."""
        live = self._live_pods()
        busy = sorted({p.spec.node_name for p in live if p.spec.node_name and p.spec.node_name not in self.down})
        if not busy:
            return None
        node = self._choose(busy)
        on_it = ", ".join(sorted(p.metadata.name for p in live if p.spec.node_name == node))
        try:
            self.core.patch_node(node, {"metadata": {"labels": {NOT_READY_NODE_LABEL: "true"}}})
            self._taint_not_ready(node, True)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        self.down.add(node)
        now, replace = time.monotonic(), self.replace
        if self.evict_after < self.back_after:
            self.later.append((now + self.evict_after, "evicted", lambda: self._evict(node)))
        self.later.append((now + self.back_after, "node_back", lambda: self._back(node, replace)))
        then = "replaced" if replace else "Ready again"
        evict = f"evicted after {self.evict_after:.1f} s, " if self.evict_after < self.back_after else ""
        return f"{node} under {on_it} ({evict}{then} after {self.back_after:.1f} s)"

    def _evict(self, node: str) -> str | None:
        if node not in self.down:
            return None
        pods = [
            p
            for p in self.core.list_namespaced_pod(self.ns, field_selector=f"spec.nodeName={node}").items
            if p.metadata.deletion_timestamp is None and p.status.phase in ("Pending", "Running")
        ]
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        gone = []
        for p in pods:
            cond = {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "DeletionByTaintManager",
                "message": "Taint manager: deleting due to NoExecute taint",
                "lastTransitionTime": now,
            }
            try:
                self.core.patch_namespaced_pod_status(p.metadata.name, self.ns, {"status": {"conditions": [cond]}})
                self.core.delete_namespaced_pod(p.metadata.name, self.ns)
            except ApiException as err:
                if err.status == 404:
                    continue
                raise
            gone.append(p.metadata.name)
        return f"{', '.join(gone)} from NotReady {node}" if gone else None

    def _back(self, node: str, replace: bool) -> str | None:
        if node not in self.down:
            return None  # deleted meanwhile (node_deleted registered its replacement)
        self.down.discard(node)
        if replace:
            replacement = self._replace_node(node)
            return f"{node} replaced by {replacement}" if replacement else None
        try:
            self.core.patch_node(node, {"metadata": {"labels": {NOT_READY_NODE_LABEL: None}}})
            self._taint_not_ready(node, False)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return f"{node} Ready again"

    def attempt_succeeded(self) -> str | None:
        """The training run of a running attempt finishes: every running pod of its child exits 0
        (llmtrain's kwok stage pod-container-running-completed), so the child's controller marks it
        Succeeded (a JobSet: its Job complete, then the JobSet) and the operator the job."""
        live = self._live_pods()
        attempts = sorted({child for p in live if (child := attempt_of(p.metadata.labels or {}))})
        if not attempts:
            return None
        child = self._choose(attempts)
        pods = sorted(p.metadata.name for p in live if attempt_of(p.metadata.labels or {}) == child)
        for pod in pods:
            try:
                self.core.patch_namespaced_pod(pod, self.ns, {"metadata": {"labels": {COMPLETE_POD_LABEL: "true"}}})
            except ApiException as err:
                if err.status != 404:
                    raise
        return f"{child}: {', '.join(pods)} exit 0"

    def operator_killed(self) -> str | None:
        return f"SIGKILL (started again after {self.outage:.1f} s)" if self.kill_operator(self.outage) else None


def run_faults(faults: Faults, seconds: float) -> None:
    """Faults at random moments for ``seconds``, then what they set in motion, at once."""
    while time.monotonic() - faults.t0 < seconds:
        faults.pause(faults.one())
    faults.finish()


# --- convergence and invariants ------------------------------------------------------------------


def settled(
    api: client.ApiClient,
    ns: str,
    jobs: dict[str, int],
    why: list[str] | None = None,
    backend: str = DEFAULT_BACKEND,
) -> dict | None:
    """The namespace at rest (``unsettled`` over what the API says now): {name: status}, or None
    (and, with ``why``, the reason appended to it). ``jobs``: name -> nodes."""
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    kind = get_backend(backend).child
    nodes = {
        n.metadata.name: any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
        for n in core.list_node(label_selector="type=kwok").items
    }
    pods = [api.sanitize_for_serialization(p) for p in core.list_namespaced_pod(ns).items]
    children = custom.list_namespaced_custom_object(kind.group, kind.version, ns, kind.plural)["items"]
    statuses = {
        name: custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name).get("status") or {} for name in jobs
    }
    reason = unsettled(jobs, statuses, children, pods, nodes, backend)
    if reason is not None:
        if why is not None:
            why.append(reason)
        return None
    return statuses


def unsettled(
    jobs: dict[str, int],
    statuses: dict[str, dict],
    children: list[dict],
    pods: list[dict],
    nodes: dict[str, bool],
    backend: str = DEFAULT_BACKEND,
) -> str | None:
    """Why the namespace is not at rest, or None when it is: every job Running on its latest
    attempt with all its pods Running on Ready nodes, or Succeeded, or Failed with a reason; each
    job's only child not being deleted is its current attempt's (a finished job's may be gone);
    no pod left on a deleted node (the pod GC's work) and none terminating. ``jobs``: name ->
    nodes; ``pods`` and ``children`` (``backend``'s) as the API returns them; ``nodes``: name ->
    Ready."""
    b = get_backend(backend)
    kind = b.child.kind
    for p in pods:
        meta, node = p["metadata"], (p.get("spec") or {}).get("nodeName")
        if meta.get("deletionTimestamp"):
            return f"pod {meta['name']} terminating"
        if node and node not in nodes:
            return f"pod {meta['name']} on deleted node {node}"
    for name, count in jobs.items():
        st = statuses.get(name) or {}
        phase, current = st.get("phase"), child_name(name, st.get("attempt") or 1)
        live = {
            c["metadata"]["name"]
            for c in children
            if (c["metadata"].get("labels") or {}).get(JOB_LABEL) == name and not c["metadata"].get("deletionTimestamp")
        }
        if not live <= {current}:
            return f"{name}: {kind}s {sorted(live - {current})} besides attempt {st.get('attempt')}'s"
        if phase in TERMINAL:
            if not st.get("reason"):
                return f"{name}: {phase} without a reason"
            continue
        if phase != "Running" or live != {current} or st.get("child") != current:
            return f"{name}: {phase} with {kind} {st.get('child')} (live: {sorted(live)})"
        child = next(c for c in children if c["metadata"]["name"] == current)
        state = b.state(child).state
        if state != "Running":
            return f"{name}: {kind} {current} is {state}"
        mine = [p for p in pods if attempt_of(p["metadata"].get("labels") or {}) == current]
        if len(mine) != count or any((p.get("status") or {}).get("phase") != "Running" for p in mine):
            return f"{name}: {len(mine)} pods of {current}, not {count} Running"
        off = sorted(p["spec"]["nodeName"] for p in mine if not nodes.get(p["spec"].get("nodeName") or ""))
        if off:
            return f"{name}: pods on NotReady {', '.join(off)}"
    return None


def timeline(
    t0: float, faults: list[tuple[float, str]], history: dict[str, list[Seen]], children: list[tuple[float, str]]
) -> str:
    """What happened, in order: the faults, the operator's restarts, each child's creation,
    failure and deletion, and each job's changes of (phase, attempt, restarts), seconds from ``t0``."""
    lines = list(faults) + list(children)
    for job, seen in history.items():
        last = None
        for s in seen:
            key = (s.phase, s.attempt, s.restarts)
            if s.phase is not None and key != last:
                lines.append((s.at, f"    {job}: {s.phase} attempt {s.attempt} restarts {s.restarts} ({s.reason})"))
                last = key
    return "\n".join(f"{t - t0:7.1f}s {what}" for t, what in sorted(lines))


def violations(
    history: dict[str, list[Seen]],
    child_added: Counter[str],
    hand_deleted: Counter[str],
    final: dict[str, dict],
    budgets: dict[str, int],
    succeeded: frozenset[str] = frozenset(),
    after_end: Counter[str] | None = None,
    kind: str = "PyTorchJob",
) -> list[str]:
    """Every broken invariant, in words (empty: all hold). ``child_added``: how many times each
    child (of kind ``kind``) was created; ``succeeded``: the children seen Succeeded;
    ``after_end``: of the children deleted by hand, how many times after their job had ended (no
    new one may follow those)."""
    bad: list[str] = []
    after_end = after_end or Counter()
    for name, seen in sorted(history.items()):
        states = [s for s in seen if s.type != "DELETED" and s.phase is not None]
        if [s.rv for s in seen] != sorted(s.rv for s in seen):
            bad.append(f"{name}: watch events out of resourceVersion order")
        for prev, cur in itertools.pairwise(states):
            for what in ("attempt", "restarts"):
                a, b = getattr(prev, what) or 0, getattr(cur, what) or 0
                if b < a:
                    bad.append(f"{name}: {what} went back from {a} to {b} (rv {prev.rv} -> {cur.rv})")
                elif b > a + 1:
                    bad.append(f"{name}: {what} jumped from {a} to {b} (rv {prev.rv} -> {cur.rv})")
            if prev.phase in TERMINAL and cur.phase != prev.phase:
                bad.append(f"{name}: left terminal phase {prev.phase} for {cur.phase} (rv {cur.rv})")
            elif prev.phase in TERMINAL and (prev.attempt, prev.restarts) != (cur.attempt, cur.restarts):
                bad.append(
                    f"{name}: attempt {prev.attempt} restarts {prev.restarts} became attempt {cur.attempt} "
                    f"restarts {cur.restarts} after it was {prev.phase} (rv {cur.rv})"
                )
            elif cur.phase == "Succeeded" and (prev.attempt, prev.restarts) != (cur.attempt, cur.restarts):
                bad.append(
                    f"{name}: success changed attempt {prev.attempt} restarts {prev.restarts} to attempt "
                    f"{cur.attempt} restarts {cur.restarts} (rv {cur.rv})"
                )
        for s in states:
            if (s.restarts or 0) > budgets[name]:
                bad.append(f"{name}: restarts {s.restarts} over maxRestarts {budgets[name]} (rv {s.rv})")
            if (s.restarts or 0) > (s.attempt or 1) - 1:
                bad.append(f"{name}: restarts {s.restarts} with only attempt {s.attempt} (rv {s.rv})")
    for child, n in sorted(child_added.items()):
        if n > 1 + hand_deleted[child] - after_end[child]:
            ended = f", {after_end[child]} of them after its job had ended" if after_end[child] else ""
            bad.append(f"{kind} {child} created {n} times (deleted by hand {hand_deleted[child]} times{ended})")
    for name, st in sorted(final.items()):
        attempt = st.get("attempt") or 1
        for k in range(1, attempt + 1):
            if not child_added[child_name(name, k)]:
                bad.append(f"{name}: attempt {k} never had a {kind}")
        prefix = child_name(name, 0)[:-1]
        for child in child_added:
            suffix = child[len(prefix) :]
            if child.startswith(prefix) and suffix.isdigit() and not 1 <= int(suffix) <= attempt:
                bad.append(f"{name}: {kind} {child} for an attempt it never reached (status.attempt {attempt})")
        if st.get("phase") == "Succeeded":
            child = child_name(name, attempt)
            if st.get("reason") != Reason.SUCCEEDED.value or child not in succeeded:
                bad.append(
                    f"{name}: Succeeded with reason {st.get('reason')!r} on attempt {attempt}, whose {kind} "
                    f"{child} was {'' if child in succeeded else 'never '}seen Succeeded"
                )
        if st.get("phase") == "Failed":
            if st.get("reason") != Reason.RESTART_BUDGET_EXHAUSTED.value or st.get("restarts") != budgets[name]:
                bad.append(
                    f"{name}: Failed with reason {st.get('reason')!r} and restarts {st.get('restarts')} "
                    f"(maxRestarts {budgets[name]}): only a spent budget may fail a job here"
                )
    return bad


# --- one run -------------------------------------------------------------------------------------


class Operator(Protocol):
    def start(self) -> Any: ...
    def stop(self, sig: int = ...) -> None: ...


class Restarter:
    """SIGKILL the operator, then start it again after the drawn outage in the background, so the
    cluster (and the next faults) go on while it is down."""

    def __init__(self, op: Operator):
        self.op = op
        self.thread: threading.Thread | None = None
        self.note: Callable[[str], None] = lambda what: None
        self.error: BaseException | None = None

    def __call__(self, outage: float) -> bool:
        if self.thread is not None and self.thread.is_alive():
            return False  # still starting from the last kill
        self.wait()
        self.op.stop(signal.SIGKILL)

        def start():
            try:
                time.sleep(outage)  # the outage itself, not a readiness wait
                self.op.start()
                self.note("operator up again")
            except BaseException as err:  # noqa: BLE001 - re-raised by wait() in the caller's thread
                self.error = err

        self.thread = threading.Thread(target=start, daemon=True)
        self.thread.start()
        return True

    def wait(self) -> None:
        if self.thread is not None:
            self.thread.join(180)
            self.thread = None
        if self.error is not None:
            raise self.error


@dataclass
class Result:
    seed: int
    jobs: list[tuple[str, int, int]]  # (name, nodes, maxRestarts)
    done: Counter[str]
    final: dict[str, dict]
    history: dict[str, list[Seen]]
    violations: list[str]
    timeline: str
    running_s: float  # create -> every job Running
    faults_s: float  # the fault window, as it ran
    settle_s: float  # last fault -> settled
    backend: str = DEFAULT_BACKEND

    def summary(self) -> dict:
        budgets = {name: budget for name, _, budget in self.jobs}
        return {
            "seed": self.seed,
            "backend": self.backend,
            "faults": dict(self.done),
            "jobs": {
                name: {
                    "phase": st.get("phase"),
                    "reason": st.get("reason"),
                    "attempt": st.get("attempt"),
                    "restarts": st.get("restarts"),
                    "maxRestarts": budgets[name],
                    "watchedStates": len(self.history.get(name, [])),
                }
                for name, st in sorted(self.final.items())
            },
            "violations": self.violations,
            "seconds": {
                "allRunning": round(self.running_s, 1),
                "faults": round(self.faults_s, 1),
                "settledAfterLastFault": round(self.settle_s, 1),
            },
        }


def run(
    api: client.ApiClient,
    ns: str,
    operator: Operator,
    node_names: list[str],
    *,
    seed: int,
    jobs: int,
    seconds: float,
    wait: Callable[..., Any],
    settle_timeout: float = 240,
    say: Callable[[str], None] = print,
    backend: str = DEFAULT_BACKEND,
) -> Result:
    """Create ``jobs`` jobs on ``backend`` in ``ns`` (served by ``operator``, on the cpu nodes
    ``node_names``), wait until all run, apply faults for ``seconds``, wait until the namespace
    settles, check."""
    rng = random.Random(seed)
    drawn = draw_jobs(rng, jobs)
    sizes = {name: nodes for name, nodes, _ in drawn}
    custom = client.CustomObjectsApi(api)
    t0 = time.monotonic()
    since = custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["metadata"]["resourceVersion"]
    b = get_backend(backend)
    history = History(api, ns, since, b)
    restarter = Restarter(operator)
    chaos = Faults(api, ns, rng, restarter, 1 + max(int(n.rsplit("-", 1)[1]) for n in node_names), backend=b)
    restarter.note = chaos.note
    why: list[str] = []  # why the namespace was not settled, at each look
    try:
        for name, nodes, budget in drawn:
            custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, job_doc(name, nodes, budget, backend))
        wait(lambda: settled(api, ns, sizes, backend=backend), 120, f"{jobs} jobs Running before the faults")
        running = time.monotonic() - t0
        chaos.t0 = time.monotonic()
        run_faults(chaos, seconds)
        restarter.wait()
        last_fault = time.monotonic()
        final = wait(
            lambda: settled(api, ns, sizes, why, backend),
            settle_timeout,
            f"every job Running on its latest attempt or Failed (LLMTRAIN_FAULT_SEED={seed})",
        )
        settle = time.monotonic() - last_fault
        # the watches have delivered everything up to the settled state
        rvs = {
            n: int(custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, n)["metadata"]["resourceVersion"])
            for n in final
        }
        wait(lambda: history.caught_up(rvs), 30, "the watch caught up with the settled state")
    finally:
        history.stop()
        seen, added = history.snapshot()
        story = timeline(chaos.t0, chaos.log, seen, history.child_timeline())
        say(story)  # the whole story, also when the namespace never settled
        if why:
            say(f"last look before settled: {why[-1]}")
    budgets = {name: budget for name, _, budget in drawn}
    bad = history.errors + violations(
        seen, added, chaos.hand_deleted, final, budgets, history.succeeded(), chaos.after_end, b.child.kind
    )
    bad += [
        f"{name}: status.child {st.get('child')!r} is not attempt {st.get('attempt')}'s"
        for name, st in sorted(final.items())
        if st.get("child") != child_name(name, st.get("attempt") or 1)
    ]
    return Result(seed, drawn, chaos.done, final, seen, bad, story, running, last_fault - chaos.t0, settle, backend)
