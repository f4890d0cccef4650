"""What a pod's container would run, run on this machine (the chain's pods are kwok's and run
nothing): the pod's own command, arguments and environment as real torchrun processes, with only
what a pod has and this machine has not replaced (tests/chain/test_goodput_chain.py's docstring
lists the replacements). Shared by the chain tests that need the real trainer behind a job."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from llmtrain_devcluster.process import free_port

REPO = Path(__file__).resolve().parents[2]
# what the training-operator adds to the pod's environment (torchrun's arguments say the same)
OPERATOR_ENV = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "PYTHONUNBUFFERED")


class PodTrainer:
    """What the pod's container would run, run here: its command, arguments and environment, with
    the loopback replacements the module's docstring lists. `events`: its structured stdout."""

    def __init__(self, pod, metrics_port: int, tmp: Path, extra_env: dict[str, str] | None = None):
        (c,) = [c for c in pod.spec.containers if c.name == "pytorch"]
        field = {"metadata.name": pod.metadata.name, "spec.nodeName": pod.spec.node_name}
        # the downward API's labels (the Job controller's JOB_COMPLETION_INDEX on a JobSet's pods)
        field.update({f"metadata.labels['{k}']": v for k, v in (pod.metadata.labels or {}).items()})
        env = {}
        for e in c.env or []:
            if e.name.startswith("PET_") or e.name in OPERATOR_ENV:
                continue
            if e.value is not None:
                env[e.name] = e.value
            elif e.value_from and e.value_from.field_ref:
                env[e.name] = field[e.value_from.field_ref.field_path]
        self.attempt = int(env["LLMTRAIN_ATTEMPT"])
        work = tmp / f"pod-{pod.metadata.name}"
        work.mkdir()
        env.update(
            LLMTRAIN_METRICS_PORT=str(metrics_port),
            LLMTRAIN_CHECKPOINT_STAGING=str(work / "staging"),
            LLMTRAIN_TERMINATION_LOG=str(work / "termination-log"),
            PYTHONUNBUFFERED="1",
            OMP_NUM_THREADS="1",
        )
        env.update(extra_env or {})  # a test's own (the test-only slow hook)
        endpoint = f"127.0.0.1:{free_port()}"
        args = [f"--rdzv-endpoint={endpoint}" if a.startswith("--rdzv-endpoint=") else a for a in c.args]
        self.rdzv_id = next(a.split("=", 1)[1] for a in args if a.startswith("--rdzv-id="))
        assert c.command[0] == "python", c.command
        self.cmd = [sys.executable, *c.command[1:], *args]
        self.stderr_path = work / "stderr.log"
        self._stderr = open(self.stderr_path, "w")
        self.proc = subprocess.Popen(
            self.cmd,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env={**os.environ, **env},
            cwd=REPO,
            start_new_session=True,
        )
        self.events: list[dict] = []
        self._lines: queue.Queue[dict | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.strip()
            if line.startswith("{"):
                e = json.loads(line)
                self.events.append(e)
                self._lines.put(e)
        self._lines.put(None)

    def wait_for(self, pred, timeout: float = 120) -> dict:
        """Block until an event satisfying `pred` arrives (fails if the trainer exits first)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                e = self._lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no such event in {timeout} s; stderr:\n{self.stderr()}") from None
            if e is None:
                raise AssertionError(f"the trainer exited ({self.proc.wait()}) first; stderr:\n{self.stderr()}")
            if pred(e):
                return e

    def worker(self, local_rank: int) -> int:
        """The pid of the worker process of `local_rank` (torchrun's LOCAL_RANK in its environment)."""
        from llmtrain_trainer.launch import children

        for torchrun in children(self.proc.pid):
            for pid in children(torchrun):
                try:
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
                except OSError:
                    continue
                if env.get(b"LOCAL_RANK") == str(local_rank).encode():
                    return pid
        raise AssertionError(f"no worker of local rank {local_rank}")

    def wait(self, timeout: float) -> int:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the trainer did not finish in {timeout} s; stderr:\n{self.stderr()}") from None
        self._reader.join(10)
        return rc

    def terminate(self, grace: float) -> int:
        """The kubelet stops the container: SIGTERM to its process (the launcher, which stops the
        workers; they save their SIGTERM checkpoint), SIGKILL of the tree after `grace` seconds."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"the trainer did not stop in {grace} s of SIGTERM; stderr:\n{self.stderr()}"
            ) from None
        self._reader.join(10)
        return rc

    def kill(self) -> None:
        """The container dies: the whole process tree, at once."""
        from llmtrain_trainer.launch import kill_tree

        # the launcher, torchrun (in a session of its own) and the workers (each in theirs)
        kill_tree(self.proc)
        self.proc.wait()
        self._reader.join(10)
        self._stderr.close()

    def stderr(self) -> str:
        self._stderr.flush()
        return self.stderr_path.read_text()[-6000:]

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e.get("event") == kind]
