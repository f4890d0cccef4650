"""Fixtures for the trainer tests: real torchrun workers (gloo, CPU), real etcd, a real S3 API (moto).

- `corpus` (session): token shards prepared by `llmtrain prepare`'s code from a fixed, seeded
  text (`fixed_corpus_text`; byte-level), small shards so several files and chunks are involved.
- `base_spec()`: the tiny job every multi-process test runs; the variations the tests apply
  (strategy, activation checkpointing, checkpoint location, process count) don't change the
  numerics, so all of them are compared against one single-process reference trajectory.
- `reference` (session): that trajectory, from a plain PyTorch loop (trainer_reference.py).
- `launch()` / `Workers`: torchrun subprocesses (under `llmtrain_trainer.launch`) whose structured
  stdout is parsed as it arrives; every process started is stopped (process group SIGKILL) when the test ends.
- `etcd` (session) and `s3` (session): an etcd server with the v2 API and a moto S3 server, each on
  a free loopback port, stopped at the end.
"""

from __future__ import annotations

import copy
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from llmtrain_devcluster.process import free_port, free_port_block

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable

# Eight steps of 8 sequences × 32 tokens: enough for the loss to fall clearly, ~0.1 s per step.
STEPS = 8


def base_spec(**over) -> dict:
    spec = {
        "model": {"preset": "tiny"},
        "data": {"uri": "synthetic", "seqLen": 32},
        "cluster": {"instanceType": "cpu", "processesPerNode": 2},
        "fsdp": {"shardingStrategy": "FULL_SHARD", "mixedPrecision": "fp32", "activationCheckpointing": "none"},
        "training": {
            "maxSteps": STEPS,
            "globalBatchTokens": 256,
            "microBatchSize": 2,
            "learningRate": 0.02,
            "minLearningRate": 0.002,
            "warmupSteps": 1,
            "seed": 0,
        },
        "checkpoint": {"intervalMinutes": 60, "keep": 2},
        "resilience": {"collectiveTimeoutMinutes": 2},
        "rendezvous": {"backend": "c10d"},
    }
    for path, value in over.items():  # "fsdp.shardingStrategy" → spec["fsdp"]["shardingStrategy"]
        d = spec
        *parents, leaf = path.split(".")
        for p in parents:
            d = d.setdefault(p, {})
        d[leaf] = value
    return copy.deepcopy(spec)


