"""act: carry out a Plan, always in this order:

  1. create (or adopt) the attempt's child (its backend's kind); what it came to is decided on again
     (reconciler.py);
  2. one status write, conditional on the snapshot's resourceVersion (409: observe again, decide again);
  3. delete every child of this job whose attempt is below status.attempt, wherever seen, and what
     the plan names (a suspended or given-up attempt's);
  4. what the backend creates beside the live attempt's child (companions.py: the job backend's
     Service), events, suspect-node taints, metrics; schedule the monitor.

Steps 3 and 4 run only once the write (if any) applied: nothing is deleted or announced for a
transition that did not happen.
"""

from __future__ import annotations

import json
import logging
from enum import Enum
from typing import TYPE_CHECKING, Any

from kubernetes.client.exceptions import ApiException

from ... import backends
from ...catalog import instance_type
from ...spec import API_VERSION, KIND
from ...status import TERMINAL, Phase
from ..policy import accounting
from ..policy.snapshot import CreateResult, Event, Observed, Plan
from . import taints, tenancy
from .observe import attempt_of, is_kind, owned_by

if TYPE_CHECKING:
    from ..operator import Operator

log = logging.getLogger("llmtrain.operator")
CONFLICT, GONE = "conflict", "gone"


def wire(value: Any) -> Any:
    """A plan's status update as JSON: enums as their wire names."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {k: wire(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [wire(v) for v in value]
    return value


def api_message(err: ApiException) -> str:
    try:
        return json.loads(err.body).get("message") or str(err.reason)
    except (TypeError, ValueError, AttributeError):
        return f"{err.status} {err.reason}"


def create(op: Operator, o: Observed, obj: dict) -> CreateResult | None:
    """Step 1. A 409 adopts the one already there (an operator restart must never duplicate). A 404
    of the create is a kind the API server does not serve (asked again of API discovery): the
    backend's CRD is not installed, which decide fails the job on, naming it. None: held, before
    any API call, while the backend's controller is behind (pacing.py); the job is woken in turn."""
    name = obj["metadata"]["name"]
    backend = backends.get(o.backend)
    slot = (o.namespace, name)
    if backend.pace_creates and not op.pacer.admit((o.namespace, o.name), slot):
        return None
    was_created = False
    try:
        # what the attempt needs besides its child: the job's NetworkPolicy, its rendezvous credentials
        assert o.spec is not None  # attempts start only for a valid spec
        tenancy.prepare_attempt(op.config, o.spec, o.namespace, o.name, o.uid, attempt_of(obj) or o.attempt)
        child, was_created = op.kube.create_child(backend.child, obj)
    except ApiException as err:
        if err.status == 404 and not op.kube.served(backend.child):
            return CreateResult(name, "not-served", api_message(err))
        if err.status not in (400, 403, 422) and not op.rejections.final(o.namespace, o.name, o.attempt, err):
            raise  # retried with backoff (rejections.py: a 413, or a 5xx a few times, is final)
        return CreateResult(name, "rejected", api_message(err))
    finally:
        if backend.pace_creates and not was_created:
            op.pacer.taken(slot)  # nothing new for its controller to take up (a new child has no status yet)
    op.rejections.forget(o.namespace, o.name)
    op.attempts.put(child)
    if not owned_by(child, o.uid):
        return CreateResult(name, "not-owned")
    return CreateResult(name, "created" if was_created else "adopted", rendezvous_id=backend.state(child).rendezvous_id)


def write_status(op: Operator, o: Observed, update: dict) -> dict | str:
    """Step 2: the written job, or CONFLICT (someone wrote since the snapshot) or GONE."""
    try:
        written = op.kube.patch_job_status(o.namespace, o.name, wire(update), o.resource_version)
    except ApiException as err:
        if err.status == 409:
            return CONFLICT
        if err.status == 404:
            return GONE
        raise
    op.queue.observe((o.namespace, o.name), written)
    return written


