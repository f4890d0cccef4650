"""kopf handlers: LLMTrainingJob → PyTorchJob, status, progress, restarts and hang detection.

Lifecycle of one job:
  create/resume  validate → render attempt N → create (or adopt) PyTorchJob `<job>-a<N>` → Pending
  PyTorchJob     its conditions (Created/Running/Restarting/Succeeded/Failed) → status.phase
  Failed / hang  within spec.resilience.maxRestarts: attempt N+1 with a fresh rendezvous id; the
  / start-up     trainer resumes from the newest checkpoint. Beyond it: Failed.
  per-job timer  (async, on the event loop, never on the handler threads) every --progress-interval:
                 Pending: the pods' own reasons (unschedulable, image pull) → status + event, and
                 spec.resilience.startupTimeoutMinutes → restart; Running: scrape rank 0's metrics
                 → status.progress, no step for hangTimeoutMinutes → restart (reason hang).

Consistency rules (an operator restart, a failover or two triggers at once must never go back):
  * every status transition is decided on a fresh GET and written with that read's resourceVersion
    (`patch_status_fresh`); on a conflict it is decided again on a new read;
  * status.attempt and status.restarts only go up: only `restart` raises them, by one, from a
    fresh read; nothing else writes them except with the value it just read;
  * the PyTorchJob of attempt N is created only by a handler whose fresh read says attempt N, and
    if the conditional write that follows finds the job moved on, it deletes what it created;
  * within one process the handlers of one job run one at a time (`_job_lock`); across processes
    only the Lease holder runs at all (`leader.py`).

An invalid job (or one whose PyTorchJob cannot be rendered or is refused by the API server) is
marked Failed with the message and an event; nothing raises out of a handler for a bad spec, so one
bad object never stops the operator serving the others.

Spec changes: the CRD makes everything but spec.resilience and spec.checkpoint.intervalMinutes/
keep immutable. Those two take effect without touching the pods: resilience is the operator's own
business and the checkpoint cadence is read by the next attempt.
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
from kubernetes.client.exceptions import ApiException

from ..planner import plan_job
from ..render import ATTEMPT_LABEL, JOB_LABEL, pytorchjob_name, render_pytorchjob, rendezvous_id
from ..spec import GROUP, PHASES, PLURAL, VERSION, LLMTrainingJobSpec, model_summary
from ..validation import InvalidJob, validate
from . import forensics, kube, nodes
from .config import CONFIG
from .metrics import OperatorMetrics
from .status import (PHASE_OF, TERMINAL, failure_message, hung, now, parse_time, pod_summary,
                     progress_from_metrics, pytorchjob_state, set_condition, startup_problem,
                     timestamp)

METRICS = OperatorMetrics()
SPEC_HASH = "llmtrain.dev/spec-hash"
MUTABLE_SECTIONS = ("resilience", "checkpoint")
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
    """The handlers of one job (its own create/resume and its PyTorchJobs' events) one at a time.
    The conditional writes keep them correct without this; the lock keeps them from racing each
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
    triggers never both act on one attempt, and an unrelated write (kopf's own bookkeeping, a
    progress scrape) never makes a transition get lost. `on_read(job)` sees every read (also the
    last one when nothing is to be done). Returns (job as read, update) or None."""
    for _ in range(CONFLICT_RETRIES):
        job = kube.get_job(namespace, name)
        if on_read is not None:
            on_read(job)
        update = decide(job) if job is not None else None
        if update is None:
            return None
        try:
            kube.patch_job_status(namespace, name, update, job["metadata"]["resourceVersion"])
            return job, update
        except ApiException as err:
            if err.status != 409:
                raise
    raise kopf.TemporaryError(f"{namespace}/{name} kept changing; status not updated", delay=1)


# --- LLMTrainingJob: create / resume -------------------------------------------------------------

@kopf.on.resume(GROUP, VERSION, PLURAL, backoff=5)
@kopf.on.create(GROUP, VERSION, PLURAL, backoff=5)
def reconcile(body, namespace, name, **_):
    started = time.perf_counter()
    outcome = "error"
    try:
        with _job_lock(namespace, name):
            outcome = _already_recorded(dict(body)) or _reconcile(namespace, name)
    finally:
        METRICS.reconciles.labels(outcome).inc()
        METRICS.reconcile_seconds.observe(time.perf_counter() - started)


def _reconcile(namespace: str, name: str) -> str:
    """Make sure the attempt the job's status records (1 for a new job) has its PyTorchJob, and
    record that in status. Decided on a fresh read, written with that read's resourceVersion."""
    outcome = {"result": "unchanged"}
    created: list[str] = []  # PyTorchJobs this call created
    last: dict = {}

    def decide(job: dict) -> dict | None:
        meta, status = job["metadata"], job.get("status") or {}
        generation = meta.get("generation")
        if status.get("phase") in TERMINAL:
            outcome.update(result="unchanged", event=None)
            return None
        try:
            spec = validate(job["spec"], name, CONFIG.default_etcd_endpoint)
        except InvalidJob as err:
            outcome.update(result="invalid", event=("InvalidSpec", str(err)))
            return _fail(job, status, "InvalidSpec", str(err))
        attempt = status.get("attempt") or 1
        try:
            obj = _render(spec, job["spec"], job, attempt)
        except (ValueError, TypeError) as err:  # what validation could not foresee
            msg = f"cannot render the PyTorchJob of attempt {attempt}: {err}"
            outcome.update(result="invalid", event=("RenderFailed", msg))
            return _fail(job, status, "RenderFailed", msg)
        ptj_name = obj["metadata"]["name"]
        try:
            ptj, was_created = kube.ensure_pytorchjob(obj, probably_exists=status.get("pytorchJob") == ptj_name)
        except ApiException as err:
            if err.status not in (400, 403, 422):
                raise
            msg = f"the API server refused PyTorchJob {ptj_name}: {_api_message(err)}"
            outcome.update(result="invalid", event=("PyTorchJobRejected", msg))
            return _fail(job, status, "PyTorchJobRejected", msg)
        if was_created:
            created.append(ptj_name)
        if not _owned_by(ptj, meta["uid"]):
            msg = (f"a PyTorchJob named {ptj_name} already exists in {namespace} and "
                   "is not owned by this job; delete it or rename the job")
            outcome.update(result="invalid", event=("NameConflict", msg))
            return _fail(job, status, "NameConflict", msg)
        verb = "Created" if ptj_name in created else "Adopted"
        outcome.update(result=verb.lower(), event=(verb, f"{verb} PyTorchJob {ptj_name} (attempt {attempt})"))
        update = {
            "attempt": attempt,
            "restarts": status.get("restarts") or 0,
            "pytorchJob": ptj_name,
            "rendezvousId": ptj["spec"]["elasticPolicy"]["rdzvId"],
            "observedGeneration": generation,
            "model": model_summary(spec.model),
        }
        conds = set_condition(status.get("conditions") or [], "Validated", True, "SpecValid",
                              "the spec passed validation", generation)
        if not status.get("phase"):  # a new job; a resumed one keeps its phase and Ready
            update["phase"] = "Pending"
            update["attemptCreationTime"] = timestamp()
            conds = set_condition(conds, "Ready", False, "Pending", "waiting for the PyTorchJob to run",
                                  generation)
        update["conditions"] = conds
        if "plan" not in status:
            update["plan"] = _plan_status(spec)
        if all(status.get(k) == v for k, v in update.items()):
            return None  # a resume of a job that is as recorded: nothing to write
        return update

    done = None
    try:
        done = patch_status_fresh(namespace, name, decide, on_read=lambda job: last.update(job=job))
    finally:
        job = last.get("job")
        status = {**((job or {}).get("status") or {}), **(done[1] if done else {})}
        _drop_superseded(namespace, created, None if job is None else status)
    if job is not None:
        event = outcome.get("event")
        if event:
            (kopf.warn if outcome["result"] == "invalid" else kopf.info)(job, reason=event[0], message=event[1])
    return outcome["result"]


def _already_recorded(job: dict) -> str | None:
    """The operator-restart fast path: a job whose status (as kopf listed it) already records its
    current attempt's PyTorchJob, which still exists, needs no write, so it needs no fresh read
    either: one GET of the PyTorchJob re-adopts it. Anything else takes the full, conditional path."""
    meta, status = job["metadata"], job.get("status") or {}
    attempt = status.get("attempt")
    if (not attempt or status.get("phase") in TERMINAL or not status.get("phase")
            or status.get("pytorchJob") != pytorchjob_name(meta["name"], attempt)
            or status.get("observedGeneration") != meta.get("generation")
            or "plan" not in status or "model" not in status):
        return None
    ptj = kube.get_pytorchjob(meta["namespace"], status["pytorchJob"])
    if ptj is None or not _owned_by(ptj, meta["uid"]):
        return None
    kopf.info(job, reason="Adopted", message=f"Adopted PyTorchJob {status['pytorchJob']} (attempt {attempt})")
    return "adopted"


def _drop_superseded(namespace: str, created: list[str], status: dict | None) -> None:
    """A PyTorchJob this call created for an attempt that the job's final status (the last read,
    plus our write if it applied) does not point at (another actor started a later attempt, or the
    job failed or went away, between our read and our write) must not live on beside the current one."""
    current = (status or {}).get("pytorchJob")
    gone = status is None or status.get("phase") == "Failed"
    for ptj_name in created:
        if ptj_name != current or gone:
            log.warning("deleting %s/%s: created for an attempt that was superseded", namespace, ptj_name)
            kube.delete_pytorchjob(namespace, ptj_name)


# --- LLMTrainingJob: spec updates ----------------------------------------------------------------

@kopf.on.update(GROUP, VERSION, PLURAL, field="spec", backoff=5)
def spec_changed(body, status, namespace, name, **_):
    # The diff base holds only the mutable sections (see __main__), so `old`/`new` would be partial:
    # decide from the whole current spec in `body`.
    new_spec = dict(body["spec"])
    generation = body["metadata"].get("generation")
    if (status or {}).get("phase") in TERMINAL:
        return
    ptj = kube.get_pytorchjob(namespace, status["pytorchJob"]) if (status or {}).get("pytorchJob") else None
    if ptj is not None and ptj["metadata"].get("annotations", {}).get(SPEC_HASH) != spec_hash(new_spec):
        # The CRD's CEL rules normally stop this at the API server; this catches a CRD without them.
        msg = ("only spec.resilience and spec.checkpoint.intervalMinutes/keep may change while the "
               "job exists; the running attempt keeps its original spec")
        reason, ok = "ImmutableFieldChanged", False
    else:
        try:
            validate(new_spec, name, CONFIG.default_etcd_endpoint)
            msg, reason, ok = "resilience/checkpoint cadence updated", "Applied", True
        except InvalidJob as err:
            msg, reason, ok = str(err), "InvalidSpec", False

    def decide(job: dict) -> dict | None:
        st = job.get("status") or {}
        if st.get("phase") in TERMINAL:
            return None
        update = {"conditions": set_condition(st.get("conditions") or [], "SpecAccepted", ok, reason, msg,
                                              generation)}
        if ok:
            update["observedGeneration"] = max(generation or 0, st.get("observedGeneration") or 0)
        return update

    with _job_lock(namespace, name):
        done = patch_status_fresh(namespace, name, decide)
    if not done:
        return
    if ok:
        kopf.info(body, reason="SpecUpdated", message="resilience settings apply now; checkpoint cadence "
                  "applies from the next attempt")
    else:
        kopf.warn(body, reason="SpecChangeRejected", message=msg)
    METRICS.reconciles.labels("updated" if ok else "invalid").inc()


@kopf.on.event(GROUP, VERSION, PLURAL)
async def track_phase(event, namespace, name, status, **_):
    # async: pure bookkeeping, so it runs on the event loop instead of taking a handler thread
    deleted = event["type"] == "DELETED"
    _track_phase(namespace, name, None if deleted else (status or {}).get("phase"))
    if deleted:
        _forget(namespace, name)
        _RANK0_IPS.pop((namespace, name), None)
        nodes.forget(namespace, name)


# --- PyTorchJob → LLMTrainingJob status ------------------------------------------------------------

def _has_state(body, **_) -> bool:
    # Filtered on the event loop: PyTorchJob events without a condition cost no handler thread.
    return pytorchjob_state(body) is not None


@kopf.on.event("kubeflow.org", "v1", "pytorchjobs", labels={JOB_LABEL: kopf.PRESENT}, when=_has_state)
def pytorchjob_event(event, body, namespace, labels, **_):
    if event["type"] == "DELETED":
        return
    ptj, name, attempt = dict(body), labels[JOB_LABEL], labels.get(ATTEMPT_LABEL)
    state = pytorchjob_state(ptj)
    if state is None:
        return

    def live_attempt(job: dict) -> bool:  # not an older attempt's object, not a finished job
        status = job.get("status") or {}
        return (_owned_by(ptj, job["metadata"]["uid"]) and str(status.get("attempt") or 1) == attempt
                and status.get("phase") not in TERMINAL)

    seen: dict = {}
    with _job_lock(namespace, name):
        try:
            if state == "Failed":
                # --- nodes: failure forensics + preflight (forensics.py) ---
                job = kube.get_job(namespace, name)
                if job is not None and live_attempt(job):
                    failed = forensics.on_failed(namespace, name, ptj, int(attempt), job)
                    restart(namespace, name, failed.reason, failed.message, live_attempt,
                            on_read=lambda job: seen.update(job=job), spend=failed.spend, amend=failed.amend)
                    forensics.after_restart(namespace, name, failed, job)
                    return
                # --- end nodes ---
                restart(namespace, name, "failed", failure_message(ptj), live_attempt,
                        on_read=lambda job: seen.update(job=job))
                return
            done = _follow(namespace, name, ptj, state, live_attempt, seen)
        finally:
            _delete_if_superseded(ptj, seen.get("job"))
    if done:
        kopf.info(done[0], reason=PHASE_OF[state], message=done[1]["message"])
        _track_phase(namespace, name, PHASE_OF[state])


def _delete_if_superseded(ptj: dict, job: dict | None) -> None:
    """A PyTorchJob of an attempt older than the job's current one is left over (the operator died
    between starting the next attempt and deleting this one): delete it, so exactly one lives."""
    if job is None or not _owned_by(ptj, job["metadata"]["uid"]):
        return
    try:
        attempt = int(ptj["metadata"]["labels"][ATTEMPT_LABEL])
    except (KeyError, ValueError):
        return
    if attempt < ((job.get("status") or {}).get("attempt") or 1):
        log.info("deleting %s/%s: superseded by attempt %s", ptj["metadata"]["namespace"],
                 ptj["metadata"]["name"], job["status"]["attempt"])
        kube.delete_pytorchjob(ptj["metadata"]["namespace"], ptj["metadata"]["name"])


def _follow(namespace, name, ptj, state, live_attempt, seen):
    """Copy the PyTorchJob's (non-failed) state into the job's phase, on a fresh read."""
    phase = PHASE_OF[state]
    message = f"PyTorchJob {ptj['metadata']['name']} is {state}"

    def decide(job: dict) -> dict | None:
        status = job.get("status") or {}
        if not live_attempt(job) or status.get("phase") == phase:
            return None
        update: dict = {"phase": phase, "reason": state, "message": message,
                        "conditions": set_condition(status.get("conditions") or [], "Ready",
                                                    phase in ("Running", "Succeeded"), state, message,
                                                    job["metadata"].get("generation"))}
        if phase == "Running":
            update["startTime"] = status.get("startTime") or timestamp()
            update["attemptStartTime"] = timestamp()
        if phase == "Succeeded":
            update["completionTime"] = timestamp()
        return update

    return patch_status_fresh(namespace, name, decide, on_read=lambda job: seen.update(job=job))


def restart(namespace: str, name: str, reason: str, message: str, still_applies, on_read=None, *,
            spend: bool = True, amend=None) -> None:
    """Start the next attempt (fresh rendezvous id, resumes from the newest checkpoint), or fail the
    job when its restart budget is spent. `still_applies(job)` re-checks the trigger on every read.
    `spend=False`: the new attempt does not count against spec.resilience.maxRestarts (an attempt
    that never trained through no fault of the job, e.g. a failed preflight or a resume after
    suspend). `amend(job, update) -> update` adds fields to the transition (decided on the same
    fresh read, written in the same conditional write). Callers hold the job's lock."""

    def decide(job: dict) -> dict | None:
        update = _decide(job)
        return amend(job, update) if (update is not None and amend is not None) else update

    def _decide(job: dict) -> dict | None:
        if not still_applies(job):
            return None
        meta, status = job["metadata"], job.get("status") or {}
        restarts = status.get("restarts") or 0
        budget = (job["spec"].get("resilience") or {}).get("maxRestarts", 10)
        if spend and restarts >= budget:
            return _fail(job, status, "RestartBudgetExhausted",
                         f"attempt {status.get('attempt') or 1} {reason}: {message}; "
                         f"{restarts} of {budget} restarts used")
        attempt = (status.get("attempt") or 1) + 1
        reason_word = "".join(w.capitalize() for w in reason.split("-"))
        return {"phase": "Restarting", "attempt": attempt, "restarts": restarts + (1 if spend else 0),
                "reason": reason_word, "pytorchJob": pytorchjob_name(name, attempt),
                "rendezvousId": rendezvous_id(namespace, name, meta["uid"], attempt),
                "attemptCreationTime": timestamp(),
                "message": f"attempt {attempt - 1} {reason}: {message}; starting attempt {attempt} "
                           f"from the newest checkpoint",
                "conditions": set_condition(status.get("conditions") or [], "Ready", False,
                                            "Restarting", f"attempt {attempt - 1} {reason}",
                                            meta.get("generation"))}

    done = patch_status_fresh(namespace, name, decide, on_read=on_read)
    if not done:
        return
    job, update = done
    old = (job.get("status") or {}).get("pytorchJob")
    if update["phase"] == "Failed":
        if old and reason in ("hang", "startup-timeout"):  # a stuck attempt still holds its nodes
            kube.delete_pytorchjob(namespace, old)
        _track_phase(namespace, name, "Failed")
    else:
        METRICS.restarts.labels(namespace, name, reason).inc()
        if old:
            kube.delete_pytorchjob(namespace, old)
        _track_phase(namespace, name, "Restarting")
        _reconcile(namespace, name)  # creates the new attempt's PyTorchJob, on a fresh read
    kopf.warn(job, reason=update["reason"] if update["phase"] == "Failed" else "Restarting",
              message=update["message"])


# --- pods, progress, start-up and hang detection (on the event loop) -----------------------------

@kopf.index("", "v1", "pods", labels={JOB_LABEL: kopf.PRESENT, ATTEMPT_LABEL: kopf.PRESENT})
async def attempt_pods(namespace, labels, body, **_):
    """The worker pods of every attempt, from one watch (no per-job LIST): what the start-up check
    and the scraper need, summarized."""
    return {(namespace, labels[JOB_LABEL], labels[ATTEMPT_LABEL]): pod_summary(dict(body))}


# Blocking API calls of the timers run here, never on kopf's handler pool: a slow scrape or a burst
# of timer work cannot delay a new job's PyTorchJob.
_MONITOR_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="llmtrain-monitor")
_SCRAPES: asyncio.Semaphore | None = None
_HTTP: aiohttp.ClientSession | None = None
_RANK0_IPS: dict[tuple[str, str], str] = {}


