"""How long does the trainer take to get back to training after a worker dies? (CPU, gloo)

The operator's part of a recovery (failure seen → next attempt's pods Running) is measured on the
simulated cluster; this measures the trainer's part on this machine, as the operator relaunches it:

1. baseline: a cold start, `torchrun` launch → first training step (no checkpoint to load);
2. recovery: the same job with `checkpoint.intervalSteps`, SIGKILLed (the whole process group, as a
   node loss would) a few steps after a committed checkpoint, then launched again at once with a
   fresh rendezvous id; SIGKILL → first resumed step, split into launch → `config` event (processes
   up and rendezvous done), → `resume` event (checkpoint loaded), → first step.

Checked on every repeat: the relaunch resumes from the last committed checkpoint, and the steps after
it run exactly once each up to maxSteps (no lost or repeated step in the trajectory); the steps done
between that checkpoint and the kill are recomputed, and their count is reported.

    .venv/bin/python bench/recovery.py [--repeats 3] [--nproc 2] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from ports import metrics_port

REPO = Path(__file__).resolve().parents[1]


def job_spec(steps: int, interval: int, ckpt: str) -> dict:
    return {
        "model": {"preset": "tiny"},
        "data": {"uri": "synthetic", "seqLen": 64},
        "cluster": {"instanceType": "cpu", "processesPerNode": 2},
        "fsdp": {"shardingStrategy": "FULL_SHARD", "mixedPrecision": "fp32", "activationCheckpointing": "none"},
        "training": {"maxSteps": steps, "globalBatchTokens": 1024, "microBatchSize": 4, "learningRate": 1e-3,
                     "warmupSteps": 1, "seed": 0},
        "checkpoint": {"uri": ckpt, "intervalSteps": interval, "intervalMinutes": 60, "keep": 2},
        "resilience": {"collectiveTimeoutMinutes": 2},
        "rendezvous": {"backend": "c10d"},
    }


class Run:
    """One torchrun; its JSON events (with arrival times) come through a queue."""

    def __init__(self, spec_file: Path, nproc: int, workdir: Path):
        from torch.distributed.elastic.utils.distributed import get_free_port

        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{get_free_port()}", f"--rdzv-id=rec-{uuid.uuid4().hex[:8]}",
               "--max-restarts=0", "-m", "llmtrain_trainer", "--spec", str(spec_file)]
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", LLMTRAIN_METRICS_PORT=metrics_port(),
                   LLMTRAIN_CHECKPOINT_STAGING=str(workdir / "staging"))
        self.started = time.monotonic()
        self.stderr = open(workdir / f"stderr-{uuid.uuid4().hex[:6]}.log", "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=env,
                                     cwd=REPO, start_new_session=True)
        self.events: "queue.Queue[tuple[float, dict] | None]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.events.put((time.monotonic(), json.loads(line)))
        self.events.put(None)

    def until(self, pred, timeout: float = 300) -> tuple[float, dict]:
        deadline = time.monotonic() + timeout
        while True:
            item = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            if item is None:
                raise RuntimeError(f"trainer exited ({self.proc.wait()}) early; see {self.stderr.name}")
            if pred(item[1]):
                return item

    def kill(self) -> None:
        """SIGKILL torchrun and every worker at once, as a lost node would."""
        from llmtrain_trainer.launch import kill_tree

        kill_tree(self.proc)
        self.proc.wait()


def cold_start(nproc: int, workdir: Path) -> float:
    spec = workdir / "cold.json"
    spec.write_text(json.dumps(job_spec(3, 0, str(workdir / "cold-ckpt"))))
    run = Run(spec, nproc, workdir)
    t, _ = run.until(lambda e: e.get("event") == "step")
    run.kill()
    return t - run.started


def recovery(nproc: int, workdir: Path, steps: int, interval: int) -> dict:
    ckpt = workdir / f"ckpt-{uuid.uuid4().hex[:6]}"
    spec = workdir / "job.json"
    spec.write_text(json.dumps(job_spec(steps, interval, str(ckpt))))
    first = Run(spec, nproc, workdir)
    _, saved = first.until(lambda e: e.get("event") == "checkpoint" and e["step"] >= 2 * interval)
    _, last = first.until(lambda e: e.get("event") == "step" and e["step"] >= saved["step"] + 2)
    first.kill()
    killed = time.monotonic()

    second = Run(spec, nproc, workdir)
    t_config, _ = second.until(lambda e: e.get("event") == "config")
    t_resume, resumed = second.until(lambda e: e.get("event") == "resume")
    t_step, step = second.until(lambda e: e.get("event") == "step")
    seen = [step["step"]]
    while True:
        _, e = second.until(lambda e: e.get("event") in ("step", "end"))
        if e["event"] == "end":
            break
        seen.append(e["step"])
    second.proc.wait(60)
    # The last committed checkpoint at kill time is at least `saved`; the one the run resumed from
    # must be the newest committed, and every later step must run exactly once.
    assert resumed["step"] >= saved["step"], (resumed, saved)
    assert seen == list(range(resumed["step"] + 1, steps + 1)), seen
    return {"kill_to_first_step_s": t_step - killed, "launch_to_config_s": t_config - second.started,
            "config_to_resumed_s": t_resume - t_config, "resumed_to_first_step_s": t_step - t_resume,
            "resumed_from": resumed["step"], "killed_at_step": last["step"],
            "steps_recomputed": last["step"] - resumed["step"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--interval", type=int, default=4, help="checkpoint.intervalSteps")
    ap.add_argument("--quick", action="store_true", help="one repeat of a short job (used by the tests)")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args(argv)
    if a.quick:
        a.repeats, a.steps, a.interval = 1, 40, 4
    with tempfile.TemporaryDirectory(prefix="llmtrain-recovery-") as tmp:
        work = Path(tmp)
        cold, rec = [], []
        for _ in range(a.repeats):  # alternate, so machine load drifts hit both sides alike
            cold.append(cold_start(a.nproc, work))
            rec.append(recovery(a.nproc, work, a.steps, a.interval))
    kill = [r["kill_to_first_step_s"] for r in rec]
    result = {
        "nproc": a.nproc, "repeats": a.repeats,
        "cold_start_s": {"median": statistics.median(cold), "min": min(cold), "max": max(cold)},
        "kill_to_first_step_s": {"median": statistics.median(kill), "min": min(kill), "max": max(kill)},
        "ratio_recovery_to_cold_start": statistics.median(kill) / statistics.median(cold),
        "runs": rec,
    }
    print(f"cold start → first step      median {result['cold_start_s']['median']:.2f} s "
          f"(min {min(cold):.2f}, max {max(cold):.2f})")
    print(f"SIGKILL → first resumed step median {result['kill_to_first_step_s']['median']:.2f} s "
          f"(min {min(kill):.2f}, max {max(kill):.2f}); {result['ratio_recovery_to_cold_start']:.2f}× cold start")
    for r in rec:
        print(f"  launch→config {r['launch_to_config_s']:.2f} s, config→resumed {r['config_to_resumed_s']:.2f} s, "
              f"resumed→step {r['resumed_to_first_step_s']:.2f} s; resumed from step {r['resumed_from']}, "
              f"killed at {r['killed_at_step']}, {r['steps_recomputed']} step(s) recomputed, none lost or repeated")
    print(json.dumps(result))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
