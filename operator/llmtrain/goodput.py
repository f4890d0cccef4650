"""Goodput: where every second of a job's wall time went, as one pure function of its timeline.

The timeline is what the job's status already stores (`status.goodput`, written by decide.py
only): one record per attempt (when its PyTorchJob was created, when it ended and why, and the
trainer's counters of its last scrape), the spans the user suspended it, and the buckets of
attempts folded away to keep the status small. Nothing here keeps a tally in memory, so an
operator restart (or `llmtrain goodput`, reading the same status) computes the same figures.

One attempt, from its PyTorchJob's creation to its end:

    created ──starting── trainStart ──steps…──── lastHeartbeat ──tail── end
                         (the trainer's loop)    (its last step)

  * queued: created → admitted, when a queue (Kueue) holds the PyTorchJob suspended;
  * starting: created (or admitted) → the trainer's training loop began (pods scheduled, image pulled,
    rendezvous, model built, checkpoint loaded); the whole attempt when the loop never began;
  * inside trainStart → lastHeartbeat: checkpoint stall (the blocking part of the saves between
    steps), data wait (steps waiting for their batch), lost work (the steps this attempt redid,
    those at or below the highest step an earlier attempt reached, at this attempt's mean step
    time) and productive (the rest);
  * in-place restarts (spec.resilience.inPlaceRestarts): torchrun replaces the failed worker
    processes inside the same pods, and each new process starts its counters from zero. The
    trainer carries the attempt's counters across its processes (trainer restarts.py: a small
    ledger on the pod's staging volume, written every step, read by the next process), so what
    the operator scrapes is always the whole attempt's, never one process's: steps, step seconds,
    checkpoint stall and data wait summed over the processes; trainStart and resumeStep the first
    process's; and two more cuts of trainStart → lastHeartbeat: restarting for the gaps between one
    process's last step and the next process's loop (the failure, its detection, stopping the other
    ranks, the new rendezvous round, the model build and the checkpoint read: inPlaceRestartSeconds)
    and lost work for the steps a process redid that an earlier process of the same attempt had
    done (inPlaceRedoneSeconds, each at its own measured time). Nothing of an earlier process can
    be dropped or counted twice by a scrape that missed it, and an operator restart changes
    nothing: the figures are the trainer's, cumulative;
  * slow: while a straggler verdict stands (status.straggler: rank 0 names a rank the others wait
    for, and the job runs `slowdown` times slower than it would without it), the share
    (1 − 1/slowdown) of the productive time over the verdict's span is the time the job lost to
    it. The record keeps what the verdict's closed spans lost (slowSeconds: (1 − 1/slowdown) ×
    their wall seconds) and the open one (slowSince, slowdown); of trainStart → lastHeartbeat,
    that weighted time over the whole is the fraction of what the other cuts leave that moves
    from productive to slow (the counters are not placed in time: the verdict's span is taken to
    hold the attempt's share of productive time). With the counters as they are, the bucket
    grows while the verdict stands and never goes down;
  * the tail, lastHeartbeat → end: hang when the attempt ended as Hang (last heartbeat →
    detection); checkpoint stall when it ended Succeeded or Suspended (the final save, exit);
    restarting otherwise (the failure → its detection).

Between attempts: restarting (one attempt's end → the next one's PyTorchJob); before the first:
queued (the job's creation → attempt 1's PyTorchJob). A span the user suspended the job is
suspended instead, and is left out of the ratio: `goodput = productive / (wall − suspended)`.
The buckets add up to the wall time by construction (each interval is cut once, every cut is
clamped to what is left).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .pod_contract import RESUME_TIERS
from .status import percent

BUCKETS = (
    "queued",
    "starting",
    "productive",
    "slow",
    "lostWork",
    "restarting",
    "hang",
    "checkpointStall",
    "dataWait",
    "suspended",
)
BADPUT = tuple(b for b in BUCKETS if b not in ("productive", "suspended"))
MAX_ATTEMPTS = 32  # attempt records kept in status; older ones are folded into `earlier`
HANG, SUCCEEDED, SUSPENDED = "Hang", "Succeeded", "Suspended"


@dataclass(frozen=True)
class Attempt:
    """One attempt on the timeline; times are Unix seconds, counters the trainer's at the last
    scrape (None: not known)."""

    attempt: int
    created: float
    end: float | None = None  # None: the current attempt, still going
    end_reason: str | None = None
    admitted: float | None = None  # a queue (Kueue) admitted its PyTorchJob; None: at creation
    train_start: float | None = None  # the trainer's loop began
    last_heartbeat: float | None = None  # its last optimizer step completed
    resume_step: int | None = None  # the step it resumed from (0: from scratch)
    resume_from: str | None = None  # from where (pod_contract.RESUME_TIERS)
    last_step: int | None = None
    steps: int | None = None  # steps it completed
    step_seconds: float | None = None  # their summed wall time
    checkpoint_blocking_seconds: float | None = None
    data_wait_seconds: float | None = None
    in_place_restarts: int | None = None  # worker processes replaced in place (rank 0's pod)
    in_place_restart_seconds: float | None = None  # last step of one process → loop of the next
    in_place_redone_steps: int | None = None  # steps a later process redid within the attempt
    in_place_redone_seconds: float | None = None  # their measured time
    # the newest complete checkpoint as the attempt last reported it (the report marks it; no bucket)
    last_checkpoint_step: int | None = None
    last_checkpoint_time: float | None = None
    # time lost to a straggler (the module's docstring: slow): the closed spans' weighted seconds,
    # and the open span's start and slowdown (None: no verdict stands)
    slow_seconds: float | None = None
    slow_since: float | None = None
    slowdown: float | None = None


@dataclass(frozen=True)
class Timeline:
    start: float  # the job's creation (or where `earlier` ends)
    attempts: tuple[Attempt, ...] = ()
    suspensions: tuple[tuple[float, float | None], ...] = ()  # (start, end or None: still)
    earlier: dict[str, float] = field(default_factory=dict)  # buckets before `start` (folded)
    earlier_high_step: int = 0  # highest step the folded attempts reached
    folded: bool = False  # `start` is where folded attempts end, not the creation


def zero() -> dict[str, float]:
    return dict.fromkeys(BUCKETS, 0.0)


def _overlap(a: float, b: float, spans: Iterable[tuple[float, float | None]], now: float) -> float:
    total = 0.0
    for s, e in spans:
        lo, hi = max(a, s), min(b, now if e is None else e)
        if hi > lo:
            total += hi - lo
    return total


def buckets(t: Timeline, now: float) -> dict[str, float]:
    """Seconds per bucket from t.start (plus t.earlier) to `now` (a finished job: its completion)."""
    out = zero()
    for k, v in t.earlier.items():
        if k in out:
            out[k] += v

    def gap(a: float, b: float, kind: str) -> None:
        """Time no attempt ran: `kind`, except where the user had suspended the job."""
        if b <= a:
            return
        held = min(b - a, _overlap(a, b, t.suspensions, now))
        out["suspended"] += held
        out[kind] += (b - a) - held

    cursor, high = t.start, t.earlier_high_step
    for i, a in enumerate(sorted(t.attempts, key=lambda a: a.attempt)):
        created = min(max(a.created, cursor), now)
        gap(cursor, created, "queued" if i == 0 and not t.folded else "restarting")
        end = min(now if a.end is None else max(a.end, created), now)
        if a.admitted is not None and created < a.admitted:  # created suspended, waiting for a queue
            admitted = min(a.admitted, end)
            out["queued"] += admitted - created
            created = admitted
        loop = a.train_start if a.train_start is not None and created <= a.train_start < end else None
        if loop is None:
            out["starting"] += end - created
        else:
            out["starting"] += loop - created
            last = a.last_heartbeat if a.last_heartbeat is not None else loop
            last = min(max(last, loop), end)
            if a.end is not None:  # the tail of an attempt that ended
                tail = end - last
                kind = {HANG: "hang", SUCCEEDED: "checkpointStall", SUSPENDED: "checkpointStall"}.get(
                    a.end_reason or "", "restarting"
                )
                out[kind] += tail
            else:  # still going: from its last scrape to now, as its steps go
                last = end
            left = last - loop
            for kind, want in (
                ("checkpointStall", a.checkpoint_blocking_seconds),
                ("dataWait", a.data_wait_seconds),
                ("lostWork", _lost(a, high)),
                ("lostWork", a.in_place_redone_seconds),
                ("restarting", a.in_place_restart_seconds),
            ):
                cut = min(max(want or 0.0, 0.0), left)
                out[kind] += cut
                left -= cut
            slow = left * _slow_share(a, loop, last, end)
            out["slow"] += slow
            out["productive"] += left - slow
        if a.last_step is not None:
            high = max(high, a.last_step)
        cursor = end
    gap(cursor, now, "restarting" if t.attempts or t.folded else "queued")
    return out


def lost_to_slowness(slowdown: float, seconds: float) -> float:
    """Wall seconds a run `slowdown` times slower than it would be loses in `seconds`."""
    return max(0.0, seconds) * (1 - 1 / slowdown) if slowdown > 1 else 0.0


def _slow_share(a: Attempt, loop: float, last: float, end: float) -> float:
    """The fraction of loop → last the straggler verdicts took (the module's docstring: slow): the
    closed spans' weighted seconds and the open span's, up to `end`, over last − loop, at most 1."""
    span = last - loop
    if span <= 0:
        return 0.0
    weighted = max(0.0, a.slow_seconds or 0.0)
    if a.slow_since is not None and a.slowdown is not None:
        lo, hi = max(a.slow_since, loop), min(end, last)
        weighted += lost_to_slowness(a.slowdown, hi - lo)
    return min(1.0, weighted / span)


def _lost(a: Attempt, high: int) -> float:
    """Seconds of the steps this attempt redid: those above its resume step up to the highest
    step any earlier attempt reached, at its mean step time less its mean data wait (a step's
    wait for its batch is dataWait, whichever step it was)."""
    if a.resume_step is None or a.last_step is None or not a.steps or not a.step_seconds:
        return 0.0
    redone = max(0, min(high, a.last_step) - a.resume_step)
    computing = max(0.0, a.step_seconds - max(a.data_wait_seconds or 0.0, 0.0))
    return min(redone, a.steps) * (computing / a.steps)


def ratio(b: dict[str, float]) -> float | None:
    """productive / (wall − suspended); None while nothing but suspension has passed."""
    denom = sum(b.values()) - b["suspended"]
    return b["productive"] / denom if denom > 0 else None


def steps_redone(t: Timeline) -> int:
    high, total = t.earlier_high_step, 0
    for a in sorted(t.attempts, key=lambda a: a.attempt):
        if a.resume_step is not None and a.last_step is not None:
            total += max(0, min(high, a.last_step) - a.resume_step)
        total += max(0, a.in_place_redone_steps or 0)
        if a.last_step is not None:
            high = max(high, a.last_step)
    return total


# --- the status form: camelCase dicts with RFC 3339 times (status.GoodputStatus) -----------------


def _t(value: Any) -> float | None:
    if not value or not isinstance(value, str):
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def stamp(t: float | None) -> str | None:
    if t is None:
        return None
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _num(d: dict, key: str) -> float | None:
    v = d.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _int(d: dict, key: str) -> int | None:
    v = _num(d, key)
    return int(v) if v is not None else None


# The trainer's counters as status.progress carries them (controller/policy/progress.py) ↔ Attempt fields.
COUNTERS = {
    "trainStartTime": "train_start",
    "heartbeatTime": "last_heartbeat",
    "resumeStep": "resume_step",
    "resumeFrom": "resume_from",
    "step": "last_step",
    "attemptSteps": "steps",
    "stepSeconds": "step_seconds",
    "checkpointBlockingSeconds": "checkpoint_blocking_seconds",
    "dataWaitSeconds": "data_wait_seconds",
    "inPlaceRestarts": "in_place_restarts",
    "inPlaceRestartSeconds": "in_place_restart_seconds",
    "inPlaceRedoneSteps": "in_place_redone_steps",
    "inPlaceRedoneSeconds": "in_place_redone_seconds",
    "lastCheckpointStep": "last_checkpoint_step",
    "lastCheckpointTime": "last_checkpoint_time",
}
# The straggler verdict's spans, as decide records them in the attempt's record (slow_began, slow_ended).
SLOW_FIELDS = {"slowSeconds": "slow_seconds", "slowSince": "slow_since", "slowdown": "slowdown"}
_INTS = ("resume_step", "last_step", "steps", "in_place_restarts", "in_place_redone_steps", "last_checkpoint_step")
_TIMES = ("trainStartTime", "heartbeatTime", "lastCheckpointTime")


def counters_of(progress: dict | None, attempt: int) -> dict:
    """The attempt's counters from status.progress (only when it is that attempt's: the monitor
    writes progress.attempt), in the record's wire form."""
    p = progress or {}
    if p.get("attempt") != attempt:
        return {}
    return {k: p[k] for k in COUNTERS if p.get(k) is not None}


