"""The LLMTrainingJob reconciler: LLMTrainingJob → PyTorchJob, status, progress, restarts, backoff,
suspend and hang detection.

Level-triggered: kopf only delivers watch events (`on.event`: kopf stores nothing on our objects,
no annotations, no finalizers, no status.kopf). Every event of a job, of one of its PyTorchJobs, or
a timer puts the job's key on a work queue (`workqueue.py`: deduplicated per namespace/name, the
newest object wins, one worker per key at a time, --workers at once, transient errors retried with
capped exponential backoff, timed work requeued after its delay). A worker compares what the job
says (metadata.generation, spec.suspend, status.attempt/phase/nextAttemptTime) with what exists
(the attempt's PyTorchJob, from the PyTorchJob watch) and takes the next step:
  new job        validate → render attempt 1 → create (or adopt) `<job>-a1` → Pending
  spec changed   generation ≠ status.observedGeneration: SpecAccepted condition (only
                 spec.resilience, spec.suspend and the checkpoint cadence may change)
  suspend        spec.suspend true: phase Suspended, then the attempt's PyTorchJob is deleted (its
                 pods get their termination grace period: the trainer checkpoints on SIGTERM);
                 false again: a new attempt that spends no restart and resumes from that checkpoint
  no PyTorchJob  status names attempt N (a new attempt, or a crash between writing attempt N and
                 creating its PyTorchJob): create `<job>-aN` once status.nextAttemptTime has passed
  PyTorchJob     its conditions (Created/Running/Restarting/Succeeded/Failed) → status.phase;
                 Failed (or a hang / start-up timeout from the monitor) within
                 spec.resilience.maxRestarts: attempt N+1 (fresh rendezvous id, resumes from the
                 newest checkpoint) after the restart backoff; beyond it: Failed
  active job     every --progress-interval (requeue-after) the monitor runs on the event loop:
                 Pending: the pods' own reasons and the start-up deadline; Running: rank 0's
                 metrics → status.progress, no step for hangTimeoutMinutes → restart (hang).

Consistency rules (an operator restart, a failover or two triggers at once must never go back):
  * decisions are made on state as fresh as the watch: a watch event is a read at its
    resourceVersion (and the response of our own write is one too); every status transition is
    written with the resourceVersion it was decided from (409 → read again, decide again);
  * status.attempt and status.restarts only go up: only `restart` raises them, by one, from a
    fresh read (`patch_status_fresh`); nothing else writes them except with the value it read;
  * the PyTorchJob of attempt N is created only on a read that says attempt N, and is always
    followed by a conditional status write decided from that read; if that write finds the job
    moved on (a later attempt, Failed, Suspended, deleted), what was created is deleted
    (`_drop_superseded`); a PyTorchJob of an attempt older than the job's is deleted whenever it is
    seen (a crash between the two steps): never two live attempts;
  * one worker per job at a time (the queue), plus `_job_lock` against the monitor's restarts;
    across processes only the Lease holder runs at all (`leader.py`).

An invalid job (or one whose PyTorchJob cannot be rendered or is refused by the API server) is
marked Failed with the message and an event; nothing raises out of the reconciler for a bad spec,
so one bad object never stops the operator serving the others.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import hashlib
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import aiohttp
import kopf
import yaml
from kubernetes.client.exceptions import ApiException

from ..planner import plan_job
from ..render import ATTEMPT_LABEL, JOB_LABEL, pytorchjob_name, render_pytorchjob, rendezvous_id
from ..spec import GROUP, PHASES, PLURAL, VERSION, LLMTrainingJobSpec, model_summary
from ..validation import InvalidJob, validate
from . import forensics, health, kube, nodes, rejections, scrape
from .config import CONFIG
from .metrics import OperatorMetrics
from .status import (PHASE_OF, TERMINAL, failure_message, now, parse_time, pod_summary,
                     pytorchjob_state, set_condition, startup_problem, timestamp)
from .workqueue import WorkQueue, newer

METRICS = OperatorMetrics()
SPEC_HASH = "llmtrain.dev/spec-hash"
MUTABLE_SECTIONS = ("resilience", "checkpoint", "suspend")
ACTIVE = ("Pending", "Restarting", "Running")
log = logging.getLogger("llmtrain.operator")
nodes.register(kopf)  # nodes: the pod watch that catches failures before the pods are deleted


# --- shared in-process state ---------------------------------------------------------------------

class PhaseGauge:
    """Jobs per phase for the llmtrain_operator_jobs gauge. Handlers update it from many threads
    (and the event loop), so the table is only touched under a lock, and counts are kept
    incrementally instead of by iterating the table."""

    def __init__(self, gauge):
        self._gauge, self._lock = gauge, threading.Lock()
        self._phases: dict[tuple[str, str], str] = {}
        self._counts = {p: 0 for p in PHASES}

    def track(self, namespace: str, name: str, phase: str | None) -> None:
        with self._lock:
            old = self._phases.pop((namespace, name), None)
            if old in self._counts:
                self._counts[old] -= 1
            if phase:
                self._phases[(namespace, name)] = phase
                if phase in self._counts:
                    self._counts[phase] += 1
            for p in {old, phase} & set(PHASES):
                self._gauge.labels(p).set(self._counts[p])


PHASE_GAUGE = PhaseGauge(METRICS.jobs)
_track_phase = PHASE_GAUGE.track

_locks: dict[tuple[str, str], threading.Lock] = {}
_locks_guard = threading.Lock()


@contextmanager
def _job_lock(namespace: str, name: str):
    """The reconciler's run of a job and the monitor's restarts of it, one at a time. The
    conditional writes keep them correct without this; the lock keeps them from racing each
    other into conflicts and wasted creates."""
    with _locks_guard:
        lock = _locks.setdefault((namespace, name), threading.Lock())
    with lock:
        yield


def _forget(namespace: str, name: str) -> None:
    with _locks_guard:
        _locks.pop((namespace, name), None)


# --- helpers -------------------------------------------------------------------------------------

def spec_hash(raw_spec: dict) -> str:
    """Hash of the sections that shape the pods (everything but the mutable ones)."""
    fixed = {k: v for k, v in raw_spec.items() if k not in MUTABLE_SECTIONS}
    fixed["checkpoint.uri"] = (raw_spec.get("checkpoint") or {}).get("uri")
    return hashlib.sha256(json.dumps(fixed, sort_keys=True).encode()).hexdigest()[:16]


def _plan_status(spec: LLMTrainingJobSpec) -> dict:
    plan = plan_job(spec)
    return {"memoryPerGpuGiB": round(plan.total_bytes / 1024**3, 2), "fits": plan.fits,
            "flopsPerToken": float(plan.flops_per_token), "numParams": plan.num_params,
            "expectedTokensPerSecond": round(plan.tokens_per_second, 1)}


def _render(spec: LLMTrainingJobSpec, raw_spec: dict, body: dict, attempt: int) -> dict:
    meta = body["metadata"]
    obj = render_pytorchjob(spec, meta["name"], meta["namespace"], attempt, meta["uid"],
                            CONFIG.default_etcd_endpoint,
                            resume_before_step=(body.get("status") or {}).get("resumeBeforeStep"),
                            avoid_nodes=(body.get("status") or {}).get("avoidNodes") or ())  # nodes.py
    obj["metadata"]["annotations"][SPEC_HASH] = spec_hash(raw_spec)
    return obj


def _owned_by(obj: dict, uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])


def _fail(body: dict, status: dict, reason: str, message: str) -> dict:
    """The status update that marks a job Failed (the caller posts the event once it applied)."""
    conds = set_condition(status.get("conditions") or [], "Ready", False, reason, message,
                          body["metadata"].get("generation"))
    return {"phase": "Failed", "reason": reason, "message": message, "conditions": conds,
            "completionTime": timestamp(), "observedGeneration": body["metadata"].get("generation")}


def _api_message(err: ApiException) -> str:
    try:
        return json.loads(err.body).get("message") or str(err.reason)
    except (TypeError, ValueError, AttributeError):
        return f"{err.status} {err.reason}"


CONFLICT_RETRIES = 10


def patch_status_fresh(namespace: str, name: str, decide, on_read=None):
    """Read the job, let `decide(job)` return a status update (None: nothing to do), and apply it
    only if the job is unchanged since the read; on a conflict, read and decide again. So two
    triggers never both act on one attempt, and an unrelated write (a progress scrape) never makes
    a transition get lost. `on_read(job)` sees every read (also the last one when nothing is to be
    done). The written object goes to the work queue as the job's newest state. Returns (job as
    read, update) or None."""
    for _ in range(CONFLICT_RETRIES):
        job = kube.get_job(namespace, name)
        if on_read is not None:
            on_read(job)
        if job is not None:
            QUEUE.observe((namespace, name), job)
        update = decide(job) if job is not None else None
        if update is None:
            return None
        try:
            written = kube.patch_job_status(namespace, name, update, job["metadata"]["resourceVersion"])
            QUEUE.observe((namespace, name), written)
            return job, update
        except ApiException as err:
            if err.status != 409:
                raise
    raise kopf.TemporaryError(f"{namespace}/{name} kept changing; status not updated", delay=1)


# --- what exists: the PyTorchJobs of every job, from their watch ---------------------------------

class AttemptCache:
    """The PyTorchJobs the operator's watch has seen (and those it created itself, from the create's
    response), per job. Read by the queue's worker threads, written on the event loop and by them.
    (Not a kopf index: kopf starts no handler before every index's initial list is processed, and
    at ~25 ms of kopf's per-object work per PyTorchJob that held a restarted operator's
    re-adoption of 1,000 jobs back for tens of seconds.)"""

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
            if old is not None and (old["metadata"].get("resourceVersion") == meta.get("resourceVersion")
                                    or not newer(ptj, old)):
                return False
            known[meta["name"]] = ptj
            return True

    def drop(self, namespace: str, job: str, name: str) -> None:
        with self._lock:
            known = self._by_job.get((namespace, job))
            if known is not None:
                known.pop(name, None)
                if not known:
                    del self._by_job[(namespace, job)]

    def of(self, namespace: str, job: str) -> dict[str, dict]:
        with self._lock:
            return dict(self._by_job.get((namespace, job)) or {})


ATTEMPTS = AttemptCache()


# --- the reconciler ------------------------------------------------------------------------------

def _attempt_of(ptj: dict) -> int | None:
    try:
        return int(ptj["metadata"]["labels"][ATTEMPT_LABEL])
    except (KeyError, ValueError, TypeError):
        return None


def restart_backoff(resilience: dict, restarts: int) -> float:
    """Seconds before attempt N+1 after the `restarts`-th restart spent: restartBackoffSeconds,
    doubling with every restart already spent, at most maxRestartBackoffSeconds, at least the
    operator's floor."""
    first = float(resilience.get("restartBackoffSeconds", 10))
    cap = float(resilience.get("maxRestartBackoffSeconds", 300))
    # never under the operator's floor (--min-restart-backoff-seconds): 0 made a crash loop
    return max(CONFIG.min_restart_backoff, min(cap, first * 2 ** min(max(restarts, 0), 30)))


