"""Pages say what is true now (history goes to bench/results/*.json and short CHANGELOG entries):

- what the docs say about a restart backoff of 0 is what the operator does (its floor,
  ``--min-restart-backoff-seconds``), not "at once";
- the performance pages compare with no old commit (``git worktree add``, commit ids): a page gives
  the latest result and its command;
- the performance overview's build-and-test figures are the ones of the build-and-test page;
- the CHANGELOG's entries are short.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_zero_restart_backoff_is_the_operators_floor():
    from llmtrain.controller.config import OperatorConfig
    from llmtrain.spec import ResilienceSpec

    floor = f"{OperatorConfig.min_restart_backoff:g} s"
    described = ResilienceSpec.model_fields["restart_backoff_seconds"].description
    lifecycle = (ROOT / "docs" / "concepts" / "lifecycle.md").read_text()
    backoff = lifecycle.split("**Restart backoff**", 1)[1].split("\n- **", 1)[0]
    for text in (" ".join(described.split()), " ".join(backoff.split())):
        assert "at once" not in text.split("spend no restart", 1)[0], text
        assert "--min-restart-backoff-seconds" in text, text
        assert floor in text, text