def finish(op: Operator, o: Observed, plan: Plan, job: dict) -> None:
    """Steps 3 and 4, once the plan's write (if any) applied; `job` is the job as it is now."""
    status = job.get("status") or {}
    attempt = status.get("attempt") or 1
    doomed = dict.fromkeys(n for n in plan.delete if n)
    backend = backends.BACKENDS.get(o.backend)
    if backend is None:  # not a backend this operator knows (status.backend edited by hand): touch nothing
        doomed.clear()
    else:
        live = status.get("phase") not in {p.value for p in TERMINAL}
        for name, child in op.attempts.of(o.namespace, o.name).items():  # left over from a crash between two steps
            ours = is_kind(child, backend) and owned_by(child, o.uid) and not child["metadata"].get("deletionTimestamp")
            if ours and (attempt_of(child) or attempt) < attempt and name not in doomed:
                log.info("deleting %s/%s: superseded by attempt %s", o.namespace, name, attempt)
                doomed[name] = None
            elif ours and live and attempt_of(child) == attempt and name not in doomed:
                op.companions.ensure(backend, child)
    for name in doomed:
        assert backend is not None
        op.kube.delete_child(backend.child, o.namespace, name)
    for event in plan.events:
        post_event(op, o, event)
    m = op.metrics
    if plan.restart is not None and status.get("phase") == Phase.RESTARTING.value:
        m.restarts.labels(o.namespace, o.name, plan.restart.value).inc()
    if plan.preflight_busbw is not None:
        m.preflight_busbw.labels(o.namespace, o.name).set(plan.preflight_busbw)
    for b in plan.blamed:
        m.bad_nodes.labels(b["reason"].split(":")[0]).inc()
    if plan.taint and op.config.suspect_taint_fraction > 0 and o.spec is not None:
        inst = instance_type(o.spec.cluster.instance_type)
        c = op.config
        tainted = taints.taint_nodes(
            list(plan.taint),
            inst.name,
            inst.is_gpu,
            c.suspect_taint_fraction,
            o.namespace,
            o.name,
            c.suspect_taint_max_per_namespace,
            c.suspect_taint_ttl,
        )
        if tainted:
            log.warning(
                "tainted %s %s=...:NoSchedule (job %s/%s)",
                ", ".join(tainted),
                taints.SUSPECT_TAINT,
                o.namespace,
                o.name,
            )
    # A run that only waits for the watch (awaiting_watch) leaves the job's series to the run its
    # child's event brings; after an operator restart that is most jobs' first run.
    if status.get("goodput") and not plan.waiting:
        terminal = status.get("phase") in (Phase.SUCCEEDED.value, Phase.FAILED.value)
        summary = status["goodput"] if terminal else accounting.derived(o.with_(raw_status=status), status["goodput"])
        m.set_goodput(o.namespace, o.name, summary)
    if not plan.waiting and o.spec is not None:  # the straggler's series follow status.straggler
        act_after = o.spec.resilience.stragglers.duration_minutes * 60.0
        m.stragglers.set(o.namespace, o.name, status.get("straggler"), act_after)
    if plan.monitor:
        op.monitor.schedule(job)


def post_event(op: Operator, o: Observed, event: Event) -> None:
    """A Kubernetes event about the job, one POST from the worker's thread (kube.post_event:
    kopf's poster hands each event to the event loop, ~10% of its time at 1,000 creates)."""
    ref = {"apiVersion": API_VERSION, "kind": KIND, "name": o.name, "uid": o.uid, "namespace": o.namespace}
    op.kube.post_event(ref, event.warning, event.reason.value, event.message)


def drop_superseded(op: Operator, namespace: str, created: list[tuple[str, str]], status: dict | None) -> None:
    """A child this run created (backend, name) for an attempt that the job's final status (the
    last read, or our last write) does not point at (another actor started a later attempt, the
    job failed, was suspended or went away between our read and our write) must not live on
    beside the current one."""
    current = (status or {}).get("child") or (status or {}).get("pytorchJob")
    gone = status is None or status.get("phase") in (Phase.FAILED.value, Phase.SUSPENDED.value)
    for backend, name in created:
        if name != current or gone:
            log.warning("deleting %s/%s: created for an attempt that was superseded", namespace, name)
            op.kube.delete_child(backends.get(backend).child, namespace, name)