class Reconcile:
    """One run of the reconciler for one job: steps towards what the job asks for until nothing is
    left to do. Each step is decided on `self.job` (a watch event, the response of our last write,
    or a fresh GET after a conflict) and written conditionally on its resourceVersion."""

    MAX_STEPS = 12

    def __init__(self, namespace: str, name: str, job: dict, first_sight: bool):
        self.namespace, self.name, self.job = namespace, name, job
        self.first_sight = first_sight
        self.created: list[str] = []  # PyTorchJobs this run created
        self.outcome: str | None = None
        self.requeue: float | None = None
        self.waiting = False  # for the watch to show a recorded PyTorchJob
        self.settled_on: dict | None = None  # the object on which nothing was left to do

    @property
    def key(self):
        return (self.namespace, self.name)

    def run(self) -> float | None:
        try:
            for _ in range(self.MAX_STEPS):
                if self.job is None:
                    return None
                decided_on = self.job
                step = self._next_step()
                if step is None:
                    if self.job is decided_on:  # (not a state that a restart's fresh read brought)
                        self.settled_on = decided_on
                    if self.first_sight and self.outcome is None and not self.waiting:
                        self._adopted()
                    return self.requeue
                update, after = step
                if self._write(update) and after is not None:
                    after()
            return 0.0  # still moving: run again (after any other key that waits)
        finally:
            status = None if self.job is None else (self.job.get("status") or {})
            _drop_superseded(self.namespace, self.created, status)

    def _write(self, update: dict) -> bool:
        try:
            written = kube.patch_job_status(self.namespace, self.name, update,
                                            self.job["metadata"]["resourceVersion"])
        except ApiException as err:
            if err.status not in (404, 409):
                raise
            # Someone wrote since our read (or the job is gone): read again and decide again.
            self.job = kube.get_job(self.namespace, self.name)
            if self.job is not None:
                QUEUE.observe(self.key, self.job)
            return False
        self.job = written
        QUEUE.observe(self.key, written)
        return True

    def _refresh(self) -> None:
        """After a step that wrote through `patch_status_fresh` (restart): continue from what it
        wrote (or read)."""
        latest = QUEUE.get(self.key)
        if latest is not None and newer(latest, self.job):
            self.job = latest

    def _event(self, warning: bool, reason: str, message: str) -> None:
        post_event(self.job, warning, reason, message)

    # --- deciding ---

    def _next_step(self):
        job = self.job
        meta, status, spec = job["metadata"], job.get("status") or {}, job.get("spec") or {}
        phase = status.get("phase")
        if phase in TERMINAL:
            if self.first_sight and self.outcome is None:
                self.outcome = "unchanged"
            return None
        if not phase:
            return self._start()
        if meta.get("generation") != status.get("observedGeneration") and not self._spec_answered():
            return self._spec_changed()
        ptjs = ATTEMPTS.of(self.namespace, self.name)
        attempt = status.get("attempt") or 1
        for ptj_name, ptj in ptjs.items():  # left over from a crash between two steps
            older = (_attempt_of(ptj) or attempt) < attempt
            if older and _owned_by(ptj, meta["uid"]) and not ptj["metadata"].get("deletionTimestamp"):
                log.info("deleting %s/%s: superseded by attempt %s", self.namespace, ptj_name, attempt)
                kube.delete_pytorchjob(self.namespace, ptj_name)
        current = ptjs.get(pytorchjob_name(self.name, attempt))
        if current is None and status.get("pytorchJob") == pytorchjob_name(self.name, attempt):
            # Recorded but not (yet) seen by the watch: after an operator restart the jobs' events
            # come before their PyTorchJobs'. Right after the start, wait a little for the watch
            # (its event queues the job again); then one GET tells.
            if self.first_sight and _LOOP is not None and time.monotonic() - _WATCH_STARTED < UNSEEN_GRACE:
                self.waiting, self.requeue = True, 1.0
                return None
            current = kube.get_pytorchjob(self.namespace, status["pytorchJob"])
            if current is not None:
                ATTEMPTS.put(current)
        if current is not None and not _owned_by(current, meta["uid"]):
            current = None  # a name conflict: creating will say so
        suspend = bool(spec.get("suspend"))
        if phase == "Suspended":
            if suspend:
                if current is not None and not current["metadata"].get("deletionTimestamp"):
                    kube.delete_pytorchjob(self.namespace, current["metadata"]["name"])
                return None
            return self._resume()
        if suspend:
            return self._suspend(current)
        if current is None:
            due = parse_time(status.get("nextAttemptTime"))
            if due is not None and due > now():
                self.requeue = (due - now()).total_seconds() + 0.05
                return None
            return self._create_attempt(attempt)
        if current["metadata"].get("deletionTimestamp"):
            return None  # its DELETED event brings us back
        state = pytorchjob_state(current)
        if state == "Failed":
            _attempt_failed(self.namespace, self.name, current)
            self._refresh()
            self.outcome = self.outcome or "restarted"
            return self._next_step() if (self.job.get("status") or {}).get("attempt") != attempt else None
        if state is not None and PHASE_OF[state] != phase:
            return self._follow(current, state)
        if phase in ACTIVE:
            _schedule_monitor(self.job)
            self.requeue = CONFIG.progress_interval
        return None

    def _validated(self):
        try:
            return validate(self.job["spec"], self.name, CONFIG.default_etcd_endpoint), None
        except InvalidJob as err:
            status, msg = self.job.get("status") or {}, str(err)
            self.outcome = "invalid"
            return None, (_fail(self.job, status, "InvalidSpec", msg),
                          lambda: self._event(True, "InvalidSpec", msg))

    def _start(self):
        spec, failed = self._validated()
        if failed:
            return failed
        if self.job["spec"].get("suspend"):
            generation = self.job["metadata"].get("generation")
            conds = set_condition([], "Validated", True, "SpecValid", "the spec passed validation", generation)
            conds = set_condition(conds, "Ready", False, "Suspended", "spec.suspend is true", generation)
            self.outcome = "suspended"
            return ({"phase": "Suspended", "attempt": 1, "restarts": 0, "observedGeneration": generation,
                     "model": model_summary(spec.model), "plan": _plan_status(spec), "conditions": conds,
                     "reason": "Suspended", "message": "created suspended: spec.suspend is true"},
                    lambda: self._event(False, "Suspended", "created suspended (spec.suspend is true)"))
        return self._create_attempt(1, spec)

    def _create_attempt(self, attempt: int, spec: LLMTrainingJobSpec | None = None):
        """Create (or adopt) attempt N's PyTorchJob, then record it, conditionally on the read that
        said attempt N. Without the GET the old operator made first: the watch's object may be
        older than the job, but the write that follows fails on any newer version, and then what
        was created is deleted unless a fresh read still asks for it (`_drop_superseded`)."""
        job = self.job
        meta, status = job["metadata"], job.get("status") or {}
        generation = meta.get("generation")
        if spec is None:
            spec, failed = self._validated()
            if failed:
                return failed
        try:
            obj = _render(spec, job["spec"], job, attempt)
        except (ValueError, TypeError, yaml.YAMLError) as err:  # what validation could not foresee
            msg = f"cannot render the PyTorchJob of attempt {attempt}: {err}"
            self.outcome = "invalid"
            return _fail(job, status, "RenderFailed", msg), lambda: self._event(True, "RenderFailed", msg)
        ptj_name = obj["metadata"]["name"]
        existing = ATTEMPTS.of(self.namespace, self.name).get(ptj_name)
        try:
            if existing is not None and not existing["metadata"].get("deletionTimestamp"):
                ptj, was_created = existing, False
            else:
                ptj, was_created = kube.create_pytorchjob(obj)
        except ApiException as err:
            if err.status not in (400, 403, 422) and not rejections.final(self.namespace, self.name, attempt, err):
                raise  # retried with backoff (rejections.py: a 413, or a 5xx a few times, is final)
            msg = f"the API server refused PyTorchJob {ptj_name}: {_api_message(err)}"
            self.outcome = "invalid"
            return (_fail(job, status, "PyTorchJobRejected", msg),
                    lambda: self._event(True, "PyTorchJobRejected", msg))
        ATTEMPTS.put(ptj)
        rejections.forget(self.namespace, self.name)
        if was_created:
            self.created.append(ptj_name)
        if not _owned_by(ptj, meta["uid"]):
            msg = (f"a PyTorchJob named {ptj_name} already exists in {self.namespace} and "
                   "is not owned by this job; delete it or rename the job")
            self.outcome = "invalid"
            return _fail(job, status, "NameConflict", msg), lambda: self._event(True, "NameConflict", msg)
        verb = "Created" if was_created else "Adopted"
        self.outcome = verb.lower()
        update = {"attempt": attempt, "restarts": status.get("restarts") or 0, "pytorchJob": ptj_name,
                  "rendezvousId": ptj["spec"]["elasticPolicy"]["rdzvId"], "attemptCreationTime": timestamp(),
                  "nextAttemptTime": None}
        if not status.get("phase"):  # a new job
            conds = set_condition(status.get("conditions") or [], "Validated", True, "SpecValid",
                                  "the spec passed validation", generation)
            update.update(phase="Pending", observedGeneration=generation, model=model_summary(spec.model),
                          plan=_plan_status(spec),
                          conditions=set_condition(conds, "Ready", False, "Pending",
                                                   "waiting for the PyTorchJob to run", generation))
        message = f"{verb} PyTorchJob {ptj_name} (attempt {attempt})"
        return update, lambda: self._event(False, verb, message)

    def _adopted(self) -> None:
        """First sight of a job whose attempt is as recorded (an operator restart): nothing to
        write; say so once."""
        status = self.job.get("status") or {}
        exists = status.get("pytorchJob") in ATTEMPTS.of(self.namespace, self.name)
        self.outcome = "adopted" if exists else "unchanged"
        if exists and status.get("phase") in ACTIVE:
            self._event(False, "Adopted", f"Adopted PyTorchJob {status['pytorchJob']} "
                        f"(attempt {status.get('attempt') or 1})")

    def _spec_answered(self) -> bool:
        """The current generation was already judged (and refused: observedGeneration stays)."""
        generation = self.job["metadata"].get("generation")
        return any(c.get("type") == "SpecAccepted" and c.get("observedGeneration") == generation
                   for c in (self.job.get("status") or {}).get("conditions") or [])

    def _spec_changed(self):
        job = self.job
        status, generation = job.get("status") or {}, job["metadata"].get("generation")
        current = ATTEMPTS.of(self.namespace, self.name).get(status.get("pytorchJob") or "")
        if current is not None and current["metadata"].get("annotations", {}).get(SPEC_HASH) != spec_hash(job["spec"]):
            # The CRD's CEL rules normally stop this at the API server; this catches a CRD without them.
            msg = ("only spec.resilience, spec.suspend and spec.checkpoint.intervalMinutes/keep may "
                   "change while the job exists; the running attempt keeps its original spec")
            reason, ok = "ImmutableFieldChanged", False
        else:
            try:
                validate(job["spec"], self.name, CONFIG.default_etcd_endpoint)
                msg, reason, ok = "spec update applied (resilience and suspend now, checkpoint cadence " \
                                  "from the next attempt)", "Applied", True
            except InvalidJob as err:
                msg, reason, ok = str(err), "InvalidSpec", False
        update = {"conditions": set_condition(status.get("conditions") or [], "SpecAccepted", ok, reason, msg,
                                              generation)}
        if ok:
            update["observedGeneration"] = max(generation or 0, status.get("observedGeneration") or 0)
        self.outcome = "updated" if ok else "invalid"
        return update, lambda: (self._event(False, "SpecUpdated", msg) if ok
                                else self._event(True, "SpecChangeRejected", msg))

    def _suspend(self, current: dict | None):
        status = self.job.get("status") or {}
        attempt = status.get("attempt") or 1
        msg = (f"spec.suspend is true: attempt {attempt} stopped (the trainer checkpoints on SIGTERM); "
               "the restart budget is kept; set it to false to resume from the newest checkpoint")
        update = {"phase": "Suspended", "reason": "Suspended", "message": msg, "nextAttemptTime": None,
                  "conditions": set_condition(status.get("conditions") or [], "Ready", False, "Suspended",
                                              msg, self.job["metadata"].get("generation"))}
        self.outcome = "suspended"

        def after():
            if current is not None:
                kube.delete_pytorchjob(self.namespace, current["metadata"]["name"])
            self._event(False, "Suspended", msg)
        return update, after

    def _resume(self):
        status = self.job.get("status") or {}
        self.outcome = "resumed"
        if not status.get("pytorchJob"):  # created suspended: attempt 1 never started
            generation = self.job["metadata"].get("generation")
            return ({"phase": "Pending", "reason": "Resumed", "message": "spec.suspend is false: starting",
                     "conditions": set_condition(status.get("conditions") or [], "Ready", False, "Pending",
                                                 "waiting for the PyTorchJob to run", generation)}, None)
        restart(self.namespace, self.name, "resumed", "spec.suspend is false",
                lambda j: (j.get("status") or {}).get("phase") == "Suspended" and not (j.get("spec") or {}).get("suspend"),
                spend=False)
        self._refresh()
        return self._next_step() if (self.job.get("status") or {}).get("phase") != "Suspended" else None

    def _follow(self, ptj: dict, state: str):
        """Copy the PyTorchJob's (non-failed) state into the job's phase."""
        status = self.job.get("status") or {}
        phase = PHASE_OF[state]
        message = f"PyTorchJob {ptj['metadata']['name']} is {state}"
        update: dict = {"phase": phase, "reason": state, "message": message,
                        "conditions": set_condition(status.get("conditions") or [], "Ready",
                                                    phase in ("Running", "Succeeded"), state, message,
                                                    self.job["metadata"].get("generation"))}
        if phase == "Running":
            update["startTime"] = status.get("startTime") or timestamp()
            update["attemptStartTime"] = timestamp()
        if phase == "Succeeded":
            update["completionTime"] = timestamp()
        return update, lambda: self._event(False, phase, message)


