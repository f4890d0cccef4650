"""kopf as the watch layer only: `on.event` handlers that put what they see into the Operator's
caches and queue (kopf stores nothing on our objects: no annotations, no finalizers, no
status.kopf). Every event of a job or of one of its children (each enabled backend's kind, one
watch each) queues the job, and so does a node whose watched health conditions turn False under one of its
pods (sicknodes.py); the reconciler (reconciler.py) decides on a snapshot of all of it."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf

from .. import backends
from ..render import ATTEMPT_LABEL, JOB_LABEL
from ..spec import GROUP, PLURAL, VERSION
from .adapters import nodes
from .operator import Operator
from .policy import sicknodes
from .policy.child_status import pod_summary


def register(op: Operator, registry: kopf.OperatorRegistry | None = None) -> None:
    kw: dict[str, Any] = {"registry": registry} if registry is not None else {}

    @kopf.on.event(GROUP, VERSION, PLURAL, **kw)
    async def job_event(event, body, namespace, name, status, **_):
        # async: pure bookkeeping on the event loop; the work happens on the queue's threads
        op.start_workers()
        if event["type"] == "DELETED":
            op.forget(namespace, name, (body.get("metadata") or {}).get("uid"))
            if op.retired is not None:  # its failures stay evidence (retired.py): written on a thread
                await asyncio.get_running_loop().run_in_executor(None, op.retire, dict(body))
            return
        op.phases.track(namespace, name, (status or {}).get("phase"))
        op.saw_job(namespace, name, dict(body))

    async def child_event(event, body, namespace, name, labels, **_):
        op.start_workers()
        backend = backends.of_kind(body.get("kind"))
        if backend is not None and not backend.is_child(body):
            return  # another controller's object of that kind (a JobSet's batch Job)
        if event["type"] == "DELETED" or (backend is not None and backend.taken_up(body)):
            op.pacer.taken((namespace, name))  # a slot of the paced creates freed (pacing.py)
        if event["type"] == "DELETED":
            op.attempts.drop(namespace, labels[JOB_LABEL], name, body.get("kind"))
            op.owners.forget(namespace, (body.get("metadata") or {}).get("uid") or "")
        elif not op.attempts.put(dict(body)):
            return  # the echo of our own create: the run that created it decided with it already
        key = (namespace, labels[JOB_LABEL])
        if op.queue.get(key) is not None:  # the job's own first event queues it otherwise
            op.queue.add(key)

    # Only the backends this platform installed (and has RBAC for): a watch of a kind without its
    # CRD would only wait for it.
    for name in op.config.backends:
        kind = backends.get(name).child
        kopf.on.event(kind.group, kind.version, kind.plural, labels={JOB_LABEL: kopf.PRESENT}, **kw)(child_event)

    @kopf.on.event("", "v1", "pods", labels={JOB_LABEL: kopf.PRESENT, ATTEMPT_LABEL: kopf.PRESENT}, **kw)
    async def attempt_pod_event(event, body, namespace, name, labels, **_):
        job, attempt = labels[JOB_LABEL], labels[ATTEMPT_LABEL]
        if event["type"] == "DELETED":
            op.pods.drop(namespace, job, attempt, name)
            return
        summary = pod_summary(dict(body))
        if summary["owner"]:  # a backend's pod (nodes: a failure may follow), not a hand-made one
            op.failures.saw_pod(namespace, job, attempt, summary["node"], summary["owner"])
        op.pods.put(namespace, job, attempt, name, summary)

    if op.config.node_conditions:

        @kopf.on.event("", "v1", "nodes", **kw)
        async def node_event(event, body, name, **_):
            # a node's watched conditions (sicknodes.py): a change queues the jobs with pods there
            sick = (
                () if event["type"] == "DELETED" else sicknodes.sick_conditions(dict(body), op.config.node_conditions)
            )
            if op.node_health.put(name, sick) and sick:
                for key in op.pods.jobs_on(name):
                    if op.queue.get(key) is not None:
                        op.queue.add(key)

    # the pod watch that catches failures before the pods are deleted
    nodes.register(kopf, op.config, op.failures, registry)
