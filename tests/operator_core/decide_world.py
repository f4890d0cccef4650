"""Snapshots for decide() built by hand, without a cluster: a job (wire spec and status), its
PyTorchJobs, pods, pod failures, Ready nodes and the monitor's latest scrape."""

from __future__ import annotations

import datetime as dt

from llmtrain.controller.config import OperatorConfig
from llmtrain.controller.decide import SPEC_HASH, decide, spec_hash
from llmtrain.controller.observe import child_of
from llmtrain.controller.snapshot import Observed
from llmtrain.controller.status import timestamp
from llmtrain.render import ATTEMPT_LABEL, JOB_LABEL, PREFLIGHT_EXIT_CODE
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
    return {"metadata": meta, "spec": spec, "status": {"conditions": conds}}


def running(attempt: int = 1, restarts: int = 0, **status) -> dict:
    """The status of a job whose attempt `attempt` runs (since 10 minutes, steps completing)."""
    base = {
        "phase": "Running",
        "attempt": attempt,
        "restarts": restarts,
        "pytorchJob": f"j-a{attempt}",
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
        "pytorchJob": f"j-a{attempt}",
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
    **facts,
) -> Observed:
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
        children=tuple(child_of(c, UID) for c in children),
        **facts,
    )


def decide_(o: Observed, cfg: OperatorConfig = CFG):
    return decide(o, cfg)
