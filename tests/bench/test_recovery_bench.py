"""bench/recovery.py --quick: the trainer's own recovery path (SIGKILL of every process, relaunch)
runs end to end, and the benchmark's checks (resume from the newest committed checkpoint, every later
step exactly once) hold on a real CPU run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.trainer
def test_recovery_bench_quick(tmp_path):
    out = tmp_path / "recovery.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "recovery.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    (run,) = result["runs"]
    # Killed two or more steps after a committed checkpoint: some work is recomputed, none skipped.
    assert run["resumed_from"] >= 8 and run["steps_recomputed"] >= 2
    assert 0 < result["kill_to_first_step_s"]["median"] < 300
    assert result["ratio_recovery_to_cold_start"] > 0


def test_control_plane_recovery_quick(own_clusters, tmp_path):
    """bench/recovery.py --control-plane --quick: on the real chain, a pod failed through kwok becomes
    a Failed PyTorchJob, the operator starts attempt 2, 3, 4 of the same job, and every part of the
    recovery was observed in order. (About 20 s: a chain cluster start plus three recoveries.)"""
    out = tmp_path / "cp.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "recovery.py"), "--control-plane", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    scenario = result["scenarios"]["1"]
    runs = scenario["runs"]
    # The same job failed three times: attempts 2, 3 and 4, each on the real chain.
    assert [r["attempt"] for r in runs] == [2, 3, 4]
    for r in runs:
        assert len(r["new_nodes"]) == 1 and r["new_nodes"][0].startswith("kwok-p5-48xlarge-"), r
        # Each stage was seen, and the whole is the sum of its parts (they chain end to end).
        parts = [v for k, v in r.items() if k.endswith("_s") and k != "total_s"]
        assert len(parts) == 6 and abs(sum(parts) - r["total_s"]) < 1e-6, r
        # No deliberate wait: the operator's 5 s restart-backoff floor is off too (it was on, and the
        # operator's part measured 5.3 s instead of its own ~0.1 s)
        assert r["operator_new_ptj_s"] < 5.0, r
        assert 0 < r["total_s"] < 60, r
    assert scenario["jobs_with_other_than_one_live_ptj"] == {}
    assert scenario["create_to_running_s"]["n"] == 3 and scenario["ratio_recovery_to_create"] > 0
