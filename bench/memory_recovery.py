"""Recovery from in-memory snapshots against durable checkpoints alone (CPU, gloo, real etcd).

A ~125M-parameter Llama (so that copying its state shows: 12 bytes/param of fp32 weights and AdamW
moments, 0.75 GB per rank at 2 ranks), trained with a durable checkpoint every DURABLE steps; with
`memory`, also an in-memory snapshot every K steps (spec.checkpoint.memory). Two failures:

* in_place: one torchrun (a pod) with 2 ranks; local rank 1 SIGKILLed; torchrun restarts both
  workers in place (inPlaceRestarts), which resume from their own snapshots, or from the durable
  checkpoint;
* node: two torchruns (nodes) with 1 rank each; node B's whole process tree killed and its snapshot
  folder (its /dev/shm) deleted; a new node joins the same rendezvous at once, and the lost rank
  resumes from its partner's copy, or every rank from the durable checkpoint.

Each kill comes KILL_AFTER steps past a durable checkpoint. Measured from the kill: the next
*productive* step (past the step the killed run had reached; work since the state resumed from is
redone), the steps redone, the resume's own seconds; and the snapshots' cost while training: the
blocking seconds per snapshot, the bytes per rank (each sent once to the partner), the host memory
the folders hold. The ways alternate in turns, in the same run; the result is the ratio of medians.

    .venv/bin/python bench/memory_recovery.py --repeats 2 --json bench/results/memory_recovery.json
    .venv/bin/python bench/memory_recovery.py --quick      # the tiny model, one turn of each
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from provenance import provenance
from trainer_events import LaunchedPod, trainer_env

DURABLE, K, KILL_AFTER = 10, 2, 5
# ~125M parameters: 2 blocks of d=1024 (25.7M) and a 49,152-token embedding and output (50.3M each)
DIMS = {
    "hiddenSize": 1024,
    "intermediateSize": 2816,
    "numLayers": 2,
    "numHeads": 8,
    "numKvHeads": 8,
    "vocabSize": 49152,
    "maxSeqLen": 128,
}


def job_spec(steps: int, ckpt: Path, memory: bool, per_node: int, model: dict | None = None) -> dict:
    checkpoint = {"uri": f"file://{ckpt}", "intervalSteps": DURABLE, "intervalMinutes": 60, "keep": 2}
    if memory:
        checkpoint["memory"] = {"intervalSteps": K}
    return {
        "model": model or {"dims": DIMS},
        "data": {"uri": "synthetic", "seqLen": 32},
        "cluster": {"instanceType": "cpu", "processesPerNode": per_node},
        "fsdp": {"shardingStrategy": "FULL_SHARD", "mixedPrecision": "fp32", "activationCheckpointing": "none"},
        "training": {
            "maxSteps": steps,
            "globalBatchTokens": 64,
            "microBatchSize": 1,
            "learningRate": 0.001,
            "warmupSteps": 1,
            "seed": 0,
        },
        "checkpoint": checkpoint,
        "resilience": {"collectiveTimeoutMinutes": 2},
        "rendezvous": {"backend": "etcd-v2"},
    }


class Node(LaunchedPod):
    """One `llmtrain_trainer.launch` (torchrun under the pod's wrapper), as one pod runs it."""

    def __init__(
        self,
        spec_file: Path,
        endpoint: str,
        rdzv_id: str,
        nnodes: int,
        nproc: int,
        snapshots: Path,
        log: Path,
        max_restarts: int = 1,
    ):
        cmd = [
            sys.executable,
            "-m",
            "llmtrain_trainer.launch",
            f"--nnodes={nnodes}",
            f"--nproc-per-node={nproc}",
            "--rdzv-backend=etcd-v2",
            f"--rdzv-endpoint={endpoint}",
            f"--rdzv-id={rdzv_id}",
            f"--max-restarts={max_restarts}",
            "-m",
            "llmtrain_trainer",
            "--spec",
            str(spec_file),
        ]
        env = trainer_env(
            LLMTRAIN_ATTEMPT="1",
            # the node's local staging lives and dies with its snapshot folder (the bench removes both)
            LLMTRAIN_CHECKPOINT_STAGING=str(snapshots / "staging"),
            LLMTRAIN_SNAPSHOT_DIR=str(snapshots),
        )
        super().__init__(cmd, env, log)


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("rank-*.slot-*")) if folder.is_dir() else 0