def attempt_from(rec: dict, progress: dict | None = None) -> Attempt | None:
    created = _t(rec.get("createdTime"))
    n = rec.get("attempt")
    if created is None or not isinstance(n, int):
        return None
    src = {**rec, **counters_of(progress, n)} if rec.get("endTime") is None else rec
    kw: dict[str, Any] = {}
    for key, attr in COUNTERS.items():
        if key in _TIMES:
            kw[attr] = _t(src.get(key))
        elif key == "resumeFrom":
            kw[attr] = src.get(key) if src.get(key) in RESUME_TIERS else None
        elif attr in _INTS:
            kw[attr] = _int(src, key)
        else:
            kw[attr] = _num(src, key)
    slowdown = _num(rec, "slowdown")
    return Attempt(
        attempt=n,
        created=created,
        end=_t(rec.get("endTime")),
        end_reason=rec.get("endReason"),
        admitted=_t(rec.get("admittedTime")),
        slow_seconds=_num(rec, "slowSeconds"),
        slow_since=_t(rec.get("slowSince")),
        slowdown=slowdown if slowdown is not None and math.isfinite(slowdown) and slowdown >= 1 else None,
        **kw,
    )


def timeline_of(goodput: dict | None, created: float, progress: dict | None = None) -> Timeline:
    """status.goodput (+ status.progress for the current attempt's live counters) → Timeline.
    `created`: the job's metadata.creationTimestamp."""
    g = goodput or {}
    earlier = {k: float(v) for k, v in (g.get("earlier") or {}).items() if k in BUCKETS and isinstance(v, (int, float))}
    until = _t(g.get("earlierUntil"))
    attempts = tuple(
        a for a in (attempt_from(r, progress) for r in g.get("attempts") or [] if isinstance(r, dict)) if a is not None
    )
    spans = tuple(
        (s, _t(x.get("endTime")))
        for x in g.get("suspensions") or []
        if isinstance(x, dict)
        for s in [_t(x.get("startTime"))]
        if s is not None
    )
    return Timeline(
        start=until if until is not None else created,
        attempts=attempts,
        suspensions=spans,
        earlier=earlier,
        earlier_high_step=int(g.get("earlierHighStep") or 0),
        folded=until is not None,
    )


