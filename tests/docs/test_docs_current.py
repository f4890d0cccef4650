"""Pages say what is true now (history goes to bench/results/*.json and short CHANGELOG entries):

- what the docs say about a restart backoff of 0 is what the operator does (its floor,
  ``--min-restart-backoff-seconds``), not "at once";
- the performance overview's build-and-test figures are the ones of the build-and-test page;
- the performance pages compare with no old commit (``git worktree add``, commit ids): a page gives
  the latest result and its command;
- the CHANGELOG's entries are short.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PERF = ROOT / "docs" / "performance"


def test_a_zero_restart_backoff_is_the_operators_floor():
    from llmtrain.controller.policy.config import OperatorConfig
    from llmtrain.spec import ResilienceSpec

    floor = f"{OperatorConfig.min_restart_backoff:g} s"
    described = ResilienceSpec.model_fields["restart_backoff_seconds"].description
    lifecycle = (ROOT / "docs" / "concepts" / "lifecycle.md").read_text()
    backoff = lifecycle.split("**Restart backoff**", 1)[1].split("\n- **", 1)[0]
    for text in (" ".join(described.split()), " ".join(backoff.split())):
        assert "at once" not in text.split("spend no restart", 1)[0], text
        assert "--min-restart-backoff-seconds" in text, text
        assert floor in text, text


def test_performance_pages_compare_with_no_old_commit():
    commit = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
    found = {
        page.name: sorted(set(commit.findall(text)) | ({"git worktree"} if "git worktree" in text else set()))
        for page in sorted(PERF.glob("*.md"))
        if (text := page.read_text()) and (commit.search(text) or "git worktree" in text)
    }
    assert not found, found


def test_the_overview_gives_the_build_and_test_pages_figures():
    overview = (PERF / "index.md").read_text()
    row = next(ln for ln in overview.splitlines() if ln.startswith("| `make test`"))
    page = (PERF / "build-and-test.md").read_text()
    figures = re.findall(r"\*\*([^*]+)\*\*", row)
    assert figures, row
    assert all(f in page for f in figures), (figures, row)


def test_the_changelogs_entries_are_short():
    text = (ROOT / "CHANGELOG.md").read_text()
    unreleased = text.split("## [Unreleased]", 1)[1].split("\n## [", 1)[0]
    entries: list[list[str]] = []
    for line in unreleased.splitlines():
        if line.startswith("- "):
            entries.append([line])
        elif line.startswith("  ") and entries:
            entries[-1].append(line)
    assert entries
    long = [e[0][:80] for e in entries if len(e) > 3]
    assert not long, long
    assert len(unreleased.splitlines()) <= 150
