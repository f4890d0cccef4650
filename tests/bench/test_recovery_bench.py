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
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "recovery.py"), "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    (run,) = result["runs"]
    # Killed two or more steps after a committed checkpoint: some work is recomputed, none skipped.
    assert run["resumed_from"] >= 8 and run["steps_recomputed"] >= 2
    assert 0 < result["kill_to_first_step_s"]["median"] < 300
    assert result["ratio_recovery_to_cold_start"] > 0
