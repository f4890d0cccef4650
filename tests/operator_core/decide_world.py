"""Snapshots for decide() built by hand, without a cluster: a job (wire spec and status), its
children (PyTorchJobs by default; JobSets with `jobset` and backend="jobset"), pods, pod failures,
Ready nodes and the monitor's latest scrape."""

from __future__ import annotations

import datetime as dt

from llmtrain import backends
from llmtrain.controller.adapters.observe import child_of
from llmtrain.controller.policy.config import OperatorConfig
from llmtrain.controller.policy.decide import SPEC_HASH, decide, spec_hash
from llmtrain.controller.policy.progress import timestamp
from llmtrain.controller.policy.snapshot import Observed
from llmtrain.pod_contract import PREFLIGHT_EXIT_CODE
from llmtrain.render import ATTEMPT_LABEL, JOB_LABEL
from llmtrain.status import parse
from llmtrain.validation import InvalidJob, validate

NOW = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
UID = "0123456789abcdef"
ETCD = "etcd.test.svc:2379"
CFG = OperatorConfig(default_etcd_endpoint=ETCD, progress_interval=30.0)


def ago(**kw) -> str:
    return timestamp(NOW - dt.timedelta(**kw))


def later(**kw) -> str:
    return timestamp(NOW + dt.timedelta(**kw))


def tiny(**sections) -> dict:
    spec = {"model": {"preset": "tiny"}, "cluster": {"instanceType": "cpu", "nodes": 1}, "training": {"maxSteps": 20}}
    spec.update(sections)
    return spec


def gpu(nodes: int = 2, **sections) -> dict:
    return tiny(cluster={"instanceType": "p5.48xlarge", "nodes": nodes}, **sections)


def ptj(
    attempt: int,
    state: str | None = None,
    *,
    owned: bool = True,
    deleting: bool = False,
    message: str = "",
    raw_spec: dict | None = None,
    name: str = "j",
    suspended: bool = False,
) -> dict:
    meta = {
        "name": f"{name}-a{attempt}",
        "namespace": "ns",
        "resourceVersion": "7",
        "labels": {JOB_LABEL: name, ATTEMPT_LABEL: str(attempt)},
        "ownerReferences": [{"uid": UID if owned else "someone-else"}],
        "annotations": {SPEC_HASH: spec_hash(raw_spec if raw_spec is not None else tiny())},
    }
    if deleting:
        meta["deletionTimestamp"] = ago(seconds=1)
    conds = []
    if state is not None:
        conds = [{"type": "Created", "status": "True", "lastTransitionTime": ago(minutes=10)}]
        if state != "Created":
            conds.append({"type": state, "status": "True", "lastTransitionTime": ago(minutes=5), "message": message})
    spec: dict = {"elasticPolicy": {"rdzvId": f"ns-j-01234567-a{attempt}"}}
    if suspended:  # as Kueue leaves a PyTorchJob it has not admitted (or took back)
        spec["runPolicy"] = {"suspend": True}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": meta,
        "spec": spec,
        "status": {"conditions": conds},
    }


def jobset(
    attempt: int,
    state: str | None = None,
    *,
    owned: bool = True,
    deleting: bool = False,
    message: str = "",
    raw_spec: dict | None = None,
    name: str = "j",
    suspended: bool = False,
) -> dict:
    """A JobSet of attempt `attempt` as JobSet v0.12.0's controller leaves it in `state` (a state of
    decide's vocabulary): Running is every Job ready (status.replicatedJobsStatus), Succeeded the
    Completed condition, Failed the Failed condition (maxRestarts 0), Suspended spec.suspend."""
    obj = ptj(attempt, None, owned=owned, deleting=deleting, raw_spec=raw_spec, name=name)
    obj["apiVersion"], obj["kind"] = "jobset.x-k8s.io/v1alpha2", "JobSet"
    obj["metadata"]["annotations"]["llmtrain.dev/rendezvous-id"] = f"ns-j-01234567-a{attempt}"
    obj["spec"] = {"replicatedJobs": [{"name": "worker", "replicas": 1}]}
    if suspended:
        obj["spec"]["suspend"] = True
    obj["status"] = jobset_status(state, message)
    return obj


def jobset_status(state: str | None, message: str = "", at: str | None = None) -> dict:
    at = at or ago(minutes=5)
    counts = {"name": "worker", "ready": 0, "succeeded": 0, "failed": 0, "active": 1, "suspended": 0}
    conds: list[dict] = []
    if state == "Running":
        counts["ready"] = 1
    elif state == "Succeeded":
        counts.update(succeeded=1, active=0)
        conds.append({"type": "Completed", "status": "True", "reason": "AllJobsCompleted", "lastTransitionTime": at})
    elif state == "Failed":
        counts.update(failed=1, active=0)
        conds.append(
            {
                "type": "Failed",
                "status": "True",
                "reason": "ReachedMaxRestarts",
                "message": message or "jobset failed due to reaching max number of restarts",
                "lastTransitionTime": at,
            }
        )
    return {"conditions": conds, "replicatedJobsStatus": [counts] if state is not None else [], "restarts": 0}


def batch_job(
    attempt: int,
    state: str | None = None,
    *,
    owned: bool = True,
    deleting: bool = False,
    message: str = "",
    raw_spec: dict | None = None,
    name: str = "j",
    suspended: bool = False,
) -> dict:
    """The Indexed Job of attempt `attempt` (the job backend) as the Job controller leaves it in
    `state`: Running is every index ready (status.ready), Succeeded the Complete condition, Failed
    the Failed condition (backoffLimit 0), Suspended spec.suspend."""
    obj = ptj(attempt, None, owned=owned, deleting=deleting, raw_spec=raw_spec, name=name)
    obj["apiVersion"], obj["kind"] = "batch/v1", "Job"
    obj["metadata"]["annotations"]["llmtrain.dev/rendezvous-id"] = f"ns-j-01234567-a{attempt}"
    obj["spec"] = {"parallelism": 1, "completions": 1, "completionMode": "Indexed", "backoffLimit": 0}
    if suspended:
        obj["spec"]["suspend"] = True
    obj["status"] = batch_job_status(state, message)
    return obj