def summary(t: Timeline, now: float) -> dict:
    """The derived part of status.goodput: buckets (seconds, rounded), wall, ratio, steps redone."""
    b = buckets(t, now)
    r = ratio(b)
    return {
        "wallSeconds": round(sum(b.values()), 1),
        "ratio": round(r, 4) if r is not None else None,
        "ratioPercent": percent(r) if r is not None else None,
        "seconds": {k: round(v, 1) for k, v in b.items()},
        "stepsRedone": steps_redone(t),
        "updateTime": stamp(now),
    }


# --- the edits decide.py makes to status.goodput at a transition ---------------------------------


def opened(goodput: dict | None, attempt: int, at: float, job_created: float, keep: int = MAX_ATTEMPTS) -> dict:
    """Attempt `attempt`'s PyTorchJob was created (or adopted) at `at`; `job_created`: the job's
    metadata.creationTimestamp (for the queued time, if old records get folded)."""
    g = dict(goodput or {})
    recs = [r for r in g.get("attempts") or [] if isinstance(r, dict)]
    if any(r.get("attempt") == attempt for r in recs):
        return g
    recs.append({"attempt": attempt, "createdTime": stamp(at)})
    g["attempts"] = recs
    return fold(g, job_created, keep)


def admitted(goodput: dict | None, attempt: int, at: float) -> dict:
    """Attempt `attempt`'s PyTorchJob, created suspended for a queue, was admitted at `at`: the
    time before counts as queued, not starting."""
    g = dict(goodput or {})
    g["attempts"] = [
        {**r, "admittedTime": stamp(at)}
        if isinstance(r, dict) and r.get("attempt") == attempt and not r.get("admittedTime")
        else r
        for r in g.get("attempts") or []
    ]
    return g


