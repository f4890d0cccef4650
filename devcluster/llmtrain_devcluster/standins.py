"""What Kubeflow's training-operator and the kubelet would write, for a control plane that runs
neither (the dev cluster: no nodes). The operator tests and `make demo` use these, so both stand in
for those components the same way."""

from __future__ import annotations

import time

from llmtrain.backends.pytorchjob import REPLICA_INDEX_LABEL
from llmtrain.render import ATTEMPT_LABEL, JOB_LABEL


def pytorchjob_conditions(current: list[dict], ctype: str, job: str, message: str = "") -> list[dict]:
    """The PyTorchJob's conditions after the training-operator records `ctype`: that condition True;
    Running goes False once the job succeeds or fails."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    conds = [c for c in current if c["type"] != ctype]
    if ctype in ("Succeeded", "Failed"):
        conds = [{**c, "status": "False"} if c["type"] == "Running" else c for c in conds]
    conds.append(
        {
            "type": ctype,
            "status": "True",
            "reason": f"PyTorchJob{ctype}",
            "message": message or f"PyTorchJob {job} is {ctype.lower()}.",
            "lastUpdateTime": now,
            "lastTransitionTime": now,
        }
    )
    return conds


def worker0_pod(job: str, attempt: int, image: str, owner: dict | None = None) -> dict:
    """Worker 0's pod of an attempt, labelled as the operator's renderer and Kubeflow label it, and
    with `owner` (the attempt's PyTorchJob as read from the API) as its controller, as the
    training-operator sets it: the operator only reads pods its own PyTorchJobs own. Without
    `owner` it is what a tenant could make by hand."""
    meta: dict = {
        "name": f"{job}-a{attempt}-worker-0",
        "labels": {JOB_LABEL: job, ATTEMPT_LABEL: str(attempt), REPLICA_INDEX_LABEL: "0"},
    }
    if owner is not None:
        meta["ownerReferences"] = [owned_by(owner)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": "pytorch", "image": image}]},
    }


def owned_by(ptj: dict) -> dict:
    """The controller reference the training-operator puts on the pods of PyTorchJob `ptj`."""
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "name": ptj["metadata"]["name"],
        "uid": ptj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def running_at(ip: str) -> dict:
    """The pod status a kubelet reports for a running pod at `ip` (a status-subresource patch)."""
    return {"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}}


def exited(code: int, message: str = "") -> dict:
    """The pod status a kubelet reports once the container exited with `code` (a status-subresource
    patch), with the termination message the container left, if any (the trainer's final summary
    on a clean exit, its root cause on a failure: llmtrain_trainer.launch)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    terminated = {
        "exitCode": code,
        "reason": "Completed" if code == 0 else "Error",
        "startedAt": now,
        "finishedAt": now,
    }
    if message:
        terminated["message"] = message
    return {
        "status": {
            "phase": "Succeeded" if code == 0 else "Failed",
            "containerStatuses": [
                {
                    "name": "pytorch",
                    "image": "llmtrain",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"terminated": terminated},
                }
            ],
        }
    }