def batch_job_status(state: str | None, message: str = "", at: str | None = None) -> dict:
    at = at or ago(minutes=5)
    if state is None:
        return {}
    status: dict = {"active": 1, "ready": 0, "terminating": 0, "startTime": at}
    if state == "Running":
        status["ready"] = 1
    elif state == "Succeeded":
        status.update(active=0, succeeded=1)
        status["conditions"] = [
            {"type": t, "status": "True", "reason": "CompletionsReached", "lastTransitionTime": at}
            for t in ("SuccessCriteriaMet", "Complete")
        ]
    elif state == "Failed":
        status.update(active=0, failed=1)
        status["conditions"] = [
            {
                "type": t,
                "status": "True",
                "reason": "BackoffLimitExceeded",
                "message": message or "Job has reached the specified backoff limit",
                "lastTransitionTime": at,
            }
            for t in ("FailureTarget", "Failed")
        ]
    return status


# Each backend's child, as its controller leaves it (ptj's arguments): a backend without one here
# fails every test that runs on all of them, rather than escape them.
CHILDREN = {"pytorchjob": ptj, "jobset": jobset, "job": batch_job}


def child(backend: str, *args, **kw) -> dict:
    """The child object of `backend` (ptj's arguments)."""
    return CHILDREN[backend](*args, **kw)


def running(attempt: int = 1, restarts: int = 0, **status) -> dict:
    """The status of a job whose attempt `attempt` runs (since 10 minutes, steps completing)."""
    base = {
        "phase": "Running",
        "attempt": attempt,
        "restarts": restarts,
        "backend": "pytorchjob",
        "child": f"j-a{attempt}",
        "observedGeneration": 1,
        "attemptCreationTime": ago(minutes=12),
        "startTime": ago(hours=1),
        "attemptStartTime": ago(minutes=10),
        "progress": {"heartbeatTime": ago(seconds=20), "step": 50},
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Running",
                "message": "",
                "lastTransitionTime": ago(minutes=10),
            },
            {
                "type": "TrainingHealthy",
                "status": "True",
                "reason": "StepsCompleting",
                "message": "",
                "lastTransitionTime": ago(minutes=9),
            },
        ],
    }
    base.update(status)
    return base


def pending(attempt: int = 1, restarts: int = 0, **status) -> dict:
    base = {
        "phase": "Pending",
        "attempt": attempt,
        "restarts": restarts,
        "backend": "pytorchjob",
        "child": f"j-a{attempt}",
        "observedGeneration": 1,
        "attemptCreationTime": ago(minutes=1),
    }
    base.update(status)
    return base


def failure(
    node: str, reason: str = "exit 1", message: str = "", pod: str = "j-a1-worker-0", exit_code: int = 1
) -> dict:
    return {"pod": pod, "node": node, "reason": reason, "exitCode": exit_code, "message": message}


def preflight_failure(node: str, pod: str = "j-a1-worker-1") -> dict:
    import json

    verdict = {
        "event": "healthcheck",
        "healthy": False,
        "busBandwidthGBps": 12.5,
        "expectedBusBandwidthGBps": 400.0,
        "worldSize": 16,
        "suspectNodes": [{"node": 1, "host": pod, "nodeName": node}],
        "suspectRanks": {"8": ["links 1.0 GB/s below 50% of the median"]},
    }
    return failure(node, "preflight", json.dumps(verdict), pod, PREFLIGHT_EXIT_CODE)


def pod(
    name: str = "j-a1-worker-0",
    *,
    unschedulable: str | None = None,
    waiting: tuple | None = None,
    phase: str = "Pending",
    ip: str | None = None,
) -> dict:
    return {
        "name": name,
        "index": "0",
        "ip": ip,
        "phase": phase,
        "unschedulable": unschedulable,
        "waiting": [waiting] if waiting else [],
    }


_SPECS: dict = {}


def resolve(raw_spec: dict, etcd: str | None = ETCD):
    import json

    key = (json.dumps(raw_spec, sort_keys=True), etcd)
    if key not in _SPECS:
        try:
            _SPECS[key] = (validate(raw_spec, "j", etcd), None)
        except InvalidJob as err:
            _SPECS[key] = (None, str(err))
    return _SPECS[key]


def snap(
    status: dict | None = None,
    spec: dict | None = None,
    children=(),
    *,
    generation: int = 1,
    now: dt.datetime = NOW,
    backend: str = "pytorchjob",
    **facts,
) -> Observed:
    """A snapshot of job j of backend `backend` (its children that backend's objects)."""
    raw_spec = spec if spec is not None else tiny()
    resolved, error = resolve(raw_spec)
    raw_status = status or {}
    return Observed(
        namespace="ns",
        name="j",
        uid=UID,
        generation=generation,
        resource_version="42",
        raw_spec=raw_spec,
        spec=resolved,
        spec_error=error,
        raw_status=raw_status,
        status=parse(raw_status),
        now=now,
        backend=backend,
        children=tuple(child_of(c, UID, backends.get(backend)) for c in children),
        **facts,
    )


def decide_(o: Observed, cfg: OperatorConfig = CFG):
    return decide(o, cfg)