def post_event(obj: dict, warning: bool, reason: str, message: str) -> None:
    """A Kubernetes event about `obj`. From a worker (or monitor pool) thread: one POST from that
    thread (`kube.post_event`). kopf's poster (the event loop hands each event to a per-object
    task that posts it through aiohttp) cost ~10% of the operator's GIL time at 1,000 creates,
    all of it on the one event loop every watch event also needs; the same POST from the worker
    costs a fraction and waits on its own thread. On the event loop itself (no blocking call
    there) kopf's poster still posts it."""
    try:
        on_loop = asyncio.get_running_loop() is _LOOP
    except RuntimeError:
        on_loop = False
    if _LOOP is None or on_loop:
        (kopf.warn if warning else kopf.info)(obj, reason=reason, message=message)
    else:
        kube.post_event(kopf.build_object_reference(obj), warning, reason, message)


def _attempt_failed(namespace: str, name: str, ptj: dict) -> None:
    """The current attempt's PyTorchJob failed: the next attempt, or Failed when the budget is spent."""
    attempt = str(_attempt_of(ptj) or "")

    def live_attempt(job: dict) -> bool:  # not an older attempt's object, not a finished job
        status = job.get("status") or {}
        return (_owned_by(ptj, job["metadata"]["uid"]) and str(status.get("attempt") or 1) == attempt
                and status.get("phase") not in TERMINAL + ("Suspended",))

    # --- nodes: failure forensics + preflight (forensics.py) ---
    job = kube.get_job(namespace, name)
    if job is None or not attempt or not live_attempt(job):
        return
    failed = forensics.on_failed(namespace, name, ptj, int(attempt), job)
    restart(namespace, name, failed.reason, failed.message, live_attempt, spend=failed.spend, amend=failed.amend)
    forensics.after_restart(namespace, name, failed, job)
    # --- end nodes ---


