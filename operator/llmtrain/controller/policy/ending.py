"""What a job's status says once it has ended: the trainer's final figures, and no ETA.

The monitor's last scrape of a job is up to one --progress-interval old when the job ends (the
demo's 40-step job ended `Succeeded` at step 37 with an ETA still set). So decide's write that
ends a job amends status.progress (`amend`, called by decide.py for every plan):

  * on Succeeded, the trainer's final summary (llmtrain/final_summary.py): the termination
    message each pod's local rank 0 leaves on a clean exit, read by the pod watch into the pod's
    summary (status.pod_summary, with final_summary.from_pod) and, from the current attempt's pods, into the
    snapshot when decide asks for it (`Plan.need` "final", observe.more); the step, loss, tokens/s, MFU
    and the goodput counters it holds replace the last scrape's, and close the attempt's goodput
    record (accounting.progress_of overlays them);
  * without one (an older trainer image, pods already deleted), the last scrape stays;
  * on any terminal phase (Succeeded or Failed) the ETA fields are removed.

The monitor writes status.progress only while the job is Running (kube.patch_running_progress),
so a scrape taken just before the end cannot overwrite what this wrote.
"""

from __future__ import annotations

from dataclasses import replace

from ...status import TERMINAL, Phase
from . import accounting
from .progress import _PROGRESS_METRICS, Progress, timestamp
from .snapshot import Observed, Plan

ETA_KEYS = ("estimatedRemainingSeconds", "estimatedCompletionTime")


def _index(pod: dict) -> tuple[int, str]:
    index = pod.get("index")
    return (int(index) if isinstance(index, str) and index.isdigit() else 1 << 30, pod.get("name") or "")


def summary_of(pods: list[dict]) -> Progress | None:
    """The attempt's final figures: the summary of its pod with the lowest replica index that left
    one (status.pod_summary's `final`). Every pod's are the job's (llmtrain/final_summary.py)."""
    for pod in sorted(pods, key=_index):
        final = pod.get("final")
        if final:
            return Progress(**{_PROGRESS_METRICS[name]: value for name, value in final.items()})
    return None


def ended_progress(o: Observed) -> dict:
    """status.progress as the write that ends the job leaves it: the last scrape with the final
    summary over it, if any (accounting.progress_of), without the ETA."""
    p = accounting.progress_of(o)
    if o.final is not None:
        p["updateTime"] = timestamp(o.now)
    for key in ETA_KEYS:
        p.pop(key, None)
    return p


def amend(o: Observed, plan: Plan) -> Plan:
    """The plan, with status.progress ended when its write ends the job; or a plan that first
    asks for the final summary (`need` "final") when it marks the job Succeeded."""
    update = plan.status
    if update is None or update.get("phase") is None or (o.status.phase is not None and o.status.phase.terminal):
        return plan
    phase = Phase(update["phase"])
    if phase not in TERMINAL:
        return plan
    if phase == Phase.SUCCEEDED and not o.final_read:
        return Plan(plan.situation, need="final")
    old = o.raw_status.get("progress") or {}
    new = ended_progress(o)
    changes = {k: v for k, v in new.items() if old.get(k) != v}
    changes.update({k: None for k in old if k not in new})  # merge patch: null removes the key
    if not changes:
        return plan
    return replace(plan, status={**update, "progress": changes})
