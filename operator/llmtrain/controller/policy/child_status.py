"""Pure status logic: a child's state → our phase, conditions lists, worker pods, trainer progress.

No API calls here, so every rule is unit-testable.
"""

from __future__ import annotations

import datetime as dt

from ...backends import BACKENDS
from ...final_summary import from_pod as final_summary
from ...status import Phase
from .progress import Progress, parse_progress, timestamp

# A child's state (llmtrain.backends.base.STATES, each backend's `state` maps its own to them) →
# the job's phase while the attempt runs.
PHASE_OF = {
    "Created": Phase.PENDING,
    "Suspended": Phase.PENDING,
    "Running": Phase.RUNNING,
    "Restarting": Phase.RESTARTING,
    "Succeeded": Phase.SUCCEEDED,
    "Failed": Phase.FAILED,
}


def parse_time(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


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
    "ErrImageNeverPull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "CrashLoopBackOff",
    "RunContainerError",
)

# ...of which those about the image: every new attempt would wait for the same one
IMAGE_WAITING = frozenset({"ImagePullBackOff", "ErrImagePull", "ErrImageNeverPull", "InvalidImageName"})


# The controllers of worker pods, one per backend (a PyTorchJob; a JobSet's batch Job), and the
# labels that give a pod's index (rank 0's pod is index "0").
POD_CONTROLLERS = frozenset(b.pod_controller for b in BACKENDS.values())
RANK_LABELS = tuple(dict.fromkeys(b.rank_label for b in BACKENDS.values()))


def owner_uid(pod: dict) -> str | None:
    """uid of the object that controls `pod` if it is a backend's pod controller (the
    training-operator's PyTorchJob, a JobSet's Job), or None: labels alone say nothing, any tenant
    can set them on a pod of their own. Whether that controller is the attempt's own is checked
    where the pods are read (controller/adapters/owners.py)."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if (ref.get("apiVersion"), ref.get("kind")) in POD_CONTROLLERS and ref.get("controller"):
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
    labels = meta.get("labels") or {}
    return {
        "name": meta.get("name"),
        "index": next((labels[k] for k in RANK_LABELS if k in labels), None),
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