def _drop_superseded(namespace: str, created: list[str], status: dict | None) -> None:
    """A PyTorchJob this run created for an attempt that the job's final status (the last read,
    or our last write) does not point at (another actor started a later attempt, the job failed,
    was suspended or went away between our read and our write) must not live on beside the
    current one."""
    current = (status or {}).get("pytorchJob")
    gone = status is None or status.get("phase") in ("Failed", "Suspended")
    for ptj_name in created:
        if ptj_name != current or gone:
            log.warning("deleting %s/%s: created for an attempt that was superseded", namespace, ptj_name)
            kube.delete_pytorchjob(namespace, ptj_name)


def restart(namespace: str, name: str, reason: str, message: str, still_applies, on_read=None, *,
            spend: bool = True, amend=None) -> None:
    """Start the next attempt (fresh rendezvous id, resumes from the newest checkpoint), or fail the
    job when its restart budget is spent. `still_applies(job)` re-checks the trigger on every read.
    `spend=False`: the new attempt does not count against spec.resilience.maxRestarts and starts at
    once (an attempt that never trained through no fault of the job, e.g. a failed preflight or a
    resume after suspend). `spend=True`: the next attempt's PyTorchJob is created only after the
    restart backoff (status.nextAttemptTime, so it survives operator restarts). `amend(job, update)
    -> update` adds fields to the transition (decided on the same fresh read, written in the same
    conditional write). Callers hold the job's lock. The reconciler creates the new attempt's
    PyTorchJob (the job is queued)."""

    def decide(job: dict) -> dict | None:
        update = _decide(job)
        return amend(job, update) if (update is not None and amend is not None) else update

    def _decide(job: dict) -> dict | None:
        if not still_applies(job):
            return None
        meta, status = job["metadata"], job.get("status") or {}
        restarts = status.get("restarts") or 0
        resilience = job["spec"].get("resilience") or {}
        budget = resilience.get("maxRestarts", 10)
        if spend and restarts >= budget:
            return _fail(job, status, "RestartBudgetExhausted",
                         f"attempt {status.get('attempt') or 1} {reason}: {message}; "
                         f"{restarts} of {budget} restarts used")
        attempt = (status.get("attempt") or 1) + 1
        delay = restart_backoff(resilience, restarts) if spend else 0.0
        due = now() + dt.timedelta(seconds=delay)
        if due.microsecond:  # status times have whole seconds: round up, never start early
            due = due.replace(microsecond=0) + dt.timedelta(seconds=1)
        when = (f"at {timestamp(due)} (restart backoff {delay:.0f} s)" if delay >= 1 else "now")
        reason_word = "".join(w.capitalize() for w in reason.split("-"))
        return {"phase": "Restarting", "attempt": attempt, "restarts": restarts + (1 if spend else 0),
                "reason": reason_word, "pytorchJob": pytorchjob_name(name, attempt),
                "rendezvousId": rendezvous_id(namespace, name, meta["uid"], attempt),
                "attemptCreationTime": timestamp(due),
                "nextAttemptTime": timestamp(due) if delay >= 1 else None,
                "message": f"attempt {attempt - 1} {reason}: {message}; starting attempt {attempt} "
                           f"from the newest checkpoint {when}",
                "conditions": set_condition(status.get("conditions") or [], "Ready", False,
                                            "Restarting", f"attempt {attempt - 1} {reason}",
                                            meta.get("generation"))}

    done = patch_status_fresh(namespace, name, decide, on_read=on_read)
    if not done:
        return
    job, update = done
    old = (job.get("status") or {}).get("pytorchJob")
    if update["phase"] == "Failed":
        if old and reason in ("hang", "startup-timeout", *health.RESTART_REASONS):  # still holds its nodes
            kube.delete_pytorchjob(namespace, old)
    else:
        METRICS.restarts.labels(namespace, name, reason).inc()
        if old:
            kube.delete_pytorchjob(namespace, old)
    post_event(job, True, update["reason"] if update["phase"] == "Failed" else "Restarting", update["message"])
    QUEUE.add((namespace, name))  # level-triggered: the reconciler creates the new attempt


