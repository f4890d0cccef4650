"""status.goodput's writes, added to the plan decide() chose (so they go out in act's one
conditional status write, and only decide writes status.goodput): an attempt's record opens when
its child is created or adopted and closes, with the trainer's last counters from
status.progress, when the attempt ends; suspend and resume mark a suspension; a straggler verdict
(slow_node's write of status.straggler: set, its slowdown changed, or cleared) opens and closes
the attempt's slow span; the derived figures
(buckets, ratio) are recomputed with every such edit and, while a job is active, at most every
`OperatorConfig.goodput_interval` seconds. The arithmetic is llmtrain/goodput.py's."""

from __future__ import annotations

from dataclasses import replace

from ... import goodput as gp
from ...status import ACTIVE, Phase
from .child_status import parse_time
from .config import OperatorConfig
from .snapshot import Observed, Plan


def job_created(o: Observed) -> float:
    return (o.creation_time or o.now).timestamp()


def progress_of(o: Observed) -> dict:
    """status.progress with the monitor's latest scrape of the current attempt over it (decide may
    judge a scrape, a hang say, before the monitor's write of it arrives), and the trainer's final
    summary over that when the attempt succeeded (ending.py)."""
    p = dict(o.raw_status.get("progress") or {})
    for latest in (o.progress, o.final):
        if latest is not None:
            if p.get("attempt") != o.attempt:
                p = {}
            p.update(latest.as_status(), attempt=o.attempt)
    return p


def derived(o: Observed, g: dict, at: float | None = None) -> dict:
    """status.goodput with its figures computed at `at` (default: the snapshot's time)."""
    t = gp.timeline_of(g, job_created(o), progress_of(o))
    return {**g, **gp.summary(t, o.now.timestamp() if at is None else at)}


def _due(o: Observed, g: dict, cfg: OperatorConfig) -> bool:
    last = parse_time(g.get("updateTime"))
    return last is None or (o.now - last).total_seconds() >= cfg.goodput_interval


def _slow(g: dict, attempt: int, now: float, straggler: dict | None) -> dict:
    """status.goodput after a write of status.straggler: the verdict stands (at its slowdown) or not."""
    if straggler is None:
        return gp.slow_ended(g, attempt, now)
    slowdown = straggler.get("slowdown")
    if straggler.get("attempt") != attempt or not isinstance(slowdown, (int, float)) or isinstance(slowdown, bool):
        return g
    return gp.slow_began(g, attempt, now, float(slowdown))


def amend(o: Observed, plan: Plan, cfg: OperatorConfig) -> Plan:
    """The plan with status.goodput's edits that its write implies (read from the plan's fields:
    its status update, `ended`, `restart`, `outcome`), or, for a `periodic` plan, the figures
    refreshed when they are due."""
    before = o.raw_status.get("goodput") or {}
    g = dict(before)
    now = o.now.timestamp()
    update = plan.status
    was = o.status.phase
    if plan.periodic:
        if was in ACTIVE and before.get("attempts") and _due(o, before, cfg):
            return replace(plan, status={**(update or {}), "goodput": derived(o, g)})
        return plan
    if update is not None:
        if not g.get("attempts") and was in ACTIVE:  # a job from before goodput: from its current attempt on
            since = parse_time(o.status.attempt_creation_time)
            if since is not None and since <= o.now:
                g = gp.opened(g, o.attempt, since.timestamp(), job_created(o))
        phase = update.get("phase")
        attempt = update.get("attempt", o.attempt)
        if "straggler" in update and was == Phase.RUNNING:
            g = _slow(g, o.attempt, now, update["straggler"])
        if was in ACTIVE and (attempt > o.attempt or phase in (Phase.FAILED, Phase.SUCCEEDED, Phase.SUSPENDED)):
            reason = plan.ended or plan.restart or update.get("reason")
            g = gp.closed(g, o.attempt, now, getattr(reason, "value", reason) or "", progress_of(o))
        if phase == Phase.SUSPENDED:
            g = gp.suspended(g, now)
        elif was == Phase.SUSPENDED and phase is not None:
            g = gp.resumed(g, now)
        if plan.outcome in ("created", "adopted") and update.get("attemptCreationTime"):
            g = gp.opened(g, int(update.get("attempt") or o.attempt), now, job_created(o))
        if update.get("admissionTime"):  # Kueue admitted the suspended child: until now it was queued
            g = gp.admitted(g, int(attempt), now)
        if g != before:
            return replace(plan, status={**update, "goodput": derived(o, g)})
    return plan
