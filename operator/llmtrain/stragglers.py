"""Straggler scores: which rank makes the others wait, by how much it slows the job, and the series
rank 0 exports them in. Pure: the trainer's rank 0 computes the scores (`scores`), the operator
reads them back from rank 0's /metrics (`parse`, hostile input) and judges them (`verdict`).

What each rank measures, summed over a window of steps (the same steps on every rank):

    c_i  compute: the time rank i spends on its own work (forward, backward, optimizer)
    w_i  wait:    the time rank i spends blocked in collectives

In a synchronous data-parallel step (FSDP, DDP) every collective completes only when the last rank
has arrived, so over a step every rank spends the same wall time T, and a rank waits for the
slowest one:

    T  =  c_i + w_i                      for every rank i          (1)
    w_i  =  (c_max − c_i) + x                                      (2)

x is the transfer itself, the same for every rank. The rank with the largest compute waits least;
every other rank waits for it.

**Score.** Rank i's score is its compute against the median of the others:

    s_i  =  c_i / m_i,     m_i = median of c_j over j ≠ i

A victim's wait is in w, not in c: its compute is its own, so s ≈ 1 however long it waited. Only
the rank whose own work is slow scores above 1. The median (not the mean) keeps one slow rank from
raising the reference it is measured against. Leaving rank i out keeps a 2-rank job meaningful:
with ranks at 2 s and 1 s, the slow one scores 2 and the other 0.5 (the median of both, 1.5,
would give 1.33 and 0.67). With one rank there is no reference: s = 1.

**Slowdown.** What rank i costs the job: without its excess e_i = c_i − m_i, (1) and (2) give a
step of T − e_i. The evidence that the others did wait for it is in their waits: by (2), for a
rank j at the median, w_j − w_i = c_i − c_j = e_i. So the time the job lost to rank i is taken as

    l_i  =  min(e_i, d_i),    d_i = (median of w_j over j ≠ i) − w_i,    clipped to [0, T)

and the job runs at

    slowdown_i  =  T / (T − l_i)                                   (3)

times the speed it would without it (T: the median over ranks of c_j + w_j, robust to one rank's
clock). A rank whose compute grew but that nobody waited for (work overlapped with others'
transfers) has d_i ≈ 0: slowdown 1, nothing to win by moving it. The operator (controller/
stragglers.py) acts on s (the spec's threshold) and weighs a replacement with (3): a restart away
from the rank's node saves about remaining × (1 − 1/slowdown).

**Cardinality.** Rank 0 exports the TOP_RANKS highest scores only, each with its rank and node,
a job of 1,000 ranks exports 8 series of each, not 1,000.
On these two series `rank` is the scored rank (every other trainer series is labelled with the
rank that exports it); `llmtrain_job` is there too.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

TOP_RANKS = 8  # ranks exported per window (the highest scores)
SCORE = "llmtrain_trainer_straggler_score"  # {rank, node}: s_i
SLOWDOWN = "llmtrain_trainer_straggler_slowdown"  # {rank, node}: (3)
MIN_SLOWDOWN = 1.02  # below this the job loses < 2 %: within step-to-step noise, never a verdict
MAX_FIGURE = 1000.0  # a score or slowdown above this is not a measurement (hostile or broken)


@dataclass(frozen=True)
class RankTiming:
    """One rank's window: seconds of compute and of collective wait, summed over the same steps."""

    rank: int
    node: str
    compute: float
    wait: float


@dataclass(frozen=True)
class RankScore:
    rank: int
    node: str
    score: float  # s_i: compute against the others' median
    slowdown: float  # (3): the job's step time over what it would be without this rank's excess


