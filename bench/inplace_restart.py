"""SIGKILL of one rank → the next productive step: restarted in place, or as a new attempt? (CPU, gloo)

One torchrun (a pod) with 2 ranks meets through a real etcd (the v2 API, as the operator's default
rendezvous); a few steps after a committed checkpoint, local rank 1 is SIGKILLed. Then either

* in place: torchrun (`--max-restarts=1`, spec.resilience.inPlaceRestarts) stops the other rank,
  starts both workers again in a new rendezvous round, and they resume from the checkpoint; or
* a new attempt: torchrun (`--max-restarts=0`) fails, and a new torchrun is launched at once with a
  fresh rendezvous id (what the operator does, minus its control plane: pod Failed → next attempt's
  pods Running, 0.25 s p50 on the simulated chain, bench/results/recovery_control_plane.json, and
  on a real cluster the container start and image pull), whose workers resume from the checkpoint.

Measured from the kill: the first step completed again, and the next *productive* step (the first
step past the one the killed run had reached; the steps between the checkpoint and the kill are
redone either way). The two ways alternate, in turns, in the same run; the result is the ratio of
their medians.

    .venv/bin/python bench/inplace_restart.py --repeats 3 --json bench/results/inplace_restart_local.json
    .venv/bin/python bench/inplace_restart.py --quick      # one turn each (tests/bench)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from provenance import provenance
from trainer_events import LaunchedPod, trainer_env

EVERY = 5  # steps between checkpoints
KILL_AFTER = 2  # steps past a committed checkpoint


def job_spec(steps: int, ckpt: Path) -> dict:
    return {
        "model": {"preset": "tiny"},
        "data": {"uri": "synthetic", "seqLen": 32},
        "cluster": {"instanceType": "cpu", "processesPerNode": 2},
        "fsdp": {"shardingStrategy": "FULL_SHARD", "mixedPrecision": "fp32", "activationCheckpointing": "none"},
        "training": {
            "maxSteps": steps,
            "globalBatchTokens": 256,
            "microBatchSize": 2,
            "learningRate": 0.02,
            "warmupSteps": 1,
            "seed": 0,
        },
        "checkpoint": {"uri": f"file://{ckpt}", "intervalSteps": EVERY, "intervalMinutes": 60, "keep": 2},
        "resilience": {"collectiveTimeoutMinutes": 2},
        "rendezvous": {"backend": "etcd-v2"},
    }


class Pod(LaunchedPod):
    """One `llmtrain_trainer.launch` (torchrun under the pod's wrapper), as one pod runs it."""

    def __init__(self, spec_file: Path, endpoint: str, max_restarts: int, workdir: Path, attempt: int):
        cmd = [
            sys.executable,
            "-m",
            "llmtrain_trainer.launch",
            "--nnodes=1",
            "--nproc-per-node=2",
            "--rdzv-backend=etcd-v2",
            f"--rdzv-endpoint={endpoint}",
            f"--rdzv-id=bench-{uuid.uuid4().hex[:8]}-a{attempt}",
            f"--max-restarts={max_restarts}",
            "-m",
            "llmtrain_trainer",
            "--spec",
            str(spec_file),
        ]
        env = trainer_env(
            LLMTRAIN_ATTEMPT=str(attempt),
            LLMTRAIN_CHECKPOINT_STAGING=str(workdir / f"staging-{uuid.uuid4().hex[:6]}"),
        )
        super().__init__(cmd, env, workdir / f"pod-{uuid.uuid4().hex[:6]}.log")


def trial(mode: str, endpoint: str, workdir: Path, steps: int) -> dict:
    ckpt = workdir / f"ckpt-{uuid.uuid4().hex[:6]}"
    spec_file = workdir / f"spec-{uuid.uuid4().hex[:6]}.json"
    spec_file.write_text(json.dumps(job_spec(steps, ckpt)))
    first = Pod(spec_file, endpoint, 1 if mode == "in_place" else 0, workdir, attempt=1)
    pods = [first]
    try:
        saved = first.next_event(lambda e: e.get("event") == "checkpoint" and e["step"] >= 2 * EVERY)
        assert saved is not None, f"no checkpoint; {first.log_tail()}"
        last = first.next_event(lambda e: e.get("event") == "step" and e["step"] >= saved[1]["step"] + KILL_AFTER)
        assert last is not None
        os.kill(first.rank_pid(1), signal.SIGKILL)
        killed = time.monotonic()
        reached = last[1]["step"]
        out: dict = {"mode": mode, "killed_after_step": reached}
        if mode == "in_place":
            pod = first
        else:
            rc = first.proc.wait(120)
            out["failed_pod_exit_s"] = round(time.monotonic() - killed, 3)
            assert rc != 0, rc
            pod = Pod(spec_file, endpoint, 0, workdir, attempt=2)  # at once: no control plane here
            pods.append(pod)
        # past the killed run's own lines still in the queue: the new workers' config, resume, steps
        config = pod.next_event(lambda e: e.get("event") == "config")
        assert config is not None, f"no new workers after the kill; {pod.log_tail()}"
        out["in_place_restarts"] = config[1].get("in_place_restarts")
        got = pod.next_event(lambda e: e.get("event") == "resume")
        assert got is not None, f"no resume after the kill; {pod.log_tail()}"
        out["resumed_from"] = got[1]["step"]
        step = pod.next_event(lambda e: e.get("event") == "step")
        assert step is not None
        out["first_step_s"] = round(step[0] - killed, 3)
        if step[1]["step"] > reached:
            productive: tuple[float, dict] | None = step
        else:
            productive = pod.next_event(lambda e: e.get("event") == "step" and e["step"] > reached)
        assert productive is not None
        out["productive_step_s"] = round(productive[0] - killed, 3)
        out["steps_redone"] = reached - out["resumed_from"]
        return out
    finally:
        for p in pods:
            p.stop()


def _median(rows: list[dict], mode: str, key: str) -> float:
    return round(statistics.median(r[key] for r in rows if r["mode"] == mode), 3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="turns of each way (alternating)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--quick", action="store_true", help="one turn of each")
    ap.add_argument("--json", help="write the result here too")
    a = ap.parse_args()
    repeats = 1 if a.quick else a.repeats
    load_before = os.getloadavg()
    rows: list[dict] = []
    from llmtrain_trainer.cli.local import local_etcd

    with tempfile.TemporaryDirectory(prefix="inplace-bench-") as tmp:
        workdir = Path(tmp)
        with local_etcd(str(workdir / "etcd")) as endpoint:
            for r in range(repeats):
                order = ("in_place", "new_attempt") if r % 2 == 0 else ("new_attempt", "in_place")
                for mode in order:
                    row = trial(mode, endpoint, workdir, a.steps)
                    print(json.dumps(row), file=sys.stderr, flush=True)
                    rows.append(row)
    result = {
        **provenance(load_before),
        "repeats": repeats,
        "trials": rows,
        "median": {
            mode: {k: _median(rows, mode, k) for k in ("first_step_s", "productive_step_s")}
            for mode in ("in_place", "new_attempt")
        },
    }
    m = result["median"]
    result["ratio_in_place_to_new_attempt"] = {
        k: round(m["in_place"][k] / m["new_attempt"][k], 3) for k in ("first_step_s", "productive_step_s")
    }
    text = json.dumps(result, indent=2)
    if a.json:
        Path(a.json).write_text(text + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
