"""`llmtrain scale-test`: the arithmetic (units), and one real run at sizes 1 and 2 (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from llmtrain.validation import parse_spec
from llmtrain_trainer.scale_test import add_efficiency, check_divisible, parse_sizes, summarize

REPO = Path(__file__).resolve().parents[2]


def test_sizes_are_sorted_unique_positive():
    assert parse_sizes("4,1,2,2") == [1, 2, 4]
    for bad in ("", "0,1", "a,2", "-1"):
        with pytest.raises(ValueError, match="comma-separated positive integers"):
            parse_sizes(bad)


def test_a_global_batch_that_does_not_split_is_refused_with_the_fix():
    spec = parse_spec({"model": {"preset": "tiny"}, "data": {"seqLen": 32}, "cluster": {"instanceType": "cpu"},
                       "training": {"globalBatchTokens": 32 * 6, "microBatchSize": 1}})
    check_divisible(spec, [1, 2, 3, 6])
    with pytest.raises(ValueError, match=r"6 sequences per step do not split over 4 worker\(s\)"):
        check_divisible(spec, [1, 2, 4])


def test_efficiency_is_per_worker_throughput_relative_to_the_smallest_size():
    def steps(tps):  # step 1 is warm-up and must not count
        return [{"step": 1, "tokens_per_second": 1.0, "mfu": 0.0, "step_seconds": 9.0}] + [
            {"step": i + 2, "tokens_per_second": v, "mfu": 0.01, "step_seconds": 0.5} for i, v in enumerate(tps)]

    rows = add_efficiency([summarize(1, steps([100, 100, 100]), warmup=1),
                           summarize(2, steps([150, 160, 170]), warmup=1)])
    assert rows[0]["tokens_per_second_per_worker"] == 100 and rows[0]["scaling_efficiency"] == 1.0
    # 2 workers: median 160 tokens/s → 80 per worker → 80% of 100
    assert rows[1]["tokens_per_second_per_worker"] == 80 and rows[1]["scaling_efficiency"] == 0.8


@pytest.mark.slow
@pytest.mark.trainer
def test_scale_test_runs_each_size_and_writes_table_json_png(tmp_path):
    out = subprocess.run([sys.executable, "-m", "llmtrain.cli", "scale-test", "examples/local/scale-test.yaml",
                          "--sizes", "1,2", "--max-steps", "5", "--warmup", "2", "--output", str(tmp_path),
                          ], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "efficiency" in out.stdout
    result = json.loads((tmp_path / "scale-test.json").read_text())
    assert [r["size"] for r in result["rows"]] == [1, 2]
    assert result["rows"][0]["scaling_efficiency"] == 1.0
    for r in result["rows"]:
        assert r["steps"] == 3 and r["tokens_per_second"] > 0
        assert r["tokens_per_second_per_worker"] == pytest.approx(r["tokens_per_second"] / r["size"], rel=1e-3)
    png = (tmp_path / "scale-test.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
