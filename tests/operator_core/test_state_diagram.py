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
    from llmtrain.controller.policy.decide import SITUATIONS

    page = (ROOT / "docs" / "reference" / "state-machine.md").read_text()
    reasons = {t.reason.value for rule in SITUATIONS for t in rule.transitions if t.reason is not None}
    assert {"RestartBudgetExhausted", "StartupTimeout", "Hang", "PreflightFailed", "Resumed"} <= reasons
    assert all(r in page for r in reasons)
    assert "stateDiagram-v2" in page


def test_the_situations_table_renders_as_written():
    """The table's cells read in a browser as they do in the source: Markdown must not turn a
    state's name into emphasis (mermaid's start state, ``[*]``, did: "*[] → Pending (Created); []*")."""
    import html
    import re

    import markdown

    page = (ROOT / "docs" / "reference" / "state-machine.md").read_text()
    table = page.split("## The situations, in the order they are tried", 1)[1]
    rendered = markdown.markdown(table, extensions=["tables"])
    cells = re.findall(r"<td>(.*?)</td>", rendered, re.S)
    assert len(cells) > 20, rendered[:500]
    assert not [c for c in cells if re.search(r"<(em|strong)>", c)]
    transitions = [html.unescape(re.sub(r"<[^>]+>", "", c)) for c in cells[3::4]]
    assert "new job → Pending (Created)" in transitions[3], transitions[3]
    assert not [t for t in transitions if "[" in t or "]" in t], transitions
