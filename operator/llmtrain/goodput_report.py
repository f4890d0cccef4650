"""`llmtrain goodput JOB`: where a job's time went, from its status (and events), as a table and
as a PNG timeline of its attempts. The figures are llmtrain/goodput.py's, computed from the same
stored timeline the operator writes, so the report and `status.goodput` agree."""

from __future__ import annotations

import datetime as dt
from typing import Any

from . import goodput as gp

LABELS = {
    "queued": "queued (before admission)",
    "starting": "starting (pods → training loop)",
    "productive": "productive steps",
    "slow": "slow (lost to a straggler)",
    "lostWork": "lost work (steps redone)",
    "restarting": "restarting (failure → next attempt)",
    "hang": "hang (last step → detection)",
    "checkpointStall": "checkpoint stall",
    "dataWait": "data wait",
    "suspended": "suspended (not counted)",
}
COLORS = {
    "queued": "#bdbdbd",
    "starting": "#9ecae1",
    "productive": "#31a354",
    "slow": "#a1d99b",
    "lostWork": "#fd8d3c",
    "restarting": "#e6550d",
    "hang": "#de2d26",
    "checkpointStall": "#756bb1",
    "dataWait": "#fdd0a2",
    "suspended": "#f0f0f0",
}
CHECKPOINT_COLOR = "#756bb1"


def _created(job: dict) -> float:
    t = gp._t((job.get("metadata") or {}).get("creationTimestamp"))
    return t if t is not None else dt.datetime.now(dt.UTC).timestamp()


def report_at(job: dict, now: float | None = None) -> float:
    """The report's `now`: a finished job's completion, else the present."""
    status = job.get("status") or {}
    done = gp._t(status.get("completionTime")) if status.get("phase") in ("Succeeded", "Failed") else None
    return done if done is not None else (now if now is not None else dt.datetime.now(dt.UTC).timestamp())


def compute(job: dict, now: float | None = None) -> tuple[gp.Timeline, dict[str, float], float]:
    status = job.get("status") or {}
    t = gp.timeline_of(status.get("goodput"), _created(job), status.get("progress"))
    at = report_at(job, now)
    return t, gp.buckets(t, at), at


