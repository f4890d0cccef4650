"""The operator-scale page's table of the three backends is its result's: every cell is computed
here from bench/results/operator_scale_job_peer_100.json, formatted as the table writes it."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "performance" / "operator-scale.md"
RESULT = ROOT / "bench" / "results" / "operator_scale_job_peer_100.json"
PATHS = ("llmtrain-jobset", "llmtrain-pytorchjob", "llmtrain-job")
# the table's rows: (its label, the summary's figure, digits)
ROWS = (
    ("create → all pods Running p50 (s)", "create→all Running p50 (s)", 2),
    ("create → all pods Running p99 (s)", "create→all Running p99 (s)", 2),
    ("jobs/s to the last job Running", "jobs/s to the last all-Running", 2),
    ("CPU per job above idle, every process (ms)", "CPU per job above idle, all processes (ms)", 0),
    ("llmtrain operator CPU per job above idle (ms)", "llmtrain operator CPU per job above idle (ms)", 1),
)


def test_the_three_backends_table_is_its_results():
    summary = json.loads(RESULT.read_text())["result"]["summary"]
    text = PAGE.read_text()
    start = text.index("| figure (median over phases) | llmtrain-jobset | llmtrain-pytorchjob | llmtrain-job |")
    table = {
        cells[0]: cells[1:]
        for line in text[start:].split("\n\n", 1)[0].splitlines()[2:]
        if (cells := [c.strip() for c in line.strip("|").split("|")])
    }
    for label, figure, digits in ROWS:
        row = summary[figure]
        want = [f"{row[p]:.{digits}f}" for p in PATHS] + [f"{row['llmtrain-job'] / row['llmtrain-jobset']:.2f}×"]
        assert table[label] == want, (label, table[label], want)
    assert set(table) == {label for label, _, _ in ROWS}
