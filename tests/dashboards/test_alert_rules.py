"""Alert rules: promtool syntax check, promtool unit tests, and coverage of those tests.

Every alerting rule must have at least one promtool test case where it fires (non-empty
exp_alerts) and one where it is evaluated and stays quiet (empty exp_alerts), so a rule that can
never fire or always fires is caught.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.infra

RULES = ROOT / "dashboards" / "rules" / "llmtrain.rules.yaml"
TESTS = sorted((ROOT / "dashboards" / "rules" / "tests").glob("*.test.yaml"))
CHART_RULES = ROOT / "charts" / "llmtrain-operator" / "files" / "rules" / "llmtrain.rules.yaml"

# The alerts the product promises (issue 4); renaming one is a breaking change for routing.
REQUIRED_ALERTS = {
    "LLMTrainGPUXidError",
    "LLMTrainGPUTemperatureHigh",
    "LLMTrainJobGPUsIdle",
    "LLMTrainJobNoHeartbeat",
    "LLMTrainJobStraggler",
    "LLMTrainJobMFUDrop",
    "LLMTrainCheckpointStale",
    "LLMTrainJobRestartsClimbing",
}


def _alerts() -> dict[str, dict]:
    doc = yaml.safe_load(RULES.read_text())
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}


def test_promtool_check_rules(promtool):
    r = subprocess.run([promtool, "check", "rules", RULES], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_promtool_unit_tests_pass(promtool):
    assert TESTS, "no promtool test files"
    r = subprocess.run([promtool, "test", "rules", *TESTS], capture_output=True, text=True,
                       timeout=120, cwd=RULES.parent)
    assert r.returncode == 0, r.stdout + r.stderr


def test_required_alerts_exist_with_severity_and_runbook():
    alerts = _alerts()
    assert REQUIRED_ALERTS <= set(alerts), REQUIRED_ALERTS - set(alerts)
    for name, rule in alerts.items():
        assert rule.get("labels", {}).get("severity") in ("warning", "critical"), name
        for key in ("summary", "description", "runbook"):
            assert rule.get("annotations", {}).get(key), f"{name}: missing annotation {key}"


def test_every_alert_has_a_firing_and_a_quiet_promtool_case():
    fires: set[str] = set()
    quiet: set[str] = set()
    for f in TESTS:
        doc = yaml.safe_load(f.read_text())
        assert doc["rule_files"] == ["../llmtrain.rules.yaml"], f
        for case in doc["tests"]:
            for t in case.get("alert_rule_test", []):
                (fires if t.get("exp_alerts") else quiet).add(t["alertname"])
    alerts = set(_alerts())
    assert alerts - fires == set(), f"alerts never shown firing: {sorted(alerts - fires)}"
    assert alerts - quiet == set(), f"alerts never shown quiet: {sorted(alerts - quiet)}"


def test_chart_ships_the_same_rules():
    """The chart's PrometheusRule reads files/rules/; it must be this file, byte for byte
    (scripts/gen-dashboards.py syncs it)."""
    assert CHART_RULES.read_bytes() == RULES.read_bytes(), "run scripts/gen-dashboards.py"