def _hms(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600:d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def table(job: dict, now: float | None = None, events: list[dict] | None = None) -> str:
    t, b, _ = compute(job, now)
    wall = sum(b.values())
    meta = job.get("metadata") or {}
    ratio = gp.ratio(b)
    lines = [
        f"{meta.get('namespace', '')}/{meta.get('name', '')}: goodput "
        f"{'-' if ratio is None else f'{ratio:.1%}'} over {_hms(wall)} of wall time "
        f"({len(t.attempts)} attempt record(s), {gp.steps_redone(t)} steps redone)",
        "",
        f"  {'bucket':<40} {'h:mm:ss':>10} {'share':>7}",
    ]
    for k in gp.BUCKETS:
        lines.append(f"  {LABELS[k]:<40} {_hms(b[k]):>10} {b[k] / wall if wall else 0:>7.1%}")
    lines.append(f"  {'wall time':<40} {_hms(wall):>10} {1 if wall else 0:>7.0%}")
    why = ((job.get("status") or {}).get("checkpoint") or {}).get("reason")
    if isinstance(why, str) and why:  # what the checkpoint stall is the price of (status.checkpoint)
        lines += ["", f"  checkpoint interval: {why[:300]}"]
    if t.attempts:
        lines += ["", f"  {'attempt':>7}  {'created':<20} {'ended':<20} {'why':<22} {'steps':>11}"]
        for a in sorted(t.attempts, key=lambda a: a.attempt):
            steps = f"{a.resume_step}→{a.last_step}" if a.resume_step is not None and a.last_step is not None else "-"
            lines.append(
                f"  {a.attempt:>7}  {gp.stamp(a.created) or '-':<20} {gp.stamp(a.end) or '(running)':<20} "
                f"{(a.end_reason or '-')[:22]:<22} {steps:>11}"
            )
    marks = checkpoints(job, now)
    if marks:
        known = ", ".join(f"step {'?' if step is None else step} at {gp.stamp(when)}" for when, step in marks)
        lines += ["", f"  checkpoints known: {known}"]
    if events:
        lines += ["", "  events:"]
        for e in events[-20:]:
            lines.append(
                f"    {e.get('time') or '':<20} {e.get('type') or '':<8} {e.get('reason') or '':<22} "
                f"{(e.get('message') or '')[:100]}"
            )
    return "\n".join(lines)


def spans(job: dict, now: float | None = None) -> list[tuple[int, float, float, str]]:
    """(row, start, end, bucket) for the timeline picture: row 0 the gaps between attempts, row
    N attempt N (its starting, steps and tail); the steps' stalls are in the table, not drawn."""
    t, _, at = compute(job, now)
    out: list[tuple[int, float, float, str]] = []
    cursor = t.start
    for i, a in enumerate(sorted(t.attempts, key=lambda a: a.attempt)):
        created = min(max(a.created, cursor), at)
        if created > cursor:
            out.append((0, cursor, created, "queued" if i == 0 and not t.folded else "restarting"))
        end = min(at if a.end is None else max(a.end, created), at)
        loop = a.train_start if a.train_start is not None and created <= a.train_start < end else None
        if loop is None:
            out.append((a.attempt, created, end, "starting"))
        else:
            out.append((a.attempt, created, loop, "starting"))
            last = end if a.end is None else min(max(a.last_heartbeat or loop, loop), end)
            out.append((a.attempt, loop, last, "productive"))
            if last < end:
                kind = {gp.HANG: "hang", gp.SUCCEEDED: "checkpointStall", gp.SUSPENDED: "checkpointStall"}.get(
                    a.end_reason or "", "restarting"
                )
                out.append((a.attempt, last, end, kind))
        cursor = end
    if at > cursor:
        out.append((0, cursor, at, "restarting" if t.attempts else "queued"))
    for s, e in t.suspensions:
        out.append((0, s, at if e is None else e, "suspended"))
    return out


def checkpoints(job: dict, now: float | None = None) -> list[tuple[float, int | None]]:
    """(time, step) of every checkpoint the status knows of, oldest first, within the report's
    span: the newest complete one as each ended attempt last reported it (its record) and as the
    current attempt reports it (status.progress). The trainer saves more often than that; status
    keeps no list of every save, so those in between are not known here."""
    status = job.get("status") or {}
    t, _, at = compute(job, now)
    found: dict[float, int | None] = {}
    progress = status.get("progress") or {}
    current = [(gp._t(progress.get("lastCheckpointTime")), progress.get("lastCheckpointStep"))]
    for when, step in [(a.last_checkpoint_time, a.last_checkpoint_step) for a in t.attempts] + current:
        if when is None or not t.start <= when <= at:
            continue
        step = step if isinstance(step, int) and not isinstance(step, bool) else None
        if found.get(when) is None:
            found[when] = step
    return sorted(found.items())


def figure(job: dict, now: float | None = None):
    """The attempts as a Gantt chart, every known checkpoint marked (matplotlib; the dev/report
    extra). The caller saves and closes it (`png`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    t, b, _ = compute(job, now)
    rows = spans(job, now)
    n = max([r for r, *_ in rows] + [0])
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.45 * (n + 1)))
    for row, s, e, kind in rows:
        ax.barh(
            row,
            (e - s) / 60,
            left=(s - t.start) / 60,
            color=COLORS[kind],
            edgecolor="black",
            linewidth=0.3,
            hatch="//" if kind == "suspended" else None,
        )
    marks = checkpoints(job, now)
    for when, step in marks:
        x = (when - t.start) / 60
        ax.axvline(x, color=CHECKPOINT_COLOR, linestyle="--", linewidth=1, gid="checkpoint")
        if step is not None:
            ax.annotate(
                f"ckpt {step}",
                (x, 1.0),
                xycoords=("data", "axes fraction"),
                fontsize=7,
                color=CHECKPOINT_COLOR,
                rotation=90,
                ha="right",
                va="top",
            )
    ax.set_yticks(range(n + 1), ["between"] + [f"attempt {i}" for i in range(1, n + 1)])
    ax.invert_yaxis()
    ax.set_xlabel("minutes since creation" if not t.folded else "minutes since the oldest record kept")
    meta = job.get("metadata") or {}
    r = gp.ratio(b)
    ax.set_title(f"{meta.get('name', '')}: goodput {'-' if r is None else f'{r:.1%}'}")
    used = sorted({k for *_, k in rows}, key=gp.BUCKETS.index)
    handles: list[Any] = [Patch(color=COLORS[k], label=k) for k in used]
    if marks:
        from matplotlib.lines import Line2D

        handles.append(Line2D([], [], color=CHECKPOINT_COLOR, linestyle="--", label="checkpoint"))
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.5 if n < 3 else -0.2),
        ncol=min(len(handles), 5),
        fontsize=8,
    )
    fig.tight_layout()
    return fig


def png(job: dict, path: str, now: float | None = None) -> None:
    import matplotlib.pyplot as plt

    fig = figure(job, now)
    try:
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)


def events_of(raw: list[Any]) -> list[dict]:
    """Kubernetes events (the client's objects or dicts) → {time, type, reason, message}, oldest first."""
    out = []
    for e in raw:
        get = e.get if isinstance(e, dict) else (lambda k, e=e: getattr(e, _snake(k), None))
        when = get("lastTimestamp") or get("eventTime") or get("firstTimestamp")
        out.append(
            {
                "time": when.strftime("%Y-%m-%dT%H:%M:%SZ") if isinstance(when, dt.datetime) else when,
                "type": get("type"),
                "reason": get("reason"),
                "message": get("message"),
            }
        )
    return sorted(out, key=lambda e: e["time"] or "")


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name)
