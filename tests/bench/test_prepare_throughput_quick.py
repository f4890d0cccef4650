"""bench/prepare_throughput.py runs end to end on a small corpus of code, so it cannot rot, and holds
prepare's cost against `encode_batch`'s, in process and as the command a user runs.

The bounds are on CPU seconds per MB, not on wall time: the machine running the tests is shared, and
CPU time moves far less with a neighbour's load. On these 5 MB of the standard library's sources
the command costs 1.3× encode_batch's CPU (its start-up and its workers' are a fifth of that); when
its workers tokenized with `encode_batch` instead of `encode_batch_fast` it cost 1.5×."""

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
            "--corpus",
            "python",
            "--mb",
            "5",
            "--rounds",
            "3",
            "--vocab",
            "2000",
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
    cpu = res["cpu_s_per_mb"]
    assert res["cpu_ratio_prepare_to_encode_batch"] <= 1.15, (
        f"prepare took {cpu['prepare (processes)']:.2f} CPU s/MB, encode_batch {cpu['encode_batch']:.2f}: "
        f"{res['cpu_ratio_prepare_to_encode_batch']:.2f}×, over the 1.15× bound\n{r.stdout}"
    )
    assert res["cpu_ratio_cli_to_encode_batch"] <= 1.42, (
        f"`llmtrain prepare` took {cpu['prepare (CLI)']:.2f} CPU s/MB, encode_batch {cpu['encode_batch']:.2f}: "
        f"{res['cpu_ratio_cli_to_encode_batch']:.2f}×, over the 1.42× bound\n{r.stdout}"
    )
