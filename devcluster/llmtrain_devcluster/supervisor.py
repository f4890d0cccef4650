"""A dev cluster's components as one group of processes, kept across the processes that manage it.

Each component is recorded in ``pids.json`` the moment it is spawned, before it is ready: a ``down``
from another process (the CLI, or the next ``up`` after a crash) must find every one, the one that
never came up included. A record holds the process's start time too, so a recycled pid is never
taken for a component (:func:`.process.is_running`). The primitives (spawning, readiness polling,
bounded stopping) are :mod:`.process`'s; the cluster decides the order.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from .process import DevClusterError, is_running, pid_record, read_pids, spawn, stop_pid, wait_ready, write_pids

__all__ = ["Supervisor"]


class Supervisor:
    """The processes recorded in ``pids_file``, each logging to ``logs_dir/<name>.log``.

    ``procs`` holds the ones this object started (their ``Popen``, so stopping them also reaps
    them); the pid file holds every one, whoever started it."""

    def __init__(self, pids_file: Path, logs_dir: Path):
        self.pids_file = pids_file
        self.logs_dir = logs_dir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(
        self,
        name: str,
        argv: Sequence[Any],
        ready: Callable[[], object],
        timeout: float,
        *,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen:
        """Spawn ``name`` (log in ``logs/<name>.log``), record its pid, wait until ``ready``."""
        log = self.logs_dir / f"{name}.log"
        proc = spawn(argv, log, env=env)
        self.adopt(name, proc)
        wait_ready(name, proc, ready, timeout=timeout, log=log)
        return proc

    def adopt(self, name: str, proc: subprocess.Popen) -> None:
        """Record ``proc``, started elsewhere (etcd's own starter waits for its readiness), as ``name``."""
        self.procs[name] = proc
        write_pids(self.pids_file, {n: pid_record(p) for n, p in self.procs.items()})

    def records(self) -> dict[str, dict]:
        """What ``pids.json`` records, ``{name: {"pid": ..., "start": ...}}``."""
        return read_pids(self.pids_file)

    def states(self) -> dict[str, dict[str, Any]]:
        """``{name: {"pid": ..., "running": ...}}`` for every recorded process."""
        return {n: {"pid": r["pid"], "running": is_running(r)} for n, r in self.records().items()}

    def all_running(self, names: Iterable[str]) -> bool:
        """Exactly ``names`` are recorded, and each is still the process that was started."""
        recs = self.records()
        return set(recs) == set(names) and all(is_running(r) for r in recs.values())

    def stop(self, order: Iterable[str], term_timeout: float) -> list[str]:
        """Stop the recorded processes named in ``order``, in that order (SIGTERM, SIGKILL after
        ``term_timeout``), and forget them all; returns ``"name: why"`` for each that survived."""
        errors = []
        records = self.records()
        for name, proc in self.procs.items():
            records.setdefault(name, pid_record(proc))
        for name in order:
            rec = records.get(name)
            if not rec:
                continue
            ours = self.procs.get(name)
            if ours is not None and ours.pid != rec["pid"]:
                ours = None
            try:
                stop_pid(rec, proc=ours, term_timeout=term_timeout)
            except DevClusterError as e:
                errors.append(f"{name}: {e}")
        self.procs.clear()
        self.pids_file.unlink(missing_ok=True)
        return errors
