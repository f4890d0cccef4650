"""Bad-node avoidance from what the pod watch saw: which node each failed worker pod ran on, and
which nodes the next attempt keeps away from. What a failed pod says (its reason, whether it
failed by itself, whether it only lost its peer) is podfailure.py's; here are the node verdicts
made from it and the watch that catches it.

Why from the pods and not from the child: Kubeflow's training-operator deletes every pod of a failed
PyTorchJob at once (cleanPodPolicy), a failed batch Job terminates the rest of a JobSet's pods, and
their Failed conditions only say "replica worker failed" or "BackoffLimitExceeded".
The pod's own terminated state (exit code, OOMKilled, the termination message with the
NCCL/EFA/XID text) lives for milliseconds. So a pod watch handler (`pod_event`, on the event loop)
copies each failure into the operator's `PodFailures` the moment it is seen, and the restart that
the child's Failed condition calls for (decide.attempt_failed, with forensics.py) folds them into
its own conditional status write:

  status.badNodes    the last MAX_BAD_NODES failures: [{node, reason, attempt, pod, exitCode, time}]
                     (`record`)
  status.avoidNodes  what the next attempt's pods get as required node anti-affinity
                     (kubernetes.io/hostname NotIn [...], render.py; `plan_avoidance`)

Avoidance never makes a job unschedulable: a node is only avoided while enough other Ready,
schedulable nodes of the instance type remain for the job (`plan_avoidance`); otherwise the message
says which nodes were kept in play and why. Bystanders are not blamed: a pod that was already being
deleted when its container ended (the backend's controller killing the rest of the gang) is skipped
(podfailure.raw_failure).

Optionally (operator flag --suspect-taint-fraction, chart value suspectNodeTaint) a bad node also
gets the taint `llmtrain.dev/suspect=<reason>:NoSchedule` so other jobs avoid it too, never on more
than that fraction of the nodes of its instance type (`taint_budget`); those API calls, and the
Ready-node count, are taints.py.

`record` and `plan_avoidance` are pure and live in badnodes.py (decide's restarts call them); here
is what the pod watch saw and the watch itself.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor

from ...render import ATTEMPT_LABEL, JOB_LABEL
from ..policy.badnodes import MESSAGE_CHARS
from ..policy.podfailure import classified, raw_failure
from .taints import (
    expire_taints_forever,
)

log = logging.getLogger("llmtrain.operator.nodes")

# --- what the pod watch saw (event loop writes, handler threads read) ----------------------------

_MAX_TRACKED = 10000  # attempts remembered; oldest dropped first (dicts keep insertion order)


def _owners(owner: str | Collection[str] | None) -> Collection[str] | None:
    """One controller uid, or the uids of an attempt's pod controllers (owners.py), or None: any."""
    return {owner} if isinstance(owner, str) else owner


MAX_PODS_PER_ATTEMPT = 1024  # failures kept per attempt (a job's nodes are bounded far lower)


