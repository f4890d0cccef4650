"""What a failed or stuck attempt leaves behind, folded into the restart that follows it.

handlers.py calls in at two points (and nowhere else):

- `on_failed`: the PyTorchJob of an attempt turned Failed. Collects the pod failures the pod watch
  caught (nodes.py), tells a failed preflight (preflight.py) from a training failure, and returns
  the restart's reason, message, whether it spends the restart budget, and an `amend` that writes
  status.badNodes / avoidNodes / preflight / flightRecorder in the restart's own conditional write.
- `stuck_amend`: a hang or start-up timeout restart names where the NCCL flight recorder dumped the
  stuck collectives (render.flight_recorder_location), and plans the nodes to avoid again against
  the nodes Ready now.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from ..catalog import instance_type
from ..render import flight_recorder_location
from ..spec import LLMTrainingJobSpec
from . import nodes, preflight
from .config import CONFIG
from .status import failure_message, timestamp

log = logging.getLogger("llmtrain.operator.forensics")

# restart reasons after which a flight recorder dump is worth reading
STUCK_REASONS = ("hang", "startup-timeout")


def _spec(job: dict) -> LLMTrainingJobSpec | None:
    try:
        return LLMTrainingJobSpec.model_validate(job["spec"])
    except Exception:  # noqa: BLE001 — an invalid spec fails elsewhere, with its own message
        return None


def flight_recorder_status(job: dict, attempt: int, reason: str) -> dict | None:
    spec = _spec(job)
    if spec is None or not instance_type(spec.cluster.instance_type).is_gpu:
        return None  # gloo on CPU has no flight recorder
    where, persistent = flight_recorder_location(spec, attempt)
    return {"attempt": attempt, "reason": reason, "path": f"{where}/rank_<rank>",
            "persistent": persistent,
            "note": ("beside the checkpoints" if persistent else
                     "on each pod's node-local staging volume: gone with the pod; the PyTorchJob of a "
                     "hung attempt is deleted at the restart")}


def stuck_amend(reason: str):
    """amend() for a hang/start-up-timeout restart: status.flightRecorder names the dumps, and the
    nodes to avoid are planned again against the nodes Ready now (an attempt that could not start
    because too few nodes were left outside avoidNodes gets them back)."""
    def amend(job: dict, update: dict) -> dict:
        status = job.get("status") or {}
        attempt = status.get("attempt") or 1
        fr = flight_recorder_status(job, attempt, reason) if reason in STUCK_REASONS else None
        if fr is not None:
            update["flightRecorder"] = fr
            update["message"] = f"{update['message']}; NCCL flight recorder dumps: {fr['path']}"
        spec = _spec(job)
        if update.get("phase") == "Restarting" and status.get("badNodes") and spec is not None:
            inst = instance_type(spec.cluster.instance_type)
            avoid, why = nodes.plan_avoidance(status["badNodes"], nodes.ready_nodes(inst.name, inst.is_gpu),
                                              spec.cluster.nodes)
            update["avoidNodes"] = avoid
            if why:
                update["message"] += f"; {why}"
        return update
    return amend


@dataclass
class FailedAttempt:
    reason: str
    message: str
    spend: bool
    blamed: list[dict]
    verdict: dict | None
    decided: dict = field(default_factory=dict)
    amend: object = None


def on_failed(namespace: str, name: str, ptj: dict, attempt: int, job: dict) -> FailedAttempt:
    """The restart that attempt `attempt`'s failure calls for (see the module docstring)."""
    started = time.monotonic()
    # Only the pods of this attempt's own PyTorchJob: anyone can label a pod like a worker.
    seen = nodes.wait_for_failures(namespace, name, attempt, owner=ptj["metadata"].get("uid") or "")
    log.info("%s/%s attempt %s failed: %d pod failure(s) known after %.2f s", namespace, name, attempt,
             len(seen), time.monotonic() - started)
    ignored: list[str] = []
    verdict = preflight.preflight_verdict(seen, ignored)
    if verdict is not None:
        # The verdict is the tenant's text: it may only blame nodes this attempt's pods ran on.
        ran = {f["node"] for f in seen} | nodes.attempt_nodes(namespace, name, attempt, ptj["metadata"].get("uid") or "")
        blamed = preflight.suspect_failures(verdict, seen, ran)
        reason = "preflight-failed"
        message = preflight.message(verdict, [b["node"] for b in blamed])
        done = (job.get("status") or {}).get("preflightFailures") or 0
        spend = done >= preflight.MAX_FREE_RETRIES
    else:
        blamed, reason, spend = nodes.culprits(seen), "failed", True
        message = failure_message(ptj)
        if seen:
            message += "; " + ", ".join(f"pod {f['pod']} on node {f['node']}: {f['reason']}" for f in seen[:3])
    if ignored:  # said in the restart's Warning event and status.message, never raised
        message += f"; preflight verdict ignored ({ignored[0]})"
        log.warning("%s/%s attempt %s: malformed preflight verdict ignored: %s", namespace, name, attempt, ignored[0])
    spec = _spec(job)
    ready, needed = None, 0
    if spec is not None and (blamed or (job.get("status") or {}).get("badNodes")):
        inst = instance_type(spec.cluster.instance_type)
        ready, needed = nodes.ready_nodes(inst.name, inst.is_gpu), spec.cluster.nodes
    collective_timeout = any(nodes.is_collective_timeout(f.get("message")) for f in seen) or \
        nodes.is_collective_timeout(failure_message(ptj))
    out = FailedAttempt(reason, message, spend, blamed, verdict)

    def amend(j: dict, update: dict) -> dict:
        status = j.get("status") or {}
        when = timestamp()
        bad = nodes.record(status.get("badNodes") or [], blamed, attempt, when)
        if bad:
            update["badNodes"] = bad
        if verdict is not None:
            update["preflight"] = preflight.summary(verdict, attempt, when, [b["node"] for b in blamed])
            update["preflightFailures"] = (status.get("preflightFailures") or 0) + 1
        if collective_timeout:
            fr = flight_recorder_status(j, attempt, "collective-timeout")
            if fr is not None:
                update["flightRecorder"] = fr
                update["message"] += f"; NCCL flight recorder dumps: {fr['path']}"
        if update.get("phase") == "Restarting":
            avoid, why = nodes.plan_avoidance(bad, ready, needed)
            update["avoidNodes"] = avoid
            if why:
                update["message"] += f"; {why}"
            out.decided["avoid"] = avoid
        return update

    out.amend = amend
    return out


