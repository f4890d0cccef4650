"""A trainer command the benchmarks start (torchrun, or the pod's launch wrapper around it), whose
JSON event lines on stdout arrive with their monotonic arrival times through a queue."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
from pathlib import Path

from ports import metrics_port

REPO = Path(__file__).resolve().parents[1]


def trainer_env(**extra: str) -> dict[str, str]:
    """This environment plus what every bench's trainer runs with: unbuffered events, one OpenMP
    thread per rank (2 shared cores), a free base port for the ranks' /metrics."""
    return dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", LLMTRAIN_METRICS_PORT=metrics_port(), **extra)


class TrainerEvents:
    """`cmd` started in its own session from the repository root, stderr to `log`."""

    def __init__(self, cmd: list[str], env: dict[str, str], log: Path):
        self.log = open(log, "w")
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env, cwd=REPO, start_new_session=True
        )
        self.events: queue.Queue[tuple[float, dict] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.events.put((time.monotonic(), json.loads(line)))
        self.events.put(None)

    def log_tail(self, lines: int = 30) -> str:
        """The end of stderr, for an error message: the log lives in a work directory that the
        benchmark removes when it fails."""
        self.log.flush()
        text = Path(self.log.name).read_text(errors="replace").splitlines()[-lines:]
        return f"the end of {self.log.name}:\n" + "\n".join(text)

    def next_event(self, pred, timeout: float = 300) -> tuple[float, dict] | None:
        """The first event satisfying `pred`, with its arrival time (None: the command exited first)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                item = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"no such event in {timeout} s; {self.log_tail()}") from None
            if item is None or pred(item[1]):
                return item


class LaunchedPod(TrainerEvents):
    """A `llmtrain_trainer.launch` (torchrun under the pod's wrapper), as one pod runs it."""

    def rank_pid(self, local_rank: int) -> int:
        """The worker process of `local_rank` (LOCAL_RANK in its environment)."""
        from llmtrain_trainer.launch import children

        for torchrun in children(self.proc.pid):
            for pid in children(torchrun):
                try:
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        if f"LOCAL_RANK={local_rank}".encode() in f.read().split(b"\0"):
                            return pid
                except OSError:
                    continue
        raise RuntimeError(f"no worker of local rank {local_rank}")

    def stop(self) -> None:
        """SIGKILL the whole tree (torchrun starts each worker in a session of its own)."""
        from llmtrain_trainer.launch import kill_tree

        if self.proc.poll() is None:
            kill_tree(self.proc)
        self.proc.wait()
        self.log.close()
