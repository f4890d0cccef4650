"""A failure storm: goodput with in-memory snapshots against durable checkpoints alone (CPU, gloo).

A 3-node job (three `llmtrain_trainer.launch` torchruns, one rank each, etcd rendezvous, the
~125M-parameter model of `memory_recovery.py`) trains while, every ~`--every` seconds (uniform in
0.75–1.25×), a failure strikes a random node: either its rank's worker is SIGKILLed (the pod lives;
torchrun restarts its workers in place) or the node is lost (its process tree killed and its
snapshot folder, its /dev/shm, deleted; a new node joins at once), half of each. The schedule is drawn from
`--seed`, so both ways meet the same storm, one after the other, in the same run.

What each way is measured on:
* goodput: net steps gained over the storm × the failure-free step time (the durable way's
  median, the same yardstick for both, so the snapshots' blocking counts against them) ÷ the
  storm's wall time; badput = 1 − goodput;
* per failure: the steps redone (the newest step reached before the new workers started, minus the
  step they resumed from) and the recovery time (the kill to the first step past that newest step);
* the resume tier of each recovery (memory, partner, durable).

A failure waits until the job has made a step since the last recovery (it would otherwise strike a
job that is still recovering, and its lost work could not be told apart); the slower way then meets
fewer failures, which is in its favour. The durable interval is the same for both ways; the result
gives the Young/Daly interval from the measured save time and the storm's mean time between
failures, to show how close it was to the best the durable way could do.

    .venv/bin/python bench/failure_storm.py --json bench/results/failure_storm.json   # 2 × 10 min
    .venv/bin/python bench/failure_storm.py --quick      # the tiny model, a rank and a node lost
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from memory_recovery import DIMS, Node, job_spec
from provenance import provenance

NODES = 3
TINY = {"preset": "tiny"}


def storm(seed: int, duration: float, every: float) -> list[tuple[float, str, int]]:
    """(seconds after the first step, "rank" or "node", the node hit), the same for both ways."""
    rng = random.Random(seed)
    times, t = [], 0.0
    while (t := t + rng.uniform(0.75 * every, 1.25 * every)) < duration:
        times.append(round(t, 1))
    # half of each kind, in a random order (a free draw can deal one kind only: seed 7 did)
    kinds = ["rank", "node"] * (len(times) // 2) + ["rank"] * (len(times) % 2)
    rng.shuffle(kinds)
    return [(at, kind, rng.randrange(NODES)) for at, kind in zip(times, kinds, strict=True)]


class Storm:
    """One way's run: the nodes, their events in arrival order, the failures dealt."""

    def __init__(self, mode: str, endpoint: str, workdir: Path, durable: int, k: int, tiny: bool):
        self.tag = uuid.uuid4().hex[:6]
        self.workdir = workdir
        spec = job_spec(100_000, workdir / f"ckpt-{self.tag}", mode == "memory", 1, TINY if tiny else None)
        spec["training"]["globalBatchTokens"] = NODES * spec["data"]["seqLen"]  # one sequence per rank
        spec["checkpoint"]["intervalSteps"] = durable
        if mode == "memory":
            spec["checkpoint"]["memory"] = {"intervalSteps": k}
        self.spec_file = workdir / f"spec-{self.tag}.json"
        self.spec_file.write_text(json.dumps(spec))
        shm = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else workdir
        self.folders = [shm / f"llmtrain-storm-{self.tag}-{n}" for n in range(NODES)]
        self.endpoint = endpoint
        self.events: list[tuple[float, dict]] = []
        self.nodes = [self._start(n) for n in range(NODES)]
        self.retired: list[Node] = []

    def _start(self, n: int) -> Node:
        log = self.workdir / f"storm-{self.tag}-{n}-{time.time_ns()}.log"
        # every failure elsewhere restarts this node's workers too: no budget to run out of here
        return Node(self.spec_file, self.endpoint, f"storm-{self.tag}", NODES, 1, self.folders[n], log, 10_000)

    def pump(self, until: float) -> None:
        """Collect every node's events until the monotonic time `until`."""
        while True:
            got_any = False
            for nd in [*self.nodes, *self.retired]:
                try:
                    got = nd.events.get_nowait()
                except queue.Empty:
                    continue
                if got is not None:
                    self.events.append(got)
                    got_any = True
            if time.monotonic() >= until:
                return
            if not got_any:
                time.sleep(0.05)

    def wait_for(self, pred, after: int, timeout: float = 900) -> tuple[int, tuple[float, dict]]:
        """The first event at index ≥ `after` satisfying `pred`, and its index."""
        deadline = time.monotonic() + timeout
        while True:
            for i in range(after, len(self.events)):
                if pred(self.events[i][1]):
                    return i, self.events[i]
            if time.monotonic() > deadline:
                raise RuntimeError(f"no such event in {timeout} s; the logs are in {self.workdir}")
            after = max(after, len(self.events))
            self.pump(time.monotonic() + 0.5)

    def strike(self, kind: str, victim: int) -> float:
        if kind == "rank":
            for _ in range(200):  # the worker may be starting: wait until it exists
                try:
                    pid = self.nodes[victim].rank_pid(0)
                    break
                except RuntimeError:
                    self.pump(time.monotonic() + 0.1)
            else:
                raise RuntimeError(f"node {victim} has no worker to kill")
            os.kill(pid, signal.SIGKILL)
            return time.monotonic()
        self.nodes[victim].stop()
        killed = time.monotonic()
        shutil.rmtree(self.folders[victim], ignore_errors=True)
        self.retired.append(self.nodes[victim])
        self.nodes[victim] = self._start(victim)
        return killed

    def stop(self) -> None:
        for nd in [*self.nodes, *self.retired]:
            nd.stop()
        for f in self.folders:
            shutil.rmtree(f, ignore_errors=True)


