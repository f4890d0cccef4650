"""kopf handlers: LLMTrainingJob → PyTorchJob, status, progress, restarts and hang detection.

Lifecycle of one job:
  create/resume  validate → render attempt N → create (or adopt) PyTorchJob `<job>-a<N>` → Pending
  PyTorchJob     its conditions (Created/Running/Restarting/Succeeded/Failed) → status.phase
  Failed / hang  within spec.resilience.maxRestarts: attempt N+1 with a fresh rendezvous id; the
                 trainer resumes from the newest checkpoint. Beyond it: Failed.
  per-job timer every --progress-interval: scrape rank 0's metrics → status.progress; no step
                 for spec.resilience.hangTimeoutMinutes while Running → restart (reason hang).

An invalid job is marked Failed with the validation message and an event; nothing raises out of
a handler for a bad spec, so one bad object never stops the operator serving the others.

Spec changes: the CRD makes everything but spec.resilience and spec.checkpoint.intervalMinutes/
keep immutable. Those two take effect without touching the pods: resilience is the operator's own
business and the checkpoint cadence is read by the next attempt.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import time
import urllib.request

import kopf
from kubernetes.client.exceptions import ApiException

from ..planner import plan_job
from ..render import ATTEMPT_LABEL, JOB_LABEL, pytorchjob_name, render_pytorchjob, rendezvous_id
from ..spec import GROUP, PHASES, PLURAL, VERSION, LLMTrainingJobSpec
from ..validation import InvalidJob, validate
from . import kube
from .config import CONFIG
from .metrics import OperatorMetrics
from .status import (PHASE_OF, TERMINAL, failure_message, hung, now, parse_time, progress_from_metrics,
                     pytorchjob_state, set_condition, timestamp)

METRICS = OperatorMetrics()
SPEC_HASH = "llmtrain.dev/spec-hash"
MUTABLE_SECTIONS = ("resilience", "checkpoint")
_phases: dict[tuple[str, str], str] = {}
log = logging.getLogger("llmtrain.operator")


def _track_phase(namespace: str, name: str, phase: str | None) -> None:
    if phase:
        _phases[(namespace, name)] = phase
    else:
        _phases.pop((namespace, name), None)
    for phase_name in PHASES:
        METRICS.jobs.labels(phase_name).set(sum(1 for v in _phases.values() if v == phase_name))


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
                            CONFIG.default_etcd_endpoint)
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


# --- LLMTrainingJob: create / resume -------------------------------------------------------------

@kopf.on.resume(GROUP, VERSION, PLURAL, backoff=5)
@kopf.on.create(GROUP, VERSION, PLURAL, backoff=5)
def reconcile(body, spec, status, namespace, name, uid, patch, **_):
    started = time.perf_counter()
    outcome = "error"
    try:
        outcome = _reconcile(dict(body), dict(spec), dict(status), namespace, name, uid, patch)
    finally:
        METRICS.reconciles.labels(outcome).inc()
        METRICS.reconcile_seconds.observe(time.perf_counter() - started)
        _track_phase(namespace, name, patch.status.get("phase") or (status or {}).get("phase"))


def _reconcile(body, raw_spec, status, namespace, name, uid, patch) -> str:
    if status.get("phase") in TERMINAL:
        return "unchanged"
    generation = body["metadata"].get("generation")
    try:
        spec = validate(raw_spec, name, CONFIG.default_etcd_endpoint)
    except InvalidJob as err:
        patch.status.update(_fail(body, status, "InvalidSpec", str(err)))
        kopf.warn(body, reason="InvalidSpec", message=str(err))
        return "invalid"
    attempt = status.get("attempt") or 1
    obj = _render(spec, raw_spec, body, attempt)
    ptj, created = kube.create_pytorchjob(obj)
    if not created and not _owned_by(ptj, uid):
        msg = (f"a PyTorchJob named {obj['metadata']['name']} already exists in {namespace} and "
               "is not owned by this job; delete it or rename the job")
        patch.status.update(_fail(body, status, "NameConflict", msg))
        kopf.warn(body, reason="NameConflict", message=msg)
        return "invalid"
    verb = "Created" if created else "Adopted"
    kopf.info(body, reason=verb, message=f"{verb} PyTorchJob {ptj['metadata']['name']} (attempt {attempt})")
    conds = set_condition(status.get("conditions") or [], "Validated", True, "SpecValid",
                          "the spec passed validation", generation)
    conds = set_condition(conds, "Ready", False, "Pending", "waiting for the PyTorchJob to run", generation)
    patch.status.update({
        "phase": status.get("phase") or "Pending",
        "attempt": attempt,
        "restarts": status.get("restarts") or 0,
        "pytorchJob": ptj["metadata"]["name"],
        "rendezvousId": ptj["spec"]["elasticPolicy"]["rdzvId"],
        "observedGeneration": generation,
        "plan": _plan_status(spec),
        "conditions": conds,
    })
    return "created" if created else "adopted"


# --- LLMTrainingJob: spec updates ----------------------------------------------------------------

@kopf.on.update(GROUP, VERSION, PLURAL, field="spec", backoff=5)
def spec_changed(body, old, new, status, namespace, name, patch, **_):
    generation = body["metadata"].get("generation")
    if status.get("phase") in TERMINAL:
        return
    ptj = kube.get_pytorchjob(namespace, status["pytorchJob"]) if status.get("pytorchJob") else None
    if ptj is not None and ptj["metadata"].get("annotations", {}).get(SPEC_HASH) != spec_hash(dict(new)):
        # The CRD's CEL rules normally stop this at the API server; this catches a CRD without them.
        msg = ("only spec.resilience and spec.checkpoint.intervalMinutes/keep may change while the "
               "job exists; the running attempt keeps its original spec")
        kopf.warn(body, reason="SpecChangeRejected", message=msg)
        patch.status["conditions"] = set_condition(status.get("conditions") or [], "SpecAccepted",
                                                   False, "ImmutableFieldChanged", msg, generation)
        METRICS.reconciles.labels("invalid").inc()
        return
    try:
        validate(dict(new), name, CONFIG.default_etcd_endpoint)
    except InvalidJob as err:
        kopf.warn(body, reason="SpecChangeRejected", message=str(err))
        patch.status["conditions"] = set_condition(status.get("conditions") or [], "SpecAccepted",
                                                   False, "InvalidSpec", str(err), generation)
        METRICS.reconciles.labels("invalid").inc()
        return
    patch.status["observedGeneration"] = generation
    patch.status["conditions"] = set_condition(status.get("conditions") or [], "SpecAccepted", True,
                                               "Applied", "resilience/checkpoint cadence updated", generation)
    kopf.info(body, reason="SpecUpdated", message="resilience settings apply now; checkpoint cadence "
              "applies from the next attempt")
    METRICS.reconciles.labels("updated").inc()


@kopf.on.event(GROUP, VERSION, PLURAL)
def track_phase(event, namespace, name, status, **_):
    _track_phase(namespace, name, None if event["type"] == "DELETED" else (status or {}).get("phase"))


# --- PyTorchJob → LLMTrainingJob status ------------------------------------------------------------

CONFLICT_RETRIES = 10


def patch_status_fresh(namespace: str, name: str, decide):
    """Read the job, let `decide(job)` return a status update (None: nothing to do), and apply it
    only if the job is unchanged since the read; on a conflict, read and decide again. So two
    triggers never both act on one attempt, and an unrelated write (kopf's own bookkeeping, a
    progress scrape) never makes a transition get lost. Returns (job as read, update) or None."""
    for _ in range(CONFLICT_RETRIES):
        job = kube.get_job(namespace, name)
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


@kopf.on.event("kubeflow.org", "v1", "pytorchjobs", labels={JOB_LABEL: kopf.PRESENT})
def pytorchjob_event(event, body, namespace, labels, **_):
    if event["type"] == "DELETED":
        return
    ptj, name, attempt = dict(body), labels[JOB_LABEL], labels.get(ATTEMPT_LABEL)
    state = pytorchjob_state(ptj)
    if state is None:
        return

    def live_attempt(job: dict) -> bool:  # not an older attempt's object, not a finished job
        status = job.get("status") or {}
        return (_owned_by(ptj, job["metadata"]["uid"]) and str(status.get("attempt")) == attempt
                and status.get("phase") not in TERMINAL)

    if state == "Failed":
        restart(namespace, name, "failed", failure_message(ptj), live_attempt)
        return
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

    done = patch_status_fresh(namespace, name, decide)
    if done:
        kopf.info(done[0], reason=phase, message=message)
        _track_phase(namespace, name, phase)


def restart(namespace: str, name: str, reason: str, message: str, still_applies) -> None:
    """Start the next attempt (fresh rendezvous id, resumes from the newest checkpoint), or fail the
    job when its restart budget is spent. `still_applies(job)` re-checks the trigger on every read."""

    def decide(job: dict) -> dict | None:
        if not still_applies(job):
            return None
        meta, status = job["metadata"], job.get("status") or {}
        restarts = status.get("restarts") or 0
        budget = (job["spec"].get("resilience") or {}).get("maxRestarts", 10)
        if restarts >= budget:
            return _fail(job, status, "RestartBudgetExhausted",
                         f"attempt {status.get('attempt')} {reason}: {message}; "
                         f"{restarts} of {budget} restarts used")
        attempt = (status.get("attempt") or 1) + 1
        return {"phase": "Restarting", "attempt": attempt, "restarts": restarts + 1,
                "reason": reason.capitalize(), "pytorchJob": pytorchjob_name(name, attempt),
                "rendezvousId": rendezvous_id(namespace, name, meta["uid"], attempt),
                "message": f"attempt {attempt - 1} {reason}: {message}; starting attempt {attempt} "
                           f"from the newest checkpoint",
                "conditions": set_condition(status.get("conditions") or [], "Ready", False,
                                            "Restarting", f"attempt {attempt - 1} {reason}",
                                            meta.get("generation"))}

    done = patch_status_fresh(namespace, name, decide)
    if not done:
        return
    job, update = done
    old = (job.get("status") or {}).get("pytorchJob")
    kopf.warn(job, reason=update["reason"] if update["phase"] == "Failed" else "Restarting",
              message=update["message"])
    if update["phase"] == "Failed":
        if old and reason == "hang":  # a hung attempt still holds its GPUs
            kube.delete_pytorchjob(namespace, old)
        _track_phase(namespace, name, "Failed")
        return
    METRICS.restarts.labels(namespace, name, reason).inc()
    if old:
        kube.delete_pytorchjob(namespace, old)
    ensure_pytorchjob(kube.get_job(namespace, name) or job)
    _track_phase(namespace, name, "Restarting")


def ensure_pytorchjob(job: dict) -> None:
    """Create the current attempt's PyTorchJob if it is missing (self-healing after a crash between
    the status patch and the create)."""
    status = job.get("status") or {}
    spec = validate(job["spec"], job["metadata"]["name"], CONFIG.default_etcd_endpoint)
    obj = _render(spec, job["spec"], job, status.get("attempt") or 1)
    ptj, _ = kube.create_pytorchjob(obj)
    if status.get("rendezvousId") != ptj["spec"]["elasticPolicy"]["rdzvId"]:
        kube.patch_job_status(job["metadata"]["namespace"], job["metadata"]["name"],
                              {"rendezvousId": ptj["spec"]["elasticPolicy"]["rdzvId"]})


# --- progress and hang detection ---------------------------------------------------------------------

def scrape_progress(namespace: str, name: str, attempt: int):
    ip = kube.rank0_pod_ip(namespace, name, attempt)
    if ip is None:
        return None
    url = f"http://{ip}:{CONFIG.trainer_metrics_port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=CONFIG.scrape_timeout) as resp:
            return progress_from_metrics(resp.read().decode())
    except OSError as err:
        log.info("scrape of %s failed: %s", url, err)
        return None


def _running(status, **_) -> bool:
    return (status or {}).get("phase") == "Running"


# A timer, not a daemon: sync daemons hold an executor thread each for their whole life, so enough
# running jobs would starve every other handler. The interval is read when this module is imported,
# which __main__ does after applying the command line.
@kopf.timer(GROUP, VERSION, PLURAL, interval=CONFIG.progress_interval, when=_running)
def monitor(namespace, name, **_):
    job = kube.get_job(namespace, name)
    if job is not None and (job.get("status") or {}).get("phase") == "Running":
        check_progress(job)


def check_progress(job: dict) -> None:
    meta, status = job["metadata"], job.get("status") or {}
    namespace, name, attempt = meta["namespace"], meta["name"], status.get("attempt") or 1
    progress = scrape_progress(namespace, name, attempt)
    current = dict(status.get("progress") or {})
    if progress is not None:
        current.update(progress.as_status())
        current["updateTime"] = timestamp()
        kube.patch_job_status(namespace, name, {"progress": current})
    heartbeat = parse_time(current.get("heartbeatTime"))
    running_since = parse_time(status.get("attemptStartTime") or status.get("startTime"))
    if heartbeat is not None and running_since is not None and heartbeat < running_since:
        heartbeat = None  # the previous attempt's heartbeat says nothing about this one
    timeout = dt.timedelta(minutes=(job["spec"].get("resilience") or {}).get("hangTimeoutMinutes", 30))
    if hung(heartbeat, running_since, timeout):
        last = heartbeat or running_since
        restart(namespace, name, "hang",
                f"no training step completed for {(now() - last).total_seconds() / 60:.0f} min "
                f"(hangTimeoutMinutes {timeout.total_seconds() / 60:.0f})",
                lambda j: (j.get("status") or {}).get("attempt", 1) == attempt
                and (j.get("status") or {}).get("phase") == "Running")