class PodFailures:
    """One operator's record of what its pod watch saw: each attempt's pod failures, and the nodes
    its pods were bound to. The Operator holds one (operator.py); nothing of it lives in the module."""

    def __init__(self, kube=None) -> None:
        self._kube = kube  # for the LIST when the watch saw nothing (controller.adapters.kube by default)
        self._lock = threading.Lock()
        self._failures: dict[tuple[str, str, str], dict[str, dict]] = {}  # (ns, job, attempt) -> pod -> failure
        # Attempts of which the pod watch has seen at least one pod: only for those can a failure still
        # be on its way through the watch. An attempt that never had a pod here (no pods were created,
        # or the operator started after they were gone) is decided from a LIST alone, without waiting.
        self._seen_pods: dict[tuple[str, str, str], dict[str, str]] = {}  # → {node: owner uid}

    def remember(self, namespace: str, job: str, attempt: str, failure: dict) -> bool:
        """Store one pod's failure; False if that pod's failure was already known."""
        with self._lock:
            pods = self._failures.setdefault((namespace, job, str(attempt)), {})
            if failure["pod"] in pods or len(pods) >= MAX_PODS_PER_ATTEMPT:
                return False
            pods[failure["pod"]] = failure
            while len(self._failures) > _MAX_TRACKED:
                self._failures.pop(next(iter(self._failures)))
            return True

    def saw_pod(
        self, namespace: str, job: str, attempt: str, node: str | None = None, owner: str | None = None
    ) -> None:
        """A pod of the attempt (controlled by `owner`: a PyTorchJob, a JobSet's Job) was seen, on
        `node` if bound."""
        with self._lock:
            ran = self._seen_pods.setdefault((namespace, job, str(attempt)), {})
            if node and owner and len(ran) < MAX_PODS_PER_ATTEMPT:
                ran[node] = owner
            while len(self._seen_pods) > _MAX_TRACKED:
                self._seen_pods.pop(next(iter(self._seen_pods)))

    def attempt_nodes(self, namespace: str, job: str, attempt: int | str, owner: str | Collection[str]) -> set[str]:
        """The nodes where the pods the attempt's `owner` (uid, or uids) controls ran, as the pod
        watch saw them (the scheduler's binding, not anything the pods said)."""
        owners = _owners(owner) or ()
        with self._lock:
            ran = self._seen_pods.get((namespace, job, str(attempt))) or {}
            return {node for node, uid in ran.items() if uid in owners}

    def failures(
        self, namespace: str, job: str, attempt: int | str, owner: str | Collection[str] | None = None
    ) -> list[dict]:
        """The attempt's pod failures, classified (on the caller's thread), oldest first; with `owner`
        only those of pods controlled by that uid (or one of those uids)."""
        owners = _owners(owner)
        with self._lock:
            known = list((self._failures.get((namespace, job, str(attempt))) or {}).values())
        out = [classified(f) for f in known if owners is None or f.get("owner") in owners]
        return sorted(out, key=lambda f: (f.get("finishedAt") or "", f["pod"] or ""))

    def forget(self, namespace: str, job: str) -> None:
        with self._lock:
            for key in [k for k in self._failures if k[:2] == (namespace, job)]:
                self._failures.pop(key, None)
            for key in [k for k in self._seen_pods if k[:2] == (namespace, job)]:
                self._seen_pods.pop(key, None)

    def wait_for_failures(
        self,
        namespace: str,
        job: str,
        attempt: int | str,
        timeout: float = 5.0,
        owner: str | Collection[str] | None = None,
    ) -> list[dict]:
        """The attempt's pod failures (of the pods `owner` controls), waiting up to `timeout` for the
        first one: the child's Failed condition and the pod's Failed state arrive on two watches,
        in either order. If the watch saw none (the operator was restarted in between), the pods
        that still exist are read."""
        deadline = time.monotonic() + timeout
        with self._lock:
            pods_seen = (namespace, job, str(attempt)) in self._seen_pods
        if not pods_seen:
            return self.failures(namespace, job, attempt, owner) or self._listed(namespace, job, attempt, owner)
        while True:
            seen = self.failures(namespace, job, attempt, owner)
            if seen:
                return seen
            if time.monotonic() >= deadline:
                return self._listed(namespace, job, attempt, owner)
            time.sleep(0.05)

    def _listed(
        self, namespace: str, job: str, attempt: int | str, owner: str | Collection[str] | None = None
    ) -> list[dict]:
        from kubernetes.client.exceptions import ApiException

        if self._kube is None:
            from . import kube as default

            self._kube = default
        kube = self._kube
        try:
            pods = kube._request(
                "GET",
                "/api/v1/namespaces/{namespace}/pods",
                {"namespace": namespace},
                query={"labelSelector": f"{JOB_LABEL}={job},{ATTEMPT_LABEL}={attempt}"},
            )["items"]
        except ApiException as err:
            log.warning("cannot list the pods of %s/%s attempt %s: %s", namespace, job, attempt, err.reason)
            return []
        found = [f for f in map(raw_failure, pods) if f is not None]
        for f in found:
            self.remember(namespace, job, str(attempt), f)
        return self.failures(namespace, job, attempt, owner)


def pod_failed(body, **_) -> bool:
    """kopf's filter, on the event loop for every worker pod event: no pattern runs here."""
    return raw_failure(body) is not None


def register(kopf, config, seen: PodFailures, registry=None) -> None:
    """Register the pod watch handler, which records failures into `seen`, and the taint expiry
    (watch.register calls this). kopf runs only on the Lease holder (__main__), so only the leader
    sweeps."""
    kw = {"registry": registry} if registry is not None else {}
    # Classification and the event's text, off kopf's event loop (the loop also serves /healthz and
    # every other namespace's watch events).
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmtrain-forensics")
    expiry_stop = threading.Event()

    @kopf.on.startup(**kw)
    def start_taint_expiry(**_):
        if config.suspect_taint_fraction > 0:
            interval = max(1.0, min(300.0, config.suspect_taint_ttl / 10))
            threading.Thread(
                target=expire_taints_forever, args=(interval, expiry_stop), daemon=True, name="llmtrain-taint-expiry"
            ).start()

    @kopf.on.cleanup(**kw)
    def stop_taint_expiry(**_):
        expiry_stop.set()

    @kopf.on.event(
        "", "v1", "pods", labels={JOB_LABEL: kopf.PRESENT, ATTEMPT_LABEL: kopf.PRESENT}, when=pod_failed, **kw
    )
    async def pod_event(event, body, namespace, labels, **_):
        # async and cheap (a dict insert): failures are caught at watch speed, before the
        # backend's teardown deletes the pod; only pods a backend's pod controller controls count
        # (raw_failure), and whether that controller is the attempt's is checked when it is read.
        if event["type"] == "DELETED":
            return
        raw = raw_failure(dict(body))
        if raw is None or not seen.remember(namespace, labels[JOB_LABEL], labels[ATTEMPT_LABEL], raw):
            return
        failure = await asyncio.get_running_loop().run_in_executor(pool, classified, raw)
        log.info(
            "%s/%s attempt %s: pod %s failed on node %s: %s",
            namespace,
            labels[JOB_LABEL],
            labels[ATTEMPT_LABEL],
            failure["pod"],
            failure["node"],
            failure["reason"],
        )
        msg = f"pod {failure['pod']} failed on node {failure['node']}: {failure['reason']}"
        if failure.get("message") and failure["reason"] != "preflight":
            msg += f": {failure['message'][:MESSAGE_CHARS]}"
        kopf.warn(dict(body), reason="PodFailedOnNode", message=msg)