_SEEN: set[tuple[str, str]] = set()  # jobs this process reconciled at least once
_SEEN_LOCK = threading.Lock()


def reconcile_key(key: tuple[str, str], job: dict | None) -> float | None:
    """The work queue's handler: returns when to look again (seconds), or None."""
    if job is None:
        return None
    namespace, name = key
    with _SEEN_LOCK:
        first = key not in _SEEN
    started = time.perf_counter()
    run = Reconcile(namespace, name, job, first)
    try:
        with _job_lock(namespace, name):
            requeue = run.run()
        if not run.waiting:
            with _SEEN_LOCK:
                _SEEN.add(key)
        # The watch's echo of this run's own status write (and any older event) then queues
        # nothing: one reconcile per new job instead of two.
        QUEUE.settle(key, run.settled_on)
        return requeue
    except Exception:
        run.outcome = "error"
        raise
    finally:
        if run.outcome:
            METRICS.reconciles.labels(run.outcome).inc()
            METRICS.reconcile_seconds.observe(time.perf_counter() - started)


QUEUE = WorkQueue(reconcile_key, workers=CONFIG.workers)
_LOOP: asyncio.AbstractEventLoop | None = None
_WATCH_STARTED = 0.0  # monotonic time of the first watch event
UNSEEN_GRACE = 5.0


