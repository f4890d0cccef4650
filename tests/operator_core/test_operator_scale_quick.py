"""bench/operator_scale.py --quick against the session's dev cluster: the bench itself works, and at
small scale the operator loses and duplicates nothing and re-adopts every job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def test_operator_scale_quick(dev_cluster):
    out = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "operator_scale.py"),
            "--quick",
            "--kubeconfig",
            str(dev_cluster.kubeconfig),
            "--timeout",
            "120",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["jobs"] == 20
    assert (result["lost"], result["duplicated"]) == (0, 0)
    assert 0 < result["create_to_ptj_p50_s"] <= result["create_to_ptj_p99_s"] < 60
    assert result["direct_jobs_per_s"] > 0 and result["throughput_ratio"] > 0
    assert result["readopt_s"] > 0 and result["cleanup_s"] >= 0
    assert 1 <= result["api_requests_per_job"] < 50