def closed(goodput: dict | None, attempt: int, at: float, reason: str, progress: dict | None) -> dict:
    """Attempt `attempt` ended at `at` for `reason`: its record keeps the trainer's last counters
    (and a straggler verdict still standing ends with it)."""
    g = slow_ended(goodput, attempt, at)
    recs = []
    for r in g.get("attempts") or []:
        if isinstance(r, dict) and r.get("attempt") == attempt and r.get("endTime") is None:
            r = {**r, **counters_of(progress, attempt), "endTime": stamp(at), "endReason": reason}
        recs.append(r)
    g["attempts"] = recs
    return g


def _open_record(g: dict, attempt: int, edit) -> dict:
    """g with `edit` applied to attempt `attempt`'s record while it is open (not ended)."""
    g = dict(g)
    g["attempts"] = [
        edit(r) if isinstance(r, dict) and r.get("attempt") == attempt and r.get("endTime") is None else r
        for r in g.get("attempts") or []
    ]
    return g


def _close_span(r: dict, at: float) -> dict:
    """The record with its open straggler span (if any) ended at `at`: its lost time added to slowSeconds."""
    since, slowdown = _t(r.get("slowSince")), _num(r, "slowdown")
    r = {k: v for k, v in r.items() if k not in ("slowSince", "slowdown")}
    if since is not None and slowdown is not None and math.isfinite(slowdown):
        lost = (_num(r, "slowSeconds") or 0.0) + lost_to_slowness(slowdown, at - since)
        r["slowSeconds"] = round(lost, 3)
    return r


