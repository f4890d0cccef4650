"""bench/operator_scale.py's phase order and tree comparison, without a cluster."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import operator_scale  # noqa: E402


def test_without_a_baseline_the_direct_phase_then_this_trees_operator():
    a = argparse.Namespace(baseline_tree=None, repeat=3)
    assert operator_scale.chain_phases(a) == [("direct", None), ("operator", operator_scale.REPO)]


def test_baseline_and_current_alternate_abba_so_a_drift_weighs_on_both(tmp_path):
    a = argparse.Namespace(baseline_tree=tmp_path, repeat=4)
    labels = [label for label, _ in operator_scale.chain_phases(a)]
    assert labels == ["direct"] + ["baseline", "current", "current", "baseline"] * 2
    # each tree runs as often, and on average at the same position in the run
    positions = {t: [i for i, label in enumerate(labels) if label == t] for t in ("baseline", "current")}
    assert sum(positions["baseline"]) == sum(positions["current"])


def test_compare_takes_each_trees_median_in_run_order():
    def phase(tree, p99, cpu):
        return {
            "tree": tree,
            "create_to_ptj_s": {"p99": p99},
            "jobs_per_s": 10.0,
            "operator_cpu_ms_per_job": cpu,
            "create_to_running_s": {"p50": 1.0},
            "readopt_s": 2.0,
        }

    phases = [
        phase("baseline", 2.0, 10),
        phase("current", 1.0, 30),
        phase("current", 3.0, 12),
        phase("baseline", 4.0, 14),
    ]
    c = operator_scale.compare_trees(phases)
    assert c["create_to_ptj_p99_s"]["baseline"] == [2.0, 4.0] and c["create_to_ptj_p99_s"]["current"] == [1.0, 3.0]
    assert c["create_to_ptj_p99_s"]["current_over_baseline"] == 2.0 / 3.0
    assert c["operator_cpu_ms_per_job"]["median"] == {"baseline": 12, "current": 21}
    assert c["readopt_s"]["current_over_baseline"] == 1.0