async def _in_pool(fn, *args):
    # In a copy of the handler's context: kopf.info/warn find kopf's settings through contextvars.
    ctx = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(_MONITOR_POOL, ctx.run, fn, *args)


def _pods_of(index, namespace: str, name: str, attempt: int) -> list[dict]:
    try:
        return list(index[(namespace, name, str(attempt))])
    except KeyError:
        return []


def rank0_ip(pods: list[dict]) -> str | None:
    """IP of the attempt's first worker pod (replica index 0), where local rank 0 serves metrics."""
    for pod in sorted(pods, key=lambda p: (p.get("index") or "~", p["name"])):
        if pod.get("ip"):
            return pod["ip"]
    return None


async def scrape_progress(ip: str):
    """rank 0's /metrics → Progress, or None; at most CONFIG.max_concurrent_scrapes at once, each
    bounded by CONFIG.scrape_timeout, all on the event loop (an idle connection costs no thread)."""
    global _SCRAPES, _HTTP
    if _SCRAPES is None:
        _SCRAPES = asyncio.Semaphore(CONFIG.max_concurrent_scrapes)
    if _HTTP is None or _HTTP.closed:
        _HTTP = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=CONFIG.scrape_timeout))
    url = f"http://{ip}:{CONFIG.trainer_metrics_port}/metrics"
    async with _SCRAPES:
        try:
            async with _HTTP.get(url) as resp:
                text = await resp.text()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as err:
            log.info("scrape of %s failed: %r", url, err)
            return None
    return progress_from_metrics(text)


