"""`llmtrain local FILE`: run an LLMTrainingJob on this machine, the way the cluster runs it.

Same entry point (`torchrun ... -m llmtrain_trainer`), same spec, same rendezvous backend: for etcd
jobs a throwaway local etcd (v2 API enabled) is started and stopped; c10d uses a free loopback port.
One worker per local GPU, or `cluster.processesPerNode` (catalog default for `cpu`) CPU workers.
Every run gets a fresh rendezvous id (reusing one is what causes RendezvousClosedError).

A worker process that fails is restarted in place up to `spec.resilience.inPlaceRestarts` times, as
on a pod (torchrun's `--max-restarts`, a TCPStore per rendezvous round: llmtrain_trainer.launch); the
workers resume from the newest checkpoint and the attempt's counters are kept in a ledger under
`<workdir>/staging` (`LLMTRAIN_CHECKPOINT_STAGING`, also where checkpoint shards are staged before an
S3 upload). `--in-place-restarts N` overrides the spec (0: the first failure ends the run).

The workers' structured stdout drives a progress bar (step, loss, tokens/s, ETA); everything else
goes to `<workdir>/worker.log`. Ctrl-C sends SIGTERM to the workers, which finish the current step,
write a checkpoint and exit 0; running the command again resumes from it. A second Ctrl-C kills.
A run that ends cleanly leaves `<workdir>/final-summary`, what a pod's termination message says
then (llmtrain/final_summary.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from contextlib import contextmanager
from pathlib import Path

from llmtrain.pod_contract import (
    ATTEMPT_ENV,
    JOB_NAME_ENV,
    JOB_NAMESPACE_ENV,
    METRICS_PORT_ENV,
    SNAPSHOT_DIR_ENV,
    STAGING_ENV,
)

from ..config import dumps, load_job_file
from ..launch import FINAL_SUMMARY_ENV, free_port, torchrun_command, torchrun_env
from ..metrics.restarts import clear_ledgers


def _etcd_binary() -> str:
    """The pinned etcd of `make tools` (its cache's `current` pointer, or $LLMTRAIN_TOOLS_DIR), else
    an etcd on PATH (the Debian package works too). Looked up here, not through llmtrain_devcluster:
    the trainer runs where the dev cluster's package is not installed."""
    tools = os.environ.get("LLMTRAIN_TOOLS_DIR") or os.path.join(
        os.environ.get("LLMTRAIN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "llmtrain"),
        "tools",
        "current",
    )
    pinned = os.path.join(tools, "bin", "etcd")
    if os.access(pinned, os.X_OK):
        return pinned
    path = shutil.which("etcd")
    if not path:
        raise SystemExit("etcd not found: run `make tools`, or `apt-get install -y etcd-server`")
    return path


def snapshot_dir(work: Path) -> str:
    """Where a local run keeps its in-memory snapshots: a folder of /dev/shm named after the workdir
    (memory, like a pod's), else of the workdir."""
    import hashlib

    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        key = hashlib.sha256(str(work.resolve()).encode()).hexdigest()[:12]
        return f"/dev/shm/llmtrain-local-{key}"
    return str(work / "snapshots")


@contextmanager
def etcd_process(argv: list[str], health_url: str, log_path: str):
    """Start etcd with `argv`, poll `health_url` until it serves (60 s at most), yield, stop it.
    Shared by `local_etcd` and the tests' TLS etcd, which differ only in their flags."""
    log = open(log_path, "ab")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                log.flush()
                with open(log_path, "rb") as f:
                    tail = f.read()[-2000:].decode(errors="replace")
                raise RuntimeError(f"etcd exited with {proc.returncode} ({log_path}): {tail}")
            try:
                with urllib.request.urlopen(health_url, timeout=1) as r:
                    if json.loads(r.read()).get("health") == "true":
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("etcd did not become healthy within 60 s")
            time.sleep(0.1)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@contextmanager
def local_etcd(data_dir: str):
    """A single-member etcd with the v2 API (torch's etcd rendezvous speaks v2); yields host:port."""
    os.makedirs(data_dir, mode=0o700, exist_ok=True)
    cport, pport = free_port(), free_port()
    curl, purl = f"http://127.0.0.1:{cport}", f"http://127.0.0.1:{pport}"
    argv = [
        _etcd_binary(),
        "--name=default",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={curl}",
        f"--advertise-client-urls={curl}",
        f"--listen-peer-urls={purl}",
        f"--initial-advertise-peer-urls={purl}",
        f"--initial-cluster=default={purl}",
        "--enable-v2=true",
        "--log-level=warn",
    ]
    with etcd_process(argv, f"{curl}/health", os.path.join(os.path.dirname(data_dir), "etcd.log")):
        yield f"127.0.0.1:{cport}"


def default_nproc(spec) -> int:
    from llmtrain.catalog import instance_type

    it = instance_type(spec.cluster.instance_type)
    if it.is_gpu:
        import torch

        n = torch.cuda.device_count()
        if n:
            return min(n, it.gpus_per_node)
    return spec.cluster.processes_per_node or it.processes_per_node or 1


class _Progress:
    """tqdm bar fed by the trainer's JSON step lines; summary at the end."""

    def __init__(self, max_steps: int, quiet: bool):
        self.quiet = quiet
        self.bar = None
        self.max_steps = max_steps
        self.first_step = None
        self.last: dict = {}
        self.tps: list[float] = []
        self.mfu: list[float] = []
        self.checkpoints: list[dict] = []
        self.resumed_from = None
        self.errors: list[dict] = []
        self.last_end: dict | None = None  # rank 0's `end` line
        self.in_place_restarts = 0  # worker processes torchrun restarted in place (the config events say)

    def line(self, text: str, log) -> None:
        event = None
        if text.startswith("{"):
            try:
                event = json.loads(text)
            except ValueError:
                pass
        if event is None:
            log.write(text + "\n")
            log.flush()
            if text.startswith("master_addr=") and not self.quiet:
                self._write(text)
            return
        kind = event.get("event")
        if kind == "step":
            self._step(event)
        elif kind == "config":
            restarts = event.get("in_place_restarts")
            if isinstance(restarts, int) and restarts > self.in_place_restarts:
                self.in_place_restarts = restarts
                self._write(f"a worker process failed: restarted in place ({restarts} so far), resuming")
        elif kind == "resume":
            self.resumed_from = event["step"]
            self._write(
                f"resumed from checkpoint at step {event['step']} (written by {event['from_world_size']} processes)"
            )
        elif kind == "checkpoint":
            self.checkpoints.append(event)
            self._write(f"checkpoint step {event['step']} → {event['uri']} ({event['seconds']} s)")
        elif kind == "checkpoint_failed":
            self._write(f"checkpoint step {event['step']} FAILED: {event['error']}")
        elif kind == "end":
            self.last_end = event
        elif kind == "error":
            self.errors.append(event)
        log.write(text + "\n")

    def _write(self, msg: str) -> None:
        if self.quiet:
            return
        if self.bar is not None:
            self.bar.write(msg)
        else:
            print(msg, flush=True)

    def _step(self, e: dict) -> None:
        if self.first_step is None:
            self.first_step = e["step"] - 1
            if not self.quiet:
                from tqdm import tqdm

                self.bar = tqdm(total=self.max_steps, initial=self.first_step, unit="step", dynamic_ncols=True)
        self.last = e
        self.tps.append(e["tokens_per_second"])
        self.mfu.append(e["mfu"])
        if self.bar is not None:
            self.bar.set_postfix_str(
                f"loss={e['loss']:.4f} tok/s={e['tokens_per_second']:,.0f} mfu={e['mfu']:.1%}", refresh=False
            )
            self.bar.update(e["step"] - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def summary(self, wall: float, rc: int) -> str:
        from llmtrain.status import percent  # as the job's status shows MFU

        # The trainer's own means (its `end` line: the steps after the first, warm-up, by their
        # time), as it leaves them in its final summary for the job's status; else the step lines'.
        end = self.last_end or {}
        steady = [end["tokens_per_second"]] if "tokens_per_second" in end else self.tps[1:] or self.tps
        mfu = [end["mfu"]] if "mfu" in end else self.mfu[1:] or self.mfu
        last = self.last
        lines = [
            f"exit code        {rc}",
            f"steps            {self.first_step if self.first_step is not None else '-'} → "
            f"{last.get('step', '-')} of {self.max_steps}",
            f"final loss       {last.get('loss', '-')}",
            f"tokens/s (mean)  {sum(steady) / len(steady):,.0f}" if steady else "tokens/s         -",
            f"MFU (mean)       {percent(sum(mfu) / len(mfu))}" if mfu else "MFU              -",
            f"checkpoints      {len(self.checkpoints)}"
            + (f", last {self.checkpoints[-1]['uri']}" if self.checkpoints else ""),
            f"wall time        {wall:.1f} s",
        ]
        if self.in_place_restarts:
            lines.insert(-1, f"in-place restarts {self.in_place_restarts}")
        return "\n".join(lines + self.error_lines())

    def error_lines(self) -> list[str]:
        """Rank 0's error first, then any different error another rank reported (the root cause
        may be on another rank; rank 0 then often only saw a broken collective)."""
        ordered = sorted(self.errors, key=lambda e: e.get("rank", 0))
        seen, out = set(), []
        for e in ordered:
            if e["error"] not in seen:
                seen.add(e["error"])
                out.append(f"error (rank {e.get('rank', '?')}): {e['error']}")
        return out[:4]


def run_local(
    file: str,
    *,
    nproc: int | None = None,
    max_steps: int | None = None,
    checkpoint_uri: str | None = None,
    metrics_port: int | None = None,
    workdir: str | None = None,
    quiet: bool = False,
    in_place_restarts: int | None = None,
) -> int:
    doc, spec = load_job_file(file)
    meta = doc.get("metadata") or {}
    name = meta.get("name") or Path(file).stem
    if max_steps is not None:
        spec.training.max_steps = max_steps
    if checkpoint_uri is not None:
        spec.checkpoint.uri = checkpoint_uri
    if in_place_restarts is not None:
        spec.resilience.in_place_restarts = in_place_restarts
    nproc = nproc or default_nproc(spec)
    work = Path(workdir or os.path.join(".llmtrain", name))
    work.mkdir(parents=True, exist_ok=True)
    spec_file = work / "spec.json"
    spec_file.write_text(dumps(spec.wire()))
    if not spec.checkpoint.uri and not quiet:
        print(
            "note: spec.checkpoint.uri is unset: no checkpoints, Ctrl-C stops without saving "
            "and a re-run starts over (set it, or pass --checkpoint-uri)",
            flush=True,
        )

    env = dict(os.environ)
    env.update(spec.cluster.env)
    env.update(
        {
            JOB_NAME_ENV: name,
            JOB_NAMESPACE_ENV: meta.get("namespace") or "local",
            ATTEMPT_ENV: env.get(ATTEMPT_ENV, "0"),
            "PYTHONUNBUFFERED": "1",
        }
    )
    if metrics_port is not None:
        env[METRICS_PORT_ENV] = str(metrics_port)
    # node-local staging, as a pod's volume: the in-place restart ledger and S3 checkpoint shards
    env.setdefault(STAGING_ENV, str(work / "staging"))
    # Each run is a new attempt, as a pod's emptyDir is: an earlier run's ledgers in the same
    # --workdir would otherwise read as this attempt's (same job, attempt 0) and its resume as a
    # restart in place.
    clear_ledgers(env[STAGING_ENV])
    # spec.checkpoint.memory's snapshots: in memory, as a pod's /dev/shm, and gone with the run
    env.setdefault(SNAPSHOT_DIR_ENV, snapshot_dir(work))
    shutil.rmtree(env[SNAPSHOT_DIR_ENV], ignore_errors=True)
    # what a pod's termination message would say on a clean exit (llmtrain_trainer.launch)
    final = work / "final-summary"
    final.unlink(missing_ok=True)
    env[FINAL_SUMMARY_ENV] = str(final)

    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, env[SNAPSHOT_DIR_ENV], ignore_errors=True)
        backend = spec.rendezvous.backend
        if backend in ("etcd", "etcd-v2"):
            etcd_dir = tempfile.mkdtemp(prefix="etcd-", dir=work)
            endpoint = stack.enter_context(local_etcd(etcd_dir))
            stack.callback(shutil.rmtree, etcd_dir, True)
        else:
            endpoint = f"127.0.0.1:{free_port()}"
        rdzv_id = f"{name}-{uuid.uuid4().hex[:8]}"
        cmd = torchrun_command(torchrun_args(spec, nproc, backend, endpoint, rdzv_id, spec_file))
        if not quiet:
            print(
                f"llmtrain local: {name}: {nproc} worker(s), rendezvous {backend} at {endpoint} "
                f"(id {rdzv_id}); in-place restarts {spec.resilience.in_place_restarts}; "
                f"logs in {work / 'worker.log'}",
                flush=True,
            )
        return _supervise(cmd, torchrun_env(env), work, spec.training.max_steps, quiet)


def torchrun_args(spec, nproc: int, backend: str, endpoint: str, rdzv_id: str, spec_file: Path) -> list[str]:
    """torchrun's arguments for one local "node": `--max-restarts` is the spec's inPlaceRestarts,
    as the pods' (llmtrain.render)."""
    return [
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        f"--rdzv-backend={backend}",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={rdzv_id}",
        f"--max-restarts={spec.resilience.in_place_restarts}",
        "-m",
        "llmtrain_trainer",
        "--spec",
        str(spec_file),
    ]


def _supervise(cmd: list[str], env: dict, work: Path, max_steps: int, quiet: bool) -> int:
    from ..launch import kill_tree, stop_workers

    progress = _Progress(max_steps, quiet)
    t0 = time.monotonic()
    log = open(work / "worker.log", "a")
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1, start_new_session=True
    )  # our Ctrl-C must not reach the workers directly

    def on_sigterm(signum, frame):  # `kill`, a container stop, a CI timeout: the same as Ctrl-C
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    interrupts = restarts_at_stop = 0
    try:
        while True:
            try:
                for line in proc.stdout or ():
                    progress.line(line.rstrip("\n"), log)
                    if interrupts and progress.in_place_restarts > restarts_at_stop:
                        kill_tree(proc)  # asked to stop: a worker that failed meanwhile is not restarted
                rc = proc.wait()
                break
            except KeyboardInterrupt:
                interrupts += 1
                restarts_at_stop = progress.in_place_restarts
                if interrupts == 1:
                    progress._write("stopping: workers finish the step and write a checkpoint (Ctrl-C again to kill)")
                    stop_workers(proc)
                else:
                    kill_tree(proc)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if proc.poll() is None:
            kill_tree(proc)
            proc.wait()
        progress.close()
        log.close()
    if not quiet:
        print(progress.summary(time.monotonic() - t0, rc), flush=True)
    elif rc:
        print("\n".join(progress.error_lines()), file=sys.stderr, flush=True)
    if rc and not progress.errors:
        print(f"llmtrain local: the workers exited {rc}; see {work / 'worker.log'}", file=sys.stderr, flush=True)
    return rc