def fixed_corpus_text(n_docs: int = 90, seed: int = 0) -> list[str]:
    """Documents of Zipf-distributed made-up words in sentences and lines, the same on every machine
    and every commit. The corpus must not change with the repository: the tests compare trajectories
    (bf16 against fp32 within bf16's precision), and a corpus built from the trainer's own sources
    made that margin move with every unrelated edit to them."""
    import random

    rng = random.Random(seed)
    syll = "ka to ri mon el sa the an ver di lo qu is ne or pa st ing ed un re al co mi".split()
    words = ["".join(rng.choice(syll) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    weights = [1 / (r + 1) for r in range(len(words))]
    docs = []
    for _ in range(n_docs):
        lines = []
        for _ in range(rng.randint(20, 90)):
            ws = rng.choices(words, weights, k=rng.randint(3, 14))
            lines.append(" ".join(ws).capitalize() + rng.choice([".", ".", ",", ":", "?"]))
        docs.append("\n".join(lines) + "\n")
    return docs


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> str:
    from llmtrain_trainer.data.prepare import prepare

    src = tmp_path_factory.mktemp("text")
    for i, doc in enumerate(fixed_corpus_text()):
        (src / f"doc-{i:03d}.txt").write_text(doc)
    out = tmp_path_factory.mktemp("tokens")
    prepare([str(src)], str(out), shard_tokens=20_000)
    return str(out)


@pytest.fixture(scope="session")
def reference(corpus):
    """Loss per step (1-based) of the plain single-process loop on `base_spec` with the corpus."""
    from trainer_reference import reference_losses

    return reference_losses(base_spec(**{"data.uri": corpus}))


class Workers:
    """A running torchrun (one "node"); `events` is filled from its stdout by a reader thread."""

    def __init__(
        self,
        spec: dict,
        nproc: int,
        tmp: Path,
        *,
        rdzv: tuple[str, str] | None = None,
        nnodes: int = 1,
        env: dict | None = None,
        name: str = "w",
        rdzv_id: str | None = None,
        file_size_limit: int | None = None,
        rdzv_conf: str | None = None,
        max_restarts: int = 0,
    ):
        self.spec_file = tmp / f"spec-{name}-{time.monotonic_ns()}.json"
        self.spec_file.write_text(json.dumps(spec))
        backend, endpoint = rdzv or ("c10d", f"127.0.0.1:{free_port()}")
        # The production entry point: torchrun under llmtrain_trainer.launch (a clean stop exits 0).
        self.rdzv_id = rdzv_id or "test-" + uuid.uuid4().hex[:12]
        self.cmd = [
            PY,
            "-m",
            "llmtrain_trainer.launch",
            f"--nnodes={nnodes}",
            f"--nproc-per-node={nproc}",
            f"--rdzv-backend={backend}",
            f"--rdzv-endpoint={endpoint}",
            f"--rdzv-id={self.rdzv_id}",
            f"--max-restarts={max_restarts}",
            *([f"--rdzv-conf={rdzv_conf}"] if rdzv_conf else []),
            "-m",
            "llmtrain_trainer",
            "--spec",
            str(self.spec_file),
        ]
        self.metrics_port = free_port_block(nproc)
        full_env = dict(
            os.environ,
            PYTHONUNBUFFERED="1",
            OMP_NUM_THREADS="1",
            LLMTRAIN_METRICS_PORT=str(self.metrics_port),
            LLMTRAIN_JOB_NAME="test",
            LLMTRAIN_CHECKPOINT_STAGING=str(tmp / "staging"),
        )
        full_env.update(env or {})
        self.stderr_path = tmp / f"stderr-{name}-{time.monotonic_ns()}.log"
        self._stderr = open(self.stderr_path, "w")
        self.proc = subprocess.Popen(
            self.cmd,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=full_env,
            cwd=REPO,
            start_new_session=True,
            preexec_fn=_limit_file_size(file_size_limit),
        )
        self.events: list[dict] = []
        self.lines: queue.Queue[dict | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            line = line.strip()
            if line.startswith("{"):
                e = json.loads(line)
                self.events.append(e)
                self.lines.put(e)
        self.lines.put(None)

    def wait_for(self, pred, timeout: float = 120) -> dict:
        """Block until an event satisfying `pred` arrives (fails if the workers exit first)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                e = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"timed out waiting for an event; stderr:\n{self.stderr()}")
            if e is None:
                raise AssertionError(
                    f"workers exited (rc={self.proc.wait()}) before the event; stderr:\n{self.stderr()}"
                )
            if pred(e):
                return e

    def worker_pids(self) -> list[int]:
        """The trainer processes: children of torchrun, the launcher's only child."""
        from llmtrain_trainer.launch import children

        return [w for torchrun in children(self.proc.pid) for w in children(torchrun)]

    def worker(self, local_rank: int) -> int:
        """The pid of the trainer process of `local_rank` (torchrun's LOCAL_RANK in its environment)."""
        for pid in self.worker_pids():
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            except OSError:
                continue
            if env.get(b"LOCAL_RANK") == str(local_rank).encode():
                return pid
        raise AssertionError(f"no worker of local rank {local_rank} among {self.worker_pids()}")

    def wait(self, timeout: float = 180) -> int:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"workers did not finish in {timeout} s; stderr:\n{self.stderr()}")
        self._reader.join(10)
        return rc

    def kill(self) -> None:
        """SIGKILL the whole tree, as a lost node: the launcher's process group alone would leave
        the workers (torchrun starts each in a session of its own) running on, orphaned, until
        their collectives time out."""
        from llmtrain_trainer.launch import kill_tree

        if self.proc.poll() is None:
            kill_tree(self.proc)
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self._stderr.close()

    def stderr(self) -> str:
        if not self._stderr.closed:  # kill() closes it: a timed-out run's message still shows the tail
            self._stderr.flush()
        return self.stderr_path.read_text()[-6000:]

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e.get("event") == kind]

    def losses(self) -> dict[int, float]:
        return {e["step"]: e["loss"] for e in self.of("step")}


def _limit_file_size(limit: int | None):
    """RLIMIT_FSIZE for the torchrun tree: a write past `limit` bytes fails with EFBIG ("File too
    large"), as on a full disk, without mounting anything (Python ignores SIGXFSZ)."""
    if limit is None:
        return None

    def apply() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


@pytest.fixture
def launch(tmp_path):
    """launch(spec, nproc, **kw) → Workers; all of them are killed at teardown."""
    started: list[Workers] = []

    def _launch(spec: dict, nproc: int = 2, **kw) -> Workers:
        w = Workers(spec, nproc, tmp_path, **kw)
        started.append(w)
        return w

    yield _launch
    for w in started:
        w.kill()


@pytest.fixture
def one_process_group():
    """A one-process gloo group: enough for the real Checkpointer and DCP inside the test process."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def run_to_end(w: Workers, timeout: float = 180) -> Workers:
    rc = w.wait(timeout)
    assert rc == 0, f"torchrun exited {rc}; stderr:\n{w.stderr()}"
    return w


@pytest.fixture(scope="session")
def etcd(tmp_path_factory):
    """host:port of a real etcd (v2 API enabled) on a free loopback port."""
    from llmtrain_trainer.cli.local import local_etcd

    with local_etcd(str(tmp_path_factory.mktemp("etcd") / "data")) as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def s3():
    """A moto S3 server on a free loopback port; yields the env the workers need to reach it."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield env
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()