def is_step(e: dict) -> bool:
    return e.get("event") == "step"


def run_way(mode: str, schedule, endpoint: str, workdir: Path, a) -> dict:
    s = Storm(mode, endpoint, workdir, a.durable_every, a.k, a.quick)
    failures = []
    try:
        idx, (t0, first) = s.wait_for(is_step, 0)
        for at, kind, victim in schedule:
            s.pump(t0 + at)
            # the job has stepped since the last recovery: wait for that, if not yet
            idx, _ = s.wait_for(is_step, idx)
            killed = s.strike(kind, victim)
            # the new workers' start (a config event) divides the old run's steps from the new
            cfg, _ = s.wait_for(lambda e: e.get("event") == "config", idx + 1)
            reached = max(e["step"] for _, e in s.events[:cfg] if is_step(e))
            idx, (t_first, step) = s.wait_for(is_step, cfg)
            resume = next((e for _, e in s.events[cfg:idx] if e.get("event") == "resume"), None)
            idx, (t_prod, _) = s.wait_for(lambda e, r=reached: is_step(e) and e["step"] > r, idx)
            failures.append(
                {
                    "at_s": round(killed - t0, 1),
                    "kind": kind,
                    "node": victim,
                    "reached_step": reached,
                    "resumed_from": step["step"] - 1,
                    "tier": resume["tier"] if resume else "none",
                    "steps_redone": reached - (step["step"] - 1),
                    "recovery_s": round(t_prod - killed, 2),
                    "first_step_s": round(t_first - killed, 2),
                }
            )
            print(json.dumps({"mode": mode, **failures[-1]}), file=sys.stderr, flush=True)
        end = t0 + a.duration
        if time.monotonic() < end:
            s.pump(end)
        wall = time.monotonic() - t0
        steps = [e for t, e in s.events if is_step(e) and t <= t0 + wall]
        final = max(e["step"] for e in steps)
        healthy = [e["step_seconds"] for e in steps if "step_seconds" in e]
        saves = [e["seconds"] for _, e in s.events if e.get("event") == "checkpoint"]
        blocking = [e["blocking_seconds"] for _, e in s.events if e.get("event") == "snapshot"]
        return {
            "mode": mode,
            "wall_s": round(wall, 1),
            "first_step": first["step"],
            "final_step": final,
            "net_steps": final - first["step"],
            "median_step_seconds": round(statistics.median(healthy), 3) if healthy else None,
            "median_durable_save_seconds": round(statistics.median(saves), 3) if saves else None,
            "durable_saves": len(saves),
            "snapshots": len(blocking),
            "median_snapshot_blocking_seconds": round(statistics.median(blocking), 3) if blocking else None,
            "failures": failures,
        }
    finally:
        s.stop()


def summarise(way: dict, step_s: float) -> dict:
    goodput = way["net_steps"] * step_s / way["wall_s"]
    f = way["failures"]
    return {
        "goodput": round(goodput, 3),
        "badput": round(1 - goodput, 3),
        "failures": len(f),
        "max_steps_redone": max((x["steps_redone"] for x in f), default=0),
        "mean_steps_redone": round(statistics.mean(x["steps_redone"] for x in f), 2) if f else 0,
        "median_recovery_s": round(statistics.median(x["recovery_s"] for x in f), 2) if f else None,
        "tiers": sorted({x["tier"] for x in f}),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of storm per way")
    ap.add_argument("--every", type=float, default=60.0, help="mean seconds between failures")
    ap.add_argument("--durable-every", type=int, default=5, help="steps between durable checkpoints")
    ap.add_argument("-k", type=int, default=2, help="steps between in-memory snapshots")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="the tiny model, a rank and then a node lost")
    ap.add_argument("--json", help="write the result here too")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))  # unwind: stop the nodes
    if a.quick:  # one failure of each kind
        a.duration, a.every, a.durable_every = 45.0, 15.0, 3
        schedule = [(12.0, "rank", 1), (27.0, "node", 2)]
    else:
        schedule = storm(a.seed, a.duration, a.every)
    load_before = os.getloadavg()
    from llmtrain_trainer.cli.local import local_etcd

    ways = {}
    with tempfile.TemporaryDirectory(prefix="failure-storm-") as tmp:
        workdir = Path(tmp)
        with local_etcd(str(workdir / "etcd")) as endpoint:
            for mode in ("durable", "memory"):
                ways[mode] = run_way(mode, schedule, endpoint, workdir, a)
    step_s = ways["durable"]["median_step_seconds"]
    summary = {m: summarise(w, step_s) for m, w in ways.items()}
    save_s = ways["durable"]["median_durable_save_seconds"]
    mtbf = a.duration / max(1, len(schedule))
    result = {
        **provenance(load_before),
        "model": TINY if a.quick else {"dims": DIMS},
        "nodes": NODES,
        "storm": {"seed": a.seed, "duration_s": a.duration, "mean_every_s": a.every, "schedule": schedule},
        "durable_every_steps": a.durable_every,
        "snapshot_every_steps": a.k,
        "young_daly_durable_steps": (round(math.sqrt(2 * save_s * mtbf) / step_s, 1) if save_s and step_s else None),
        "ways": ways,
        "summary": summary,
        "badput_ratio_memory_to_durable": (
            round(summary["memory"]["badput"] / summary["durable"]["badput"], 2)
            if summary["durable"]["badput"] > 0
            else None
        ),
    }
    text = json.dumps(result, indent=2)
    if a.json:
        Path(a.json).write_text(text + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
