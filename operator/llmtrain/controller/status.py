"""Pure status logic: PyTorchJob conditions → our phase, conditions lists, trainer progress.

No API calls here, so every rule is unit-testable.
"""

from __future__ import annotations

import datetime as dt

from ..final_summary import from_pod as final_summary
from ..render import REPLICA_INDEX_LABEL
from ..status import Phase
from .progress import _HEALTH_STATUS, _PROGRESS_METRICS, Progress, parse_progress, timestamp  # noqa: F401 — re-exported

# Kubeflow's JobConditionType values (training-operator v1), in the order a job passes them.
PTJ_CONDITIONS = ("Created", "Suspended", "Running", "Restarting", "Succeeded", "Failed")
PHASE_OF = {
    "Created": Phase.PENDING,
    "Suspended": Phase.PENDING,
    "Running": Phase.RUNNING,
    "Restarting": Phase.RESTARTING,
    "Succeeded": Phase.SUCCEEDED,
    "Failed": Phase.FAILED,
}
TERMINAL = ("Succeeded", "Failed")  # the PyTorchJob's terminal conditions


def parse_time(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def pytorchjob_state(ptj: dict) -> str | None:
    """The PyTorchJob's current state: its terminal condition if any, else the latest True one."""
    conds = [c for c in (ptj.get("status") or {}).get("conditions") or [] if c.get("status") == "True"]
    types = {c["type"] for c in conds}
    for terminal in TERMINAL:
        if terminal in types:
            return terminal
    if not conds:
        return None
    latest = max(
        conds,
        key=lambda c: (
            c.get("lastTransitionTime") or "",
            PTJ_CONDITIONS.index(c["type"]) if c["type"] in PTJ_CONDITIONS else -1,
        ),
    )
    return latest["type"]


def failure_message(ptj: dict) -> str:
    for c in (ptj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Failed" and c.get("status") == "True":
            return c.get("message") or c.get("reason") or "the PyTorchJob failed"
    return "the PyTorchJob failed"


def set_condition(
    conditions: list[dict],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    generation: int | None,
    at: dt.datetime,
) -> list[dict]:
    """Return a new list with condition `type_` set; lastTransitionTime moves only on a change (to
    `at`: decide passes its snapshot's time, so it reads no clock)."""
    value = "True" if status else "False"
    type_, reason = getattr(type_, "value", type_), getattr(reason, "value", reason)  # enums: their wire names
    when = timestamp(at)
    out = []
    found = False
    for c in conditions or []:
        if c.get("type") == type_:
            found = True
            changed = c.get("status") != value
            c = {
                **c,
                "status": value,
                "reason": reason,
                "message": message,
                "lastTransitionTime": when if changed else c.get("lastTransitionTime", when),
            }
            if generation is not None:
                c["observedGeneration"] = generation
        out.append(c)
    if not found:
        c = {"type": type_, "status": value, "reason": reason, "message": message, "lastTransitionTime": when}
        if generation is not None:
            c["observedGeneration"] = generation
        out.append(c)
    return out


def progress_from_metrics(text: str | bytes) -> Progress:
    """Read the trainer's Prometheus exposition (one rank's endpoint) into a Progress: our own
    series only, bounded (progress.parse_progress: the body is the tenant's)."""
    return parse_progress(text)


# Container waiting reasons that mean "this pod will not start by itself".
STUCK_WAITING = (
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "CrashLoopBackOff",
    "RunContainerError",
)


PYTORCHJOB_KIND = ("kubeflow.org/v1", "PyTorchJob")


def owner_uid(pod: dict) -> str | None:
    """uid of the PyTorchJob that controls `pod` (the training-operator's controller reference),
    or None: labels alone say nothing, any tenant can set them on a pod of their own."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if (ref.get("apiVersion"), ref.get("kind")) == PYTORCHJOB_KIND and ref.get("controller"):
            return ref.get("uid")
    return None


def pod_summary(pod: dict) -> dict:
    """What the operator keeps of a worker pod: enough to find rank 0, to say why it is stuck and,
    once it ended, what the trainer's final figures were."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    unschedulable = next(
        (
            c.get("message") or c.get("reason") or "unschedulable"
            for c in status.get("conditions") or []
            if c.get("type") == "PodScheduled" and c.get("status") == "False"
        ),
        None,
    )
    waiting = [
        (c.get("name"), c["state"]["waiting"].get("reason"), c["state"]["waiting"].get("message") or "")
        for c in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or [])
        if (c.get("state") or {}).get("waiting")
    ]
    return {
        "name": meta.get("name"),
        "index": (meta.get("labels") or {}).get(REPLICA_INDEX_LABEL),
        "owner": owner_uid(pod),
        "node": (pod.get("spec") or {}).get("nodeName"),
        "ip": status.get("podIP"),
        "phase": status.get("phase"),
        "unschedulable": unschedulable,
        "waiting": waiting,
        "final": final_summary(pod),  # the trainer's final figures, once it exited 0 (ending.py)
    }


def startup_problem(pods: list[dict]) -> tuple[str, str] | None:
    """(reason, message) of the first pod that cannot start, in the pods' own words:
    ("Unschedulable", "pod x-a1-worker-0: 0/16 nodes are available: ...") or
    ("ImagePullBackOff", "pod x-a1-worker-0: container pytorch: Back-off pulling image ...")."""
    for pod in sorted(pods, key=lambda p: p.get("name") or ""):
        for container, reason, message in pod.get("waiting") or []:
            if reason in STUCK_WAITING:
                detail = f": {message}" if message else ""
                return reason, f"pod {pod['name']}: container {container}: {reason}{detail}"
        if pod.get("unschedulable") and pod.get("phase") in (None, "Pending"):
            return "Unschedulable", f"pod {pod['name']}: {pod['unschedulable']}"
    return None
