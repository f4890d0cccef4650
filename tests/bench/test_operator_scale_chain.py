"""bench/operator_scale.py --nodes: on the real chain, more one-node p5 jobs than simulated p5 nodes.
Exactly as many jobs as there are nodes reach Running (the scheduler places one per node, the rest
stay Pending), both when the bench creates the rendered PyTorchJobs itself and through the operator,
and clean-up removes every PyTorchJob and pod. With ``--baseline-tree`` (here this commit's operator
and charts, exported to another directory) the two trees' operators alternate on the same cluster,
each phase measured the same way, and ``--readopt`` times the resume after a SIGKILL."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_operator_scale_on_simulated_p5_nodes(own_clusters, tmp_path):
    baseline = tmp_path / "baseline"
    baseline.mkdir()
    archive = subprocess.run(
        ["git", "archive", "HEAD", "operator", "charts"], cwd=REPO, capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(baseline)], input=archive.stdout, check=True)
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "operator_scale.py"),
            "--nodes",
            "6",
            "--jobs",
            "9",
            "--threads",
            "3",
            "--settle",
            "5",
            "--timeout",
            "240",
            "--baseline-tree",
            str(baseline),
            "--repeat",
            "1",
            "--readopt",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    assert out["p5_nodes"] == 6 and out["jobs"] == 9
    for phase in ("direct", "operator"):
        r = out[phase]
        assert r["create_to_ptj_s"]["n"] == 9, r
        assert r["reached_running"] == 6, r  # one job per node; three cannot fit
        assert r["create_to_running_s"]["n"] == 6 and 0 < r["create_to_running_s"]["p50"] < 120, r
        assert r["cleanup_s"] > 0
    assert out["throughput_ratio"] > 0 and out["operator"]["operator_peak_rss_mib"] > 0
    assert [p["tree"] for p in out["phases"]] == ["baseline", "current"]
    for p in out["phases"]:
        assert p["reached_running"] == 6 and p["operator_cpu_ms_per_job"] > 0 and p["readopt_s"] > 0, p
    assert out["operator"] is not None and out["operator"]["readopt_s"] == out["phases"][-1]["readopt_s"]
    c = out["comparison"]["create_to_ptj_p99_s"]
    assert c["current_over_baseline"] == c["median"]["current"] / c["median"]["baseline"] > 0
