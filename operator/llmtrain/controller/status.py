"""Pure status logic: PyTorchJob conditions → our phase, conditions lists, trainer progress.

No API calls here, so every rule is unit-testable.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

from ..render import REPLICA_INDEX_LABEL

# Kubeflow's JobConditionType values (training-operator v1), in the order a job passes them.
PTJ_CONDITIONS = ("Created", "Suspended", "Running", "Restarting", "Succeeded", "Failed")
PHASE_OF = {"Created": "Pending", "Suspended": "Pending", "Running": "Running",
            "Restarting": "Restarting", "Succeeded": "Succeeded", "Failed": "Failed"}
TERMINAL = ("Succeeded", "Failed")


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def timestamp(t: dt.datetime | None = None) -> str:
    return (t or now()).strftime("%Y-%m-%dT%H:%M:%SZ")


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
    latest = max(conds, key=lambda c: (c.get("lastTransitionTime") or "", PTJ_CONDITIONS.index(c["type"])
                                       if c["type"] in PTJ_CONDITIONS else -1))
    return latest["type"]


def failure_message(ptj: dict) -> str:
    for c in (ptj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Failed" and c.get("status") == "True":
            return c.get("message") or c.get("reason") or "the PyTorchJob failed"
    return "the PyTorchJob failed"


def set_condition(conditions: list[dict], type_: str, status: bool, reason: str, message: str,
                  generation: int | None = None) -> list[dict]:
    """Return a new list with condition `type_` set; lastTransitionTime moves only on a change."""
    value = "True" if status else "False"
    out = []
    found = False
    for c in conditions or []:
        if c.get("type") == type_:
            found = True
            changed = c.get("status") != value
            c = {**c, "status": value, "reason": reason, "message": message,
                 "lastTransitionTime": timestamp() if changed else c.get("lastTransitionTime", timestamp())}
            if generation is not None:
                c["observedGeneration"] = generation
        out.append(c)
    if not found:
        c = {"type": type_, "status": value, "reason": reason, "message": message,
             "lastTransitionTime": timestamp()}
        if generation is not None:
            c["observedGeneration"] = generation
        out.append(c)
    return out


@dataclass(frozen=True)
class Progress:
    step: int | None = None
    loss: float | None = None
    tokens_per_second: float | None = None
    mfu: float | None = None
    last_checkpoint_step: int | None = None
    last_checkpoint_time: float | None = None
    heartbeat: float | None = None
    # Per-step loss facts the trainer keeps for the health rules (trainer/llmtrain_trainer/losswatch.py).
    nonfinite_loss_steps: float | None = None
    nonfinite_loss_max_steps: float | None = None
    nonfinite_loss_first_step: float | None = None
    loss_median: float | None = None
    loss_spike_step: float | None = None
    loss_spike_ratio: float | None = None
    resumed_before_step: float | None = None

    def as_status(self) -> dict:
        out: dict = {}
        for field, key in _HEALTH_STATUS.items():
            value = getattr(self, field)
            if value is not None and math.isfinite(value):
                out[key] = round(value, 4) if field in ("loss_median", "loss_spike_ratio") else int(value)
        if self.step is not None:
            out["step"] = int(self.step)
        if self.loss is not None and math.isfinite(self.loss):  # JSON has no NaN: the API server refuses it
            out["loss"] = round(self.loss, 4)
        if self.tokens_per_second is not None:
            out["tokensPerSecond"] = round(self.tokens_per_second, 1)
        if self.mfu is not None:
            out["mfu"] = round(self.mfu, 4)
        if self.last_checkpoint_step is not None:
            out["lastCheckpointStep"] = int(self.last_checkpoint_step)
        if self.last_checkpoint_time:
            out["lastCheckpointTime"] = timestamp(dt.datetime.fromtimestamp(self.last_checkpoint_time, dt.timezone.utc))
        if self.heartbeat:
            out["heartbeatTime"] = timestamp(dt.datetime.fromtimestamp(self.heartbeat, dt.timezone.utc))
        return out


_HEALTH_STATUS = {"nonfinite_loss_steps": "nonFiniteLossSteps",
                  "nonfinite_loss_max_steps": "nonFiniteLossMaxSteps",
                  "nonfinite_loss_first_step": "nonFiniteLossFirstStep",
                  "loss_median": "lossMedian", "loss_spike_step": "lossSpikeStep",
                  "loss_spike_ratio": "lossSpikeRatio", "resumed_before_step": "resumedBeforeStep"}

_PROGRESS_METRICS = {
    "llmtrain_trainer_step": "step",
    "llmtrain_trainer_loss": "loss",
    "llmtrain_trainer_tokens_per_second": "tokens_per_second",
    "llmtrain_trainer_mfu": "mfu",
    "llmtrain_trainer_last_checkpoint_step": "last_checkpoint_step",
    "llmtrain_trainer_last_checkpoint_timestamp_seconds": "last_checkpoint_time",
    "llmtrain_trainer_heartbeat_timestamp_seconds": "heartbeat",
    **{f"llmtrain_trainer_{field}": field for field in _HEALTH_STATUS},
}


def progress_from_metrics(text: str | bytes) -> Progress:
    """Read the trainer's Prometheus exposition (one rank's endpoint) into a Progress: our own
    series only, bounded (scrape.parse_progress: the body is the tenant's)."""
    from .scrape import parse_progress  # scrape imports this module

    return parse_progress(text)


# Container waiting reasons that mean "this pod will not start by itself".
STUCK_WAITING = ("ImagePullBackOff", "ErrImagePull", "InvalidImageName", "CreateContainerConfigError",
                 "CreateContainerError", "CrashLoopBackOff", "RunContainerError")


PYTORCHJOB_KIND = ("kubeflow.org/v1", "PyTorchJob")


def owner_uid(pod: dict) -> str | None:
    """uid of the PyTorchJob that controls `pod` (the training-operator's controller reference),
    or None: labels alone say nothing, any tenant can set them on a pod of their own."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if (ref.get("apiVersion"), ref.get("kind")) == PYTORCHJOB_KIND and ref.get("controller"):
            return ref.get("uid")
    return None


def pod_summary(pod: dict) -> dict:
    """What the operator keeps of a worker pod: enough to find rank 0 and to say why it is stuck."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    unschedulable = next((c.get("message") or c.get("reason") or "unschedulable"
                          for c in status.get("conditions") or []
                          if c.get("type") == "PodScheduled" and c.get("status") == "False"), None)
    waiting = [(c.get("name"), c["state"]["waiting"].get("reason"), c["state"]["waiting"].get("message") or "")
               for c in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or [])
               if (c.get("state") or {}).get("waiting")]
    return {"name": meta.get("name"), "index": (meta.get("labels") or {}).get(REPLICA_INDEX_LABEL),
            "owner": owner_uid(pod), "node": (pod.get("spec") or {}).get("nodeName"),
            "ip": status.get("podIP"), "phase": status.get("phase"),
            "unschedulable": unschedulable, "waiting": waiting}


def startup_problem(pods: list[dict]) -> tuple[str, str] | None:
    """(reason, message) of the first pod that cannot start, in the pods' own words:
    ("Unschedulable", "pod x-a1-worker-0: 0/16 nodes are available: ...") or
    ("ImagePullBackOff", "pod x-a1-worker-0: container pytorch: Back-off pulling image ...")."""
    for pod in sorted(pods, key=lambda p: p.get("name") or ""):
        for container, reason, message in pod.get("waiting") or []:
            if reason in STUCK_WAITING:
                return reason, f"pod {pod['name']}: container {container}: {reason}" + (f": {message}" if message else "")
        if pod.get("unschedulable") and pod.get("phase") in (None, "Pending"):
            return "Unschedulable", f"pod {pod['name']}: {pod['unschedulable']}"
    return None
