"""bench/prepare_throughput.py runs end to end on a tiny corpus, so it cannot rot (no speed bound:
the machine running the tests is shared; the figures belong to a quiet run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_prepare_throughput_bench_reports_both_figures_and_the_ratio(tmp_path):
    out = tmp_path / "bench.json"
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "prepare_throughput.py"),
            "--mb",
            "0.3",
            "--rounds",
            "1",
            "--vocab",
            "600",
            "--no-threads",
            "--output",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    assert "prepare / encode_batch = " in r.stdout and "MB/s" in r.stdout
    res = json.loads(out.read_text())
    assert res["tokens"] > 0 and res["documents"] > 10
    assert res["ratio_prepare_to_encode_batch"] == pytest.approx(
        res["MBps"]["prepare (processes)"] / res["MBps"]["encode_batch"]
    )