def after_restart(namespace: str, name: str, failed: FailedAttempt, job: dict) -> None:
    """Side effects once the restart is written: the preflight gauge, and (opt-in) suspect taints on
    the nodes the new attempt avoids."""
    from .handlers import METRICS  # handlers imports this module

    if failed.verdict is not None and failed.verdict.get("busBandwidthGBps") is not None:
        METRICS.preflight_busbw.labels(namespace, name).set(failed.verdict["busBandwidthGBps"])
    for b in failed.blamed:
        METRICS.bad_nodes.labels(b["reason"].split(":")[0]).inc()
    avoid = failed.decided.get("avoid") or []
    spec = _spec(job)
    if CONFIG.suspect_taint_fraction > 0 and avoid and spec is not None:
        inst = instance_type(spec.cluster.instance_type)
        tainted = nodes.taint_nodes([b for b in failed.blamed if b["node"] in avoid], inst.name, inst.is_gpu,
                                    CONFIG.suspect_taint_fraction, namespace, name,
                                    CONFIG.suspect_taint_max_per_namespace, CONFIG.suspect_taint_ttl)
        if tainted:
            log.warning("tainted %s %s=...:NoSchedule (job %s/%s)", ", ".join(tainted),
                        nodes.SUSPECT_TAINT, namespace, name)