def _median(values: Sequence[float]) -> float:
    n = len(values)
    s = sorted(values)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _medians_without_each(values: Sequence[float]) -> list[float]:
    """For each i, the median of values with values[i] left out (n ≥ 2): one sort, O(n log n)."""
    n = len(values)
    order = sorted(range(n), key=lambda i: values[i])
    s = [values[i] for i in order]
    pos = {i: p for p, i in enumerate(order)}

    def at(k: int, p: int) -> float:  # k-th smallest of s without position p
        return s[k] if k < p else s[k + 1]

    out = []
    for i in range(n):
        p, m = pos[i], n - 1
        out.append(at(m // 2, p) if m % 2 else (at(m // 2 - 1, p) + at(m // 2, p)) / 2)
    return out


def scores(timings: Sequence[RankTiming]) -> list[RankScore]:
    """Every rank's score and slowdown (the module's docstring), in rank order."""
    if not timings:
        return []
    if len(timings) == 1:
        t = timings[0]
        return [RankScore(t.rank, t.node, 1.0, 1.0)]
    compute = [max(0.0, t.compute) for t in timings]
    wait = [max(0.0, t.wait) for t in timings]
    step = _median([c + w for c, w in zip(compute, wait, strict=True)])
    m = _medians_without_each(compute)
    mw = _medians_without_each(wait)
    out = []
    for i, t in enumerate(timings):
        score = compute[i] / m[i] if m[i] > 0 else 1.0
        lost = min(compute[i] - m[i], mw[i] - wait[i])
        lost = min(max(0.0, lost), step * (1 - 1 / MAX_FIGURE)) if step > 0 else 0.0
        slowdown = step / (step - lost) if step > 0 else 1.0
        out.append(RankScore(t.rank, t.node, min(score, MAX_FIGURE), min(slowdown, MAX_FIGURE)))
    return sorted(out, key=lambda r: r.rank)


def top(ranked: Sequence[RankScore], k: int = TOP_RANKS) -> list[RankScore]:
    """The k highest scores (ties: the lower rank), what rank 0 exports."""
    return sorted(ranked, key=lambda r: (-r.score, r.rank))[:k]


def verdict(ranked: Sequence[RankScore], threshold: float) -> RankScore | None:
    """The straggler: the highest-scoring rank at or above `threshold` that measurably slows the job
    (slowdown ≥ MIN_SLOWDOWN); None when no rank is one."""
    for r in top(ranked, len(ranked)):
        if r.score < threshold:
            return None
        if r.slowdown >= MIN_SLOWDOWN:
            return r
    return None


# --- reading them back (the operator: rank 0's /metrics is the tenant's, so bounded) ---------------

MAX_BODY_BYTES = 256 * 1024  # as progress.py reads the same body
MAX_LINES = 4 * TOP_RANKS  # straggler sample lines looked at; more are ignored unread
MAX_RANK = 1 << 20
# a node name: a DNS-1123 subdomain (what Kubernetes accepts as a Node's name)
NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LINE = re.compile(
    rb"^(" + SCORE.encode() + rb"|" + SLOWDOWN.encode() + rb")"
    rb"(?:\{([^}\n]{0,512})\})?[ \t]+([^ \t\n]{1,64})[^\n]{0,128}$",
    re.MULTILINE,
)
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]{0,31})="([^"\\]{0,253})"')


@dataclass(frozen=True)
class Window:
    """What the operator read of rank 0's straggler series: the exported ranks, highest score first."""

    ranks: tuple[RankScore, ...] = ()


def _labels(raw: str) -> dict[str, str] | None:
    out: dict[str, str] = {}
    for part in raw.split(","):
        part = part.strip()
        if not part:
            continue
        m = _LABEL.fullmatch(part)
        if m is None or m.group(1) in out:
            return None  # escapes, quotes, duplicates: not what the trainer writes
        out[m.group(1)] = m.group(2)
    return out


def _figure(raw: bytes, low: float) -> float | None:
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) and low <= value <= MAX_FIGURE else None


def parse(body: bytes | str) -> Window:
    """The straggler series of a Prometheus text body. Bounded: the first MAX_BODY_BYTES, at most
    MAX_LINES of our lines, TOP_RANKS ranks (the first seen); labels rank and node (and the
    trainer's llmtrain_job), nothing else; a line whose rank is not a number,
    whose node is not a node name, or whose figure is not finite and in range is skipped. A rank
    counts only with both its score and its slowdown, on the same node."""
    if isinstance(body, str):
        body = body.encode()
    found: dict[int, dict] = {}
    for n, m in enumerate(_LINE.finditer(body[:MAX_BODY_BYTES])):
        if n >= MAX_LINES:
            break
        name, raw_labels, raw_value = m.group(1).decode(), (m.group(2) or b"").decode("ascii", "replace"), m.group(3)
        labels = _labels(raw_labels)
        if labels is None or not {"rank", "node"} <= set(labels) <= {"rank", "node", "llmtrain_job"}:
            continue
        rank_s, node = labels["rank"], labels["node"]
        if not rank_s.isdigit() or len(rank_s) > 7 or int(rank_s) > MAX_RANK:
            continue
        if len(node) > 253 or not NODE_NAME.match(node):
            continue
        value = _figure(raw_value, 0.0 if name == SCORE else 1.0)
        rank = int(rank_s)
        entry = found.get(rank)
        if value is None or (entry is None and len(found) >= TOP_RANKS) or (entry and entry["node"] != node):
            continue
        entry = found.setdefault(rank, {"node": node})
        entry.setdefault(name, value)
    ranks = [
        RankScore(rank, e["node"], e[SCORE], e[SLOWDOWN]) for rank, e in found.items() if SCORE in e and SLOWDOWN in e
    ]
    return Window(tuple(top(ranks)))