def slow_began(goodput: dict | None, attempt: int, at: float, slowdown: float) -> dict:
    """A straggler verdict stands on attempt `attempt` from `at`, the job `slowdown` times slower (a
    new verdict, or new figures of the standing one: its span so far is closed at its own slowdown)."""

    def edit(r: dict) -> dict:
        if _num(r, "slowdown") == slowdown and r.get("slowSince"):
            return r
        return {**_close_span(r, at), "slowSince": stamp(at), "slowdown": slowdown}

    return _open_record(dict(goodput or {}), attempt, edit)


def slow_ended(goodput: dict | None, attempt: int, at: float) -> dict:
    """Attempt `attempt`'s straggler verdict no longer stands from `at`."""
    return _open_record(dict(goodput or {}), attempt, lambda r: _close_span(r, at) if r.get("slowSince") else r)


def suspended(goodput: dict | None, at: float) -> dict:
    g = dict(goodput or {})
    spans = list(g.get("suspensions") or [])
    if not spans or spans[-1].get("endTime") is not None:
        spans.append({"startTime": stamp(at)})
    g["suspensions"] = spans[-MAX_ATTEMPTS:]
    return g


def resumed(goodput: dict | None, at: float) -> dict:
    g = dict(goodput or {})
    spans = list(g.get("suspensions") or [])
    if spans and spans[-1].get("endTime") is None:
        spans[-1] = {**spans[-1], "endTime": stamp(at)}
    g["suspensions"] = spans
    return g


def fold(g: dict, job_created: float, keep: int = MAX_ATTEMPTS) -> dict:
    """Keep the newest `keep` attempt records: the older ended ones become `earlier` buckets up
    to `earlierUntil` (the status stays bounded however often a job restarts)."""
    recs = list(g.get("attempts") or [])
    if len(recs) <= keep:
        return g
    old, recs = recs[: len(recs) - keep], recs[len(recs) - keep :]
    until = _t(old[-1].get("endTime"))
    if until is None:
        return g
    part = timeline_of({**g, "attempts": old}, job_created)
    b = buckets(part, until)
    high = max([part.earlier_high_step] + [a.last_step for a in part.attempts if a.last_step is not None])
    spans = [s for s in g.get("suspensions") or [] if (_t(s.get("endTime")) or until + 1) > until]
    return {
        **g,
        "attempts": recs,
        "earlier": {k: round(v, 3) for k, v in b.items()},
        "earlierUntil": stamp(until),
        "earlierHighStep": high,
        "suspensions": spans,
    }