def trial(failure: str, mode: str, endpoint: str, workdir: Path, steps: int, model: dict) -> dict:
    tag = uuid.uuid4().hex[:6]
    nnodes, nproc = (1, 2) if failure == "in_place" else (2, 1)
    spec_file = workdir / f"spec-{tag}.json"
    spec_file.write_text(json.dumps(job_spec(steps, workdir / f"ckpt-{tag}", mode == "memory", nproc, model)))
    shm = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else workdir
    folders = [shm / f"llmtrain-bench-{tag}-{n}" for n in range(nnodes)]
    rdzv = f"bench-{tag}"

    def start(n: int) -> Node:
        return Node(
            spec_file, endpoint, rdzv, nnodes, nproc, folders[n], workdir / f"node-{tag}-{n}-{time.time_ns()}.log"
        )

    nodes = [start(n) for n in range(nnodes)]
    all_nodes = list(nodes)
    try:
        top = [0]  # the newest step logged so far

        # every node's events: rank 0 (which logs) may be on either node after a new round
        def next_event(pred, among=None):
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                for nd in among or all_nodes:
                    try:
                        got = nd.events.get(timeout=0.05)
                    except Exception:  # noqa: BLE001 - queue.Empty
                        continue
                    if got is not None and got[1].get("event") == "step":
                        top[0] = max(top[0], got[1]["step"])
                    if got is not None and pred(got[1]):
                        return got
            raise RuntimeError(f"timed out; see {workdir}")

        saved = next_event(lambda e: e.get("event") == "checkpoint" and e["step"] >= DURABLE)
        next_event(lambda e: e.get("event") == "step" and e["step"] >= saved[1]["step"] + KILL_AFTER)
        out: dict = {"failure": failure, "mode": mode}
        if mode == "memory":  # own slots, and with 2 nodes the partner's: the tmpfs memory held
            out["snapshot_memory_bytes_node0"] = _folder_bytes(folders[0])
        if failure == "in_place":
            os.kill(nodes[0].rank_pid(1), signal.SIGKILL)
            killed = time.monotonic()
        else:
            nodes[1].stop()
            killed = time.monotonic()
            shutil.rmtree(folders[1], ignore_errors=True)
            all_nodes.append(start(1))
        # the steps the old workers logged before the new ones started (a fast model steps on
        # between the event that triggered the kill and the kill)
        next_event(lambda e: e.get("event") == "config")
        reached = out["killed_after_step"] = top[0]
        got = next_event(lambda e: e.get("event") == "resume")
        out["resumed_from"], out["tier"] = got[1]["step"], got[1].get("tier")
        out["resume_s"] = got[1]["seconds"]
        step = next_event(lambda e: e.get("event") == "step")
        out["first_step_s"] = round(step[0] - killed, 3)
        productive = (
            step
            if step[1]["step"] > reached
            else next_event(lambda e: e.get("event") == "step" and e["step"] > reached)
        )
        out["productive_step_s"] = round(productive[0] - killed, 3)
        out["steps_redone"] = reached - out["resumed_from"]
        return out
    finally:
        for nd in all_nodes:
            nd.stop()
        for f in folders:
            shutil.rmtree(f, ignore_errors=True)


def snapshot_cost(endpoint: str, workdir: Path, steps: int, model: dict) -> dict:
    """Blocking seconds per snapshot and step time with and without snapshots, from the events of one
    uninterrupted 2-node run each (no failure)."""
    out = {}
    for mode in ("memory", "durable"):
        tag = uuid.uuid4().hex[:6]
        spec_file = workdir / f"spec-{tag}.json"
        spec_file.write_text(json.dumps(job_spec(steps, workdir / f"ckpt-{tag}", mode == "memory", 1, model)))
        folders = [Path("/dev/shm") / f"llmtrain-bench-{tag}-{n}" for n in range(2)]
        nodes = [
            Node(spec_file, endpoint, f"bench-{tag}", 2, 1, folders[n], workdir / f"cost-{tag}-{n}.log")
            for n in range(2)
        ]
        try:
            rcs = [nd.proc.wait(900) for nd in nodes]
            assert rcs == [0, 0], (rcs, workdir)
            events = []
            for nd in nodes:
                while not nd.events.empty():
                    got = nd.events.get()
                    if got is not None:
                        events.append(got[1])
            blocking = [e["blocking_seconds"] for e in events if e.get("event") == "snapshot"]
            step_s = [e["step_seconds"] for e in events if e.get("event") == "step"]
            out[mode] = {"median_step_seconds": round(statistics.median(step_s), 4)}
            if blocking:
                out[mode]["snapshots"] = len(blocking)
                out[mode]["median_blocking_seconds"] = round(statistics.median(blocking), 4)
                out[mode]["bytes_per_rank"] = next(e["bytes"] for e in events if e.get("event") == "snapshot")
        finally:
            for nd in nodes:
                nd.stop()
            for f in folders:
                shutil.rmtree(f, ignore_errors=True)
    return out


def _median(rows: list[dict], failure: str, mode: str, key: str) -> float:
    return round(statistics.median(r[key] for r in rows if r["failure"] == failure and r["mode"] == mode), 3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2, help="turns of each way (alternating)")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--quick", action="store_true", help="the tiny model, one turn of each (a smoke run)")
    ap.add_argument("--json", help="write the result here too")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))  # unwind: stop the nodes
    repeats = 1 if a.quick else a.repeats
    model = {"preset": "tiny"} if a.quick else {"dims": DIMS}
    load_before = os.getloadavg()
    rows: list[dict] = []
    from llmtrain_trainer.cli.local import local_etcd

    with tempfile.TemporaryDirectory(prefix="memory-bench-") as tmp:
        workdir = Path(tmp)
        with local_etcd(str(workdir / "etcd")) as endpoint:
            cost = snapshot_cost(endpoint, workdir, 12, model)
            print(json.dumps(cost), file=sys.stderr, flush=True)
            for r in range(repeats):
                for failure in ("in_place", "node"):
                    order = ("memory", "durable") if r % 2 == 0 else ("durable", "memory")
                    for mode in order:
                        row = trial(failure, mode, endpoint, workdir, a.steps, model)
                        print(json.dumps(row), file=sys.stderr, flush=True)
                        rows.append(row)
    medians = {
        f: {
            m: {k: _median(rows, f, m, k) for k in ("first_step_s", "productive_step_s", "resume_s", "steps_redone")}
            for m in ("memory", "durable")
        }
        for f in ("in_place", "node")
    }
    result = {
        **provenance(load_before),
        "model": model,
        "durable_every_steps": DURABLE,
        "snapshot_every_steps": K,
        "kill_after_durable_steps": KILL_AFTER,
        "snapshot_cost": cost,
        "repeats": repeats,
        "trials": rows,
        "median": medians,
        "speedup_durable_over_memory": {
            f: {
                k: round(medians[f]["durable"][k] / medians[f]["memory"][k], 2)
                for k in ("productive_step_s", "resume_s")
            }
            for f in ("in_place", "node")
        },
    }
    text = json.dumps(result, indent=2)
    if a.json:
        Path(a.json).write_text(text + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
