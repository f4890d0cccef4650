"""docs/reference/state-machine.md is generated from the decide table; the checked-in page must be
what the generator writes now (run scripts/gen-state-diagram.py after changing a situation)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_state_diagram", ROOT / "scripts" / "gen-state-diagram.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_state_diagram_page_is_generated_from_the_decide_table():
    assert _generator().stale_files() == [], "run scripts/gen-state-diagram.py"


def test_every_reason_a_situation_writes_is_in_the_diagram():
    from llmtrain.controller.decide import SITUATIONS

    page = (ROOT / "docs" / "reference" / "state-machine.md").read_text()
    reasons = {t.reason.value for rule in SITUATIONS for t in rule.transitions if t.reason is not None}
    assert {"RestartBudgetExhausted", "StartupTimeout", "Hang", "PreflightFailed", "Resumed"} <= reasons
    assert all(r in page for r in reasons)
    assert "stateDiagram-v2" in page
