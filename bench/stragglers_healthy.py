"""No false straggler verdicts: a healthy multi-rank CPU run, scored the way the operator scores it.

One `llmtrain_trainer.launch` torchrun of `--nproc` workers (gloo, CPU; no rank slowed) trains the tiny
model for `--minutes`; rank 0's /metrics is read every `--every` seconds with the operator's own parse
and verdict (llmtrain/stragglers.py) at the default threshold (1.2) and at `--threshold`. Reported:
the score and slowdown distribution of every exported rank over every window seen, the windows with
a verdict (and their longest run on one node, against the operator's default durationMinutes: 10),
and the load average while it ran. Run it nice'd beside the other work of the machine; it is not
part of `make test`.

    nice -n 10 .venv/bin/python bench/stragglers_healthy.py --minutes 10 --json bench/results/stragglers_healthy.json
    .venv/bin/python bench/stragglers_healthy.py --quick     # a smoke run for the test suite

`--windows N` ends the run once N distinct windows have been read (`--minutes` still bounds it).
`--quick`: 2 processes until 4 windows are read (at least 80 steps, past one rolling span), within
3 minutes. A smoke run needs a few windows, not a fixed time: a fixed 25 s trained for all of it on a
quiet machine, and at load 11 ended before the first window (no windows: the check failed).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from ports import free_port, metrics_port

REPO = Path(__file__).resolve().parents[1]


def job_spec(nproc: int) -> dict:
    return {
        "model": {"preset": "tiny"},
        "data": {"uri": "synthetic", "seqLen": 64},
        "cluster": {"instanceType": "cpu", "processesPerNode": nproc},
        "fsdp": {"shardingStrategy": "FULL_SHARD", "mixedPrecision": "fp32", "activationCheckpointing": "none"},
        "training": {"maxSteps": 10**7, "globalBatchTokens": 64 * 2 * nproc, "microBatchSize": 2},
        "checkpoint": {"intervalMinutes": 60},
        "rendezvous": {"backend": "c10d"},
    }


def _q(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main(argv: list[str] | None = None) -> int:
    from llmtrain.stragglers import parse, verdict

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--nproc", type=int, default=3)
    p.add_argument("--every", type=float, default=2.0, help="seconds between reads of rank 0's /metrics")
    p.add_argument("--threshold", type=float, default=1.2)
    p.add_argument("--json", help="also write the result here")
    p.add_argument("--windows", type=int, default=0, help="stop once this many windows were read (0: run --minutes)")
    p.add_argument(
        "--quick", action="store_true", help="2 processes, 4 windows within 3 minutes (a smoke run, not a measurement)"
    )
    a = p.parse_args(argv)
    if a.quick:
        a.minutes, a.nproc, a.every, a.windows = 3.0, 2, 0.5, 4
    # The trainer runs in its own session (so it can be stopped as a group): `kill` must unwind
    # through the `finally` below that stops it, or it trains on, orphaned, for 10 million steps.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))

    port = metrics_port()
    seen: dict[tuple, dict] = {}  # one entry per window (its exported figures), in order
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        spec_file = Path(tmp) / "spec.json"
        spec_file.write_text(json.dumps(job_spec(a.nproc)))
        env = dict(os.environ, OMP_NUM_THREADS="1", LLMTRAIN_METRICS_PORT=port, LLMTRAIN_JOB_NAME="healthy")
        env["LLMTRAIN_CHECKPOINT_STAGING"] = str(Path(tmp) / "staging")
        cmd = [sys.executable, "-m", "llmtrain_trainer.launch", "--nnodes=1", f"--nproc-per-node={a.nproc}"]
        cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-id=healthy"]
        cmd += ["-m", "llmtrain_trainer", "--spec", str(spec_file)]
        errf = open(Path(tmp) / "stderr", "w+")
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=errf, start_new_session=True)
        start = time.monotonic()
        try:
            while time.monotonic() - start < a.minutes * 60 and not (a.windows and len(seen) >= a.windows):
                time.sleep(a.every)
                if proc.poll() is not None:
                    errf.seek(0)
                    sys.exit(f"the workers exited ({proc.returncode}):\n{errf.read()[-4000:]}")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                        window = parse(r.read())
                except OSError:
                    continue
                if window.ranks:
                    key = tuple((r.rank, r.node, r.score, r.slowdown) for r in window.ranks)
                    seen.setdefault(key, {"at": round(time.monotonic() - start, 1), "ranks": window.ranks})
                loads.append(os.getloadavg()[0])
        finally:
            ran_s = time.monotonic() - start
            os.killpg(proc.pid, 15)
            proc.wait(60)
            errf.close()
    windows = list(seen.values())
    scores = [r.score for w in windows for r in w["ranks"]]
    slowdowns = [r.slowdown for w in windows for r in w["ranks"]]
    out: dict = {
        "what": "healthy run, no rank slowed: straggler scores of every window rank 0 exported",
        "minutes": a.minutes,
        "seconds": round(ran_s, 1),
        "nproc": a.nproc,
        "windows": len(windows),
        "load_average": [round(min(loads), 1), round(max(loads), 1)],
    }
    if scores:
        out["score"] = {
            "p50": round(statistics.median(scores), 3),
            "p90": round(_q(scores, 0.9), 3),
            "p99": round(_q(scores, 0.99), 3),
            "max": round(max(scores), 3),
        }
        out["slowdown"] = {"p50": round(statistics.median(slowdowns), 3), "max": round(max(slowdowns), 3)}
    for threshold in sorted({1.2, a.threshold}):
        flagged = [w for w in windows if verdict(w["ranks"], threshold) is not None]
        out[f"verdicts_at_{threshold:g}"] = len(flagged)
        out[f"verdict_windows_at_{threshold:g}"] = [
            {"at": w["at"], "rank": verdict(w["ranks"], threshold).rank} for w in flagged[:20]
        ]
    print(json.dumps(out))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