def _start_workers() -> None:
    """On the first event, from kopf's context: the workers run in copies of it (kopf.info/warn
    post through context variables), and the monitor runs on this loop."""
    global _LOOP
    if not QUEUE.started:
        global _WATCH_STARTED
        _WATCH_STARTED = time.monotonic()
        _LOOP = asyncio.get_running_loop()
        QUEUE.start([contextvars.copy_context() for _ in range(CONFIG.workers)])


# --- kopf: watch events only (no persistence: kopf writes nothing on our objects) ----------------

@kopf.on.event(GROUP, VERSION, PLURAL)
async def job_event(event, body, namespace, name, status, **_):
    # async: pure bookkeeping on the event loop; the work happens on the queue's threads
    _start_workers()
    key = (namespace, name)
    if event["type"] == "DELETED":
        _track_phase(namespace, name, None)
        QUEUE.forget(key)
        _forget(namespace, name)
        _RANK0_IPS.pop(key, None)
        nodes.forget(namespace, name)
        METRICS.forget_job(namespace, name)
        rejections.forget(namespace, name)
        _LAST_MONITOR.pop(key, None)
        with _SEEN_LOCK:
            _SEEN.discard(key)
        return
    _track_phase(namespace, name, (status or {}).get("phase"))
    QUEUE.add(key, dict(body))


