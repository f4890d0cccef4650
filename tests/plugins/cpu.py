"""CPU seconds used by a process and every process it started, for the suite-time table.

Wall times on a shared machine move with the neighbours' load; CPU seconds barely do, so they show
what a suite costs. A test's CPU is not only its pytest process's: the clusters, torchrun, kubectl,
helm, terraform and checkov it starts run as children. :func:`tree_cpu_s` adds up

- this process (``RUSAGE_SELF``) and its reaped children (``RUSAGE_CHILDREN``, which include what
  those reaped in turn), and
- every live descendant's own and reaped-children's CPU (``/proc/<pid>/stat``), found through
  ``/proc/<pid>/task/<tid>/children``: a cluster that a session fixture keeps running for many
  tests is charged to the tests it runs during, not all at once to the test whose teardown reaps it.

A process moves from the second sum to the first when its parent reaps it, so the total only goes
up. What escapes: a descendant whose parent dies before it (re-parented away from this tree).
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    """Direct children of ``pid``, from every one of its threads (a child belongs to the thread
    that forked it)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            out.extend(int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split())
        except (OSError, ValueError):
            continue
    return out


def _stat_cpu_ticks(pid: int) -> int:
    """utime + stime + cutime + cstime of ``pid`` in clock ticks (0 once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return sum(int(f) for f in fields[11:15])  # fields 14-17 of proc(5)


def descendants_cpu_s(pid: int | None = None) -> float:
    """CPU seconds of the live descendants of ``pid`` (default: this process), with what each has
    reaped."""
    todo = _children(pid or os.getpid())
    seen: set[int] = set()
    ticks = 0
    while todo:
        child = todo.pop()
        if child in seen:
            continue
        seen.add(child)
        ticks += _stat_cpu_ticks(child)
        todo.extend(_children(child))
    return ticks / _TICK


def tree_cpu_s() -> float:
    """CPU seconds (user + system) used so far by this process and every process it started."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime + descendants_cpu_s()
