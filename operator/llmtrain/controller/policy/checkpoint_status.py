"""status.checkpoint: the checkpoint interval the current attempt uses, and why. Pure; decide writes it.

* When an attempt's child is created (`at_creation`): for a number, the spec's minutes; for
  `auto`, the interval the trainer starts with, from the job's MTBF (reliability.py: the
  instance type's node MTBF over the job's nodes) and the blocking cost it starts from (what
  the previous attempt's trainer measured, else the planner's estimate). Both go into the
  attempt's pods as environment (`render_inputs`), so the trainer computes the same τ.
* While it runs (`refreshed`, for auto): the trainer recomputes τ after each save from its
  measured blocking cost and exports it (llmtrain_trainer_checkpoint_interval_seconds and the
  inputs); the scrape's figures replace the estimate here. The trainer is the tenant's code, so
  its figures are bounded (the interval to cadence's clamp) and the MTBF in the reason is the
  operator's own.
"""

from __future__ import annotations

import math

from ... import cadence
from ...planner import checkpoint_blocking_estimate, plan_job
from .progress import Progress, timestamp
from .snapshot import Observed

MAX_BLOCKING_SECONDS = 86400.0


def _finite(value: object, hi: float) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return min(float(value), hi)
    return None


def start_blocking(o: Observed) -> tuple[float, str]:
    """(seconds, in words) of the blocking cost a new attempt starts from: the previous attempt's
    measurement when its trainer made one, else the planner's estimate."""
    prev = o.raw_status.get("checkpoint") or {}
    measured = _finite(prev.get("blockingSeconds"), MAX_BLOCKING_SECONDS)
    saves = prev.get("blockingMeasuredSaves")
    if measured is not None and isinstance(saves, int) and saves > 0 and prev.get("intervalSource") == cadence.AUTO:
        return measured, f"blocking (measured by attempt {prev.get('attempt')})"
    assert o.spec is not None  # attempts start only for a valid spec
    return checkpoint_blocking_estimate(plan_job(o.spec)), "blocking (estimated)"


def render_inputs(o: Observed) -> tuple[float, float] | None:
    """(job MTBF, blocking seconds) for the attempt's pods; None unless intervalMinutes is auto."""
    spec = o.spec
    if spec is None or not spec.checkpoint.auto or not spec.checkpoint.uri or o.node_mtbf is None:
        return None
    return o.node_mtbf.job_seconds(spec.cluster.nodes), start_blocking(o)[0]


def at_creation(o: Observed, attempt: int) -> dict | None:
    """status.checkpoint for attempt `attempt`, as its child is created (None: no checkpoints)."""
    spec = o.spec
    if spec is None or not spec.checkpoint.uri:
        return None
    fixed = spec.checkpoint.fixed_interval_seconds
    if fixed is not None:
        return {
            "attempt": attempt,
            "intervalSource": "spec",
            "intervalSeconds": int(fixed),
            "reason": f"spec.checkpoint.intervalMinutes: {spec.checkpoint.interval_minutes}",
            "updateTime": timestamp(o.now),
        }
    if o.node_mtbf is None:
        return None
    blocking, what = start_blocking(o)
    return _auto(o, attempt, blocking, 0, what, o.node_mtbf, o.node_mtbf.job_seconds(spec.cluster.nodes))


def _auto(
    o: Observed,
    attempt: int,
    blocking: float,
    saves: int,
    what: str,
    node: cadence.NodeMTBF,
    mtbf: float,
    interval: float | None = None,
) -> dict:
    assert o.spec is not None  # only a valid spec has an interval
    nodes = o.spec.cluster.nodes
    return {
        "attempt": attempt,
        "intervalSource": cadence.AUTO,
        "intervalSeconds": round(cadence.interval(blocking, mtbf) if interval is None else interval),
        "blockingSeconds": round(blocking, 3),
        "blockingMeasuredSaves": saves,
        "mtbfSeconds": round(mtbf),
        "nodeMtbfHours": round(mtbf * nodes / 3600.0, 1),
        "failures": node.failures,
        "nodeHours": round(node.node_hours, 1),
        "reason": cadence.reason(blocking, mtbf, node.words(nodes), what),
        "updateTime": timestamp(o.now),
    }


def refreshed(o: Observed) -> dict | None:
    """status.checkpoint with the trainer's latest choice (auto, the current attempt), or None when
    nothing changed: the interval (to the second) and the saves it is measured over. The MTBF is
    the one recorded when the attempt was created (its pods were rendered with it)."""
    cur = o.raw_status.get("checkpoint") or {}
    p: Progress | None = o.progress
    spec = o.spec
    if p is None or spec is None or cur.get("intervalSource") != cadence.AUTO or cur.get("attempt") != o.attempt:
        return None
    interval = _finite(p.checkpoint_interval_seconds, cadence.MAX_INTERVAL_SECONDS)
    blocking = _finite(p.checkpoint_blocking_estimate_seconds, MAX_BLOCKING_SECONDS)
    saves = _finite(p.checkpoint_blocking_measured_saves, 1e9)
    mtbf = _finite(cur.get("mtbfSeconds"), 1e12)
    if interval is None or blocking is None or saves is None or not mtbf or interval <= 0:
        return None
    interval = cadence.clamp_interval(interval)
    n = int(saves)
    if round(interval) == cur.get("intervalSeconds") and n == cur.get("blockingMeasuredSaves"):
        return None
    failures, hours = cur.get("failures"), _finite(cur.get("nodeHours"), 1e12) or 0.0
    node = cadence.node_mtbf(spec.cluster.instance_type, 0, failures if isinstance(failures, int) else 0, hours)
    what = f"blocking (measured, {n} save{'s' if n != 1 else ''})" if n else "blocking (estimated)"
    return _auto(o, o.attempt, blocking, n, what, node, mtbf, interval)