@kopf.on.event("kubeflow.org", "v1", "pytorchjobs", labels={JOB_LABEL: kopf.PRESENT})
async def pytorchjob_event(event, body, namespace, name, labels, **_):
    _start_workers()
    if event["type"] == "DELETED":
        ATTEMPTS.drop(namespace, labels[JOB_LABEL], name)
    elif not ATTEMPTS.put(dict(body)):
        return  # the echo of our own create: the run that created it decided with it already
    key = (namespace, labels[JOB_LABEL])
    if QUEUE.get(key) is not None:  # the job's own first event queues it otherwise
        QUEUE.add(key)


# --- pods, progress, start-up and hang detection (on the event loop) -----------------------------

class PodCache:
    """The worker pods of every attempt, summarized (`status.pod_summary`): what the start-up check
    and the scraper need, from one pod watch (no per-job LIST). Written on the event loop, read
    there by the monitor. Not a kopf index, for the reason `AttemptCache` is not one: kopf starts
    no handler before every index's initial list is processed, so a restarted operator with the
    pods of 1,000 running jobs in an index re-adopted none of them until kopf had indexed them all."""

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


PODS = PodCache()


@kopf.on.event("", "v1", "pods", labels={JOB_LABEL: kopf.PRESENT, ATTEMPT_LABEL: kopf.PRESENT})
async def attempt_pod_event(event, body, namespace, name, labels, **_):
    job, attempt = labels[JOB_LABEL], labels[ATTEMPT_LABEL]
    if event["type"] == "DELETED":
        PODS.drop(namespace, job, attempt, name)
        return
    summary = pod_summary(dict(body))
    if summary["owner"]:  # a PyTorchJob's pod (nodes: a failure may follow), not a hand-made one
        nodes.saw_pod(namespace, job, attempt, summary["node"], summary["owner"])
    PODS.put(namespace, job, attempt, name, summary)


# Blocking API calls of the monitor run here, never on the reconciler's workers: a slow scrape or a burst
# of timer work cannot delay a new job's PyTorchJob.
_MONITOR_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="llmtrain-monitor")
_SCRAPES: asyncio.Semaphore | None = None
_HTTP: aiohttp.ClientSession | None = None
_RANK0_IPS: dict[tuple[str, str], str] = {}


async def _in_pool(fn, *args):
    # In a copy of the handler's context: kopf.info/warn find kopf's settings through contextvars.
    ctx = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(_MONITOR_POOL, ctx.run, fn, *args)


def rank0_ip(pods: list[dict]) -> str | None:
    """IP of the attempt's first worker pod (replica index 0), where local rank 0 serves metrics."""
    for pod in sorted(pods, key=lambda p: (p.get("index") or "~", p["name"])):
        if pod.get("ip"):
            return pod["ip"]
    return None


async def scrape_progress(ip: str):
    """rank 0's /metrics → Progress, or None; at most CONFIG.max_concurrent_scrapes at once, each
    bounded by CONFIG.scrape_timeout and in size (scrape.py: the body is the tenant's), all on the
    event loop (an idle connection costs no thread)."""
    global _SCRAPES, _HTTP
    if _SCRAPES is None:
        _SCRAPES = asyncio.Semaphore(CONFIG.max_concurrent_scrapes)
    if _HTTP is None or _HTTP.closed:
        _HTTP = scrape.session(CONFIG.scrape_timeout)
    async with _SCRAPES:
        return await scrape.scrape(_HTTP, f"http://{ip}:{CONFIG.trainer_metrics_port}/metrics")


_MONITORING: set[tuple[str, str]] = set()  # monitors in flight (touched on the event loop only)
_LAST_MONITOR: dict[tuple[str, str], float] = {}  # when each job's monitor last started (workers)
_MONITOR_GUARD = threading.Lock()


def _schedule_monitor(job: dict) -> None:
    """From a worker: run the job's monitor on the event loop, at most once per
    --progress-interval and never two at once for a job (a slow scrape does not pile up)."""
    key = (job["metadata"]["namespace"], job["metadata"]["name"])
    with _MONITOR_GUARD:
        at = time.monotonic()
        if at - _LAST_MONITOR.get(key, -1e9) < CONFIG.progress_interval * 0.9 or _LOOP is None:
            return
        _LAST_MONITOR[key] = at
    asyncio.run_coroutine_threadsafe(monitor(job), _LOOP)


