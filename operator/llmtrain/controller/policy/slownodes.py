"""Slow nodes: the straggler rank 0 reports (llmtrain/stragglers.py: its score and the job's
slowdown), judged against spec.resilience.stragglers, and what replacing its node would pay.
Pure, like decide.py: situations_nodes.slow_node acts on it.

What `replace` weighs, with the job's own measurements (all in the snapshot):

    saved  =  remaining × (1 − 1/slowdown)
    cost   =  start-up + checkpoint age

remaining is status.progress.estimatedRemainingSeconds (the ETA, at the slowed pace); a run that
goes `slowdown` times slower than it would needs remaining/slowdown without the straggler. The
start-up is what an attempt's start has cost this job so far (status.goodput's starting and
restarting seconds over its attempts; before the first goodput figures, the current attempt's own
creation-to-Running); the checkpoint age is the work since the newest checkpoint, counted as lost
although the SIGTERM save usually keeps it (a failed save must not make a replacement a loss).
Replace only when saved > cost. No ETA (training.maxSteps unknown, or no step time yet): nothing
is weighed, nothing replaced.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from ... import stragglers
from ...spec import StragglersSpec
from .child_status import parse_time

# A figure is rewritten in status only when it moves by this much (scrapes every 30 s must not
# rewrite the job for noise).
FIGURE_STEP = 0.1


@dataclass(frozen=True)
class Straggler:
    rank: int
    node: str
    score: float
    slowdown: float

    def words(self) -> str:
        return (
            f"rank {self.rank} on node {self.node} computes {self.score:.2f}× the other ranks' median; "
            f"the job runs {self.slowdown:.2f}× slower"
        )


def found(window: stragglers.Window | None, spec: StragglersSpec, nodes: frozenset[str] | None) -> Straggler | None:
    """The straggler of rank 0's window at the spec's threshold, if it runs on one of `nodes` (the
    attempt's own pods' nodes: the window is the tenant's text, and may only name those)."""
    if window is None:
        return None
    v = stragglers.verdict(window.ranks, spec.threshold)
    if v is None or nodes is None or v.node not in nodes:
        return None
    return Straggler(v.rank, v.node, v.score, v.slowdown)


def same(recorded: dict | None, s: Straggler, attempt: int) -> bool:
    """`recorded` (status.straggler) is this straggler, within FIGURE_STEP."""
    if not recorded or recorded.get("attempt") != attempt or recorded.get("node") != s.node:
        return False
    score, slow = recorded.get("score"), recorded.get("slowdown")
    return (
        isinstance(score, (int, float))
        and isinstance(slow, (int, float))
        and abs(score - s.score) < FIGURE_STEP
        and abs(slow - s.slowdown) < FIGURE_STEP
    )


def lasted(recorded: dict | None, s: Straggler, attempt: int, now: dt.datetime) -> dt.timedelta:
    """How long this node has been the straggler of this attempt (0: just found)."""
    if not recorded or recorded.get("attempt") != attempt or recorded.get("node") != s.node:
        return dt.timedelta(0)
    since = parse_time(recorded.get("since"))
    return now - since if since is not None else dt.timedelta(0)


@dataclass(frozen=True)
class Payoff:
    saved: float  # seconds
    startup: float
    checkpoint_age: float

    @property
    def cost(self) -> float:
        return self.startup + self.checkpoint_age

    @property
    def pays(self) -> bool:
        return self.saved > self.cost

    def words(self) -> str:
        return (
            f"{duration(self.saved)} saved vs {duration(self.cost)} restart "
            f"({duration(self.startup)} start-up + {duration(self.checkpoint_age)} since the newest checkpoint)"
        )


def payoff(raw_status: dict, slowdown: float, now: dt.datetime) -> Payoff | None:
    """What replacing the straggler's node would save and cost (the module's docstring); None
    without an ETA."""
    progress = raw_status.get("progress") or {}
    remaining = progress.get("estimatedRemainingSeconds")
    if not isinstance(remaining, (int, float)) or remaining <= 0:
        return None
    saved = remaining * (1 - 1 / slowdown)
    goodput = (raw_status.get("goodput") or {}).get("seconds") or {}
    attempts = max(1, int(raw_status.get("attempt") or 1))
    startup = (float(goodput.get("starting") or 0) + float(goodput.get("restarting") or 0)) / attempts
    if startup <= 0:
        created, running = (parse_time(raw_status.get(k)) for k in ("attemptCreationTime", "attemptStartTime"))
        startup = (running - created).total_seconds() if created and running and running > created else 0.0
    newest = parse_time(progress.get("lastCheckpointTime")) or parse_time(progress.get("trainStartTime"))
    newest = newest or parse_time(raw_status.get("attemptStartTime"))
    age = max(0.0, (now - newest).total_seconds()) if newest is not None else 0.0
    return Payoff(saved, startup, age)


def duration(seconds: float) -> str:
    """45 s, 6 min, 3.1 h: what an event says."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