def _active(status, **_) -> bool:
    return (status or {}).get("phase") in ("Pending", "Restarting", "Running")


# A timer with an async function: it runs on kopf's event loop, so thousands of running jobs cost
# coroutines, not threads. The interval is read when this module is imported, which __main__ does
# after applying the command line.
@kopf.timer(GROUP, VERSION, PLURAL, interval=CONFIG.progress_interval, when=_active)
async def monitor(body, namespace, name, attempt_pods: kopf.Index, **_):
    status = body.get("status") or {}
    attempt = status.get("attempt") or 1
    pods = _pods_of(attempt_pods, namespace, name, attempt)
    if status.get("phase") == "Running":
        await check_progress(dict(body), pods)
    else:
        await check_startup(dict(body), pods)


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


def _locked_restart(namespace, name, reason, message, still_applies) -> None:
    with _job_lock(namespace, name):
        restart(namespace, name, reason, message, still_applies,
                amend=forensics.stuck_amend(reason))  # nodes: names the NCCL dumps


async def check_progress(job: dict, pods: list[dict]) -> None:
    meta, status = job["metadata"], job.get("status") or {}
    namespace, name, attempt = meta["namespace"], meta["name"], status.get("attempt") or 1
    ip = rank0_ip(pods)
    progress = await scrape_progress(ip) if ip else None
    current = dict(status.get("progress") or {})
    if progress is not None:
        current.update(progress.as_status())
        current["updateTime"] = timestamp()
        await _in_pool(kube.patch_job_status, namespace, name, {"progress": current})
    heartbeat = parse_time(current.get("heartbeatTime"))
    running_since = parse_time(status.get("attemptStartTime") or status.get("startTime"))
    if heartbeat is not None and running_since is not None and heartbeat < running_since:
        heartbeat = None  # the previous attempt's heartbeat says nothing about this one
    timeout = dt.timedelta(minutes=(job["spec"].get("resilience") or {}).get("hangTimeoutMinutes", 30))
    if hung(heartbeat, running_since, timeout):
        last = heartbeat or running_since
        await _in_pool(
            _locked_restart, namespace, name, "hang",
            f"no training step completed for {(now() - last).total_seconds() / 60:.0f} min "
            f"(hangTimeoutMinutes {timeout.total_seconds() / 60:.0f})",
            lambda j: (j.get("status") or {}).get("attempt", 1) == attempt
            and (j.get("status") or {}).get("phase") == "Running")