async def monitor(job: dict) -> None:
    """Timed work of an active job, on kopf's event loop: thousands of running jobs cost
    coroutines, not threads, and nothing here delays a new job's PyTorchJob."""
    meta, status = job["metadata"], job.get("status") or {}
    key = (meta["namespace"], meta["name"])
    if key in _MONITORING:
        return
    _MONITORING.add(key)
    try:
        attempt = status.get("attempt") or 1
        ptj = ATTEMPTS.of(meta["namespace"], meta["name"]).get(pytorchjob_name(meta["name"], attempt))
        pods = scrape.owned_pods(PODS.of(meta["namespace"], meta["name"], attempt), ptj, meta["uid"])
        if status.get("phase") == "Running":
            await check_progress(job, pods)
        else:
            await check_startup(job, pods)
    except Exception:  # noqa: BLE001 — the next tick tries again
        log.exception("monitor of %s/%s failed", *key)
    finally:
        _MONITORING.discard(key)


async def check_startup(job: dict, pods: list[dict]) -> None:
    """Pending: show why the pods do not start, and give up on the attempt after the deadline."""
    meta, status = job["metadata"], job.get("status") or {}
    namespace, name, attempt = meta["namespace"], meta["name"], status.get("attempt") or 1
    problem = startup_problem(pods)
    pending_since = parse_time(status.get("attemptCreationTime"))
    timeout = dt.timedelta(minutes=(job["spec"].get("resilience") or {}).get("startupTimeoutMinutes", 30))
    if pending_since is not None and now() - pending_since > timeout:
        why = problem[1] if problem else "no worker pod started"
        msg = (f"the pods did not start within startupTimeoutMinutes "
               f"{timeout.total_seconds() / 60:.0f}: {why}")
        await _in_pool(_locked_restart, namespace, name, "startup-timeout", msg,
                       lambda j: (j.get("status") or {}).get("attempt", 1) == attempt
                       and (j.get("status") or {}).get("phase") in ("Pending", "Restarting"))
        return
    if problem is None or (status.get("reason"), status.get("message")) == problem:
        return
    reason, message = problem

    def decide(j: dict) -> dict | None:
        st = j.get("status") or {}
        if (st.get("attempt") or 1) != attempt or st.get("phase") not in ("Pending", "Restarting"):
            return None
        if (st.get("reason"), st.get("message")) == problem:
            return None
        return {"reason": reason, "message": message,
                "conditions": set_condition(st.get("conditions") or [], "Ready", False, reason, message,
                                            j["metadata"].get("generation"))}

    done = await _in_pool(patch_status_fresh, namespace, name, decide)
    if done:
        kopf.warn(done[0], reason=reason, message=message)


def _locked_restart(namespace, name, reason, message, still_applies, amend=None) -> None:
    with _job_lock(namespace, name):
        restart(namespace, name, reason, message, still_applies,
                amend=_chain(forensics.stuck_amend(reason), amend))  # nodes: names the NCCL dumps


def _chain(*amends):
    """One amend() that applies each given one in turn (None entries skipped)."""
    def amend(job: dict, update: dict) -> dict:
        for fn in amends:
            if fn is not None:
                update = fn(job, update)
        return update
    return amend


def _apply_health(namespace: str, name: str, attempt: int, verdict: "health.Verdict") -> None:
    """A health verdict for a Running attempt: its restart (with the condition and the rollback step
    in the same conditional write), or its changed conditions and the applied rollback."""
    def same_attempt(j: dict) -> bool:
        st = j.get("status") or {}
        return (st.get("attempt") or 1) == attempt and st.get("phase") == "Running"

    if verdict.restart is not None:
        r = verdict.restart
        _locked_restart(namespace, name, r.reason, r.message, same_attempt, amend=r.amend)
        return
    posted: list = []

    def decide(j: dict) -> dict | None:
        st = j.get("status") or {}
        if not same_attempt(j):
            return None
        changed = health.changed_conditions(st.get("conditions") or [], verdict)
        applied = verdict.rollback_applied is not None and st.get("resumeBeforeStep") == verdict.rollback_applied
        if not changed and not applied:
            return None
        conds = st.get("conditions") or []
        for c in changed:
            conds = set_condition(conds, c.type, c.status, c.reason, c.message, j["metadata"].get("generation"))
        posted[:] = [c for c in changed if c.warn and c.status]
        update: dict = {"conditions": conds}
        if applied:
            update["resumeBeforeStep"] = None
            posted.append(verdict)
        return update

    with _job_lock(namespace, name):
        done = patch_status_fresh(namespace, name, decide)
    if done:
        for item in posted:
            if isinstance(item, health.Condition):
                post_event(done[0], True, item.reason, item.message)
            else:
                post_event(done[0], False, "RolledBack", (
                    f"attempt {attempt} resumed from the newest checkpoint before step {item.rollback_applied}; "
                    f"the later ones are kept under <checkpoint.uri>/quarantine/"))


async def check_progress(job: dict, pods: list[dict]) -> None:
    meta, status = job["metadata"], job.get("status") or {}
    namespace, name, attempt = meta["namespace"], meta["name"], status.get("attempt") or 1
    ip = rank0_ip(pods)
    progress = await scrape_progress(ip) if ip else None
    current = dict(status.get("progress") or {})
    if progress is not None:
        current.update(progress.as_status())
        current["updateTime"] = timestamp()
        written = await _in_pool(kube.patch_job_status, namespace, name, {"progress": current})
        QUEUE.observe((namespace, name), written)
    # --- health rules (controller/health.py): hang, no first step, NaN, loss spike, stale checkpoint
    spec = health.resilience(job["spec"])
    if spec is not None:
        verdict = health.evaluate(spec, {**status, "progress": current}, progress, now())
        if health.needs_write(status, verdict):  # most scrapes: nothing to write, no extra GET
            await _in_pool(_apply_health, namespace, name, attempt, verdict)
    # --- end of health rules

