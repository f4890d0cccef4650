"""The README's headline figures are their results': every number in a row of its "Headline figures"
table is computed here from the bench/results/*.json the row summarises (the one estimate, from the
formula of bench/checkpoint_staging.py), formatted as the row writes it, and each row's figures are
also on the page the row links to and on the performance overview. A rerun whose result moves a
figure fails here until the README and the pages say the new one; a row with no source fails too.
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
OVERVIEW = ROOT / "docs" / "performance" / "index.md"

# A number as the docs write it (1,000; 0.97; 46), not part of a word (p99, FSDP2, 70B, 124M).
NUMBER = re.compile(r"(?<![\w.,])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?!\w)")


def _result(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _span(values: list[float], digits: int) -> list[str]:
    """'lo–hi' as the two numbers it shows, or one where they round alike."""
    lo, hi = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return [lo] if lo == hi else [lo, hi]


# Each row: (the numbers of its label, the numbers of its figures), in the order the row writes them.


def trainer_overhead() -> tuple[list[str], list[str]]:
    sizes = _result("trainer_overhead.json")["sizes"]
    return [], _span([sizes[s]["cpu"]["ratio_paired_median"] for s in ("small", "large")], 2)


def control_plane_recovery() -> tuple[list[str], list[str]]:
    from llmtrain.controller.policy.config import OperatorConfig

    d = _result("recovery_control_plane_merged.json")
    scenario, backoff = d["scenarios"]["200"], max(d["restart_backoff_fields_set_to_0"].values())
    s = scenario["recovery_s"]
    return [f"{scenario['running_jobs']}", f"{backoff}"], [
        f"{s['p50']:.2f}",
        f"{s['max']:.2f}",
        f"{OperatorConfig.min_restart_backoff:g}",
    ]


def trainer_recovery() -> tuple[list[str], list[str]]:
    return [], [f"{_result('recovery.json')['kill_to_first_step_s']['median']:.1f}"]


def create_to_pytorchjob() -> tuple[list[str], list[str]]:
    d = _result("operator_scale_chain_500_sm.json")
    return [f"{d['jobs']:,}", f"{d['p5_nodes']:,}"], [
        f"{d['operator']['create_to_ptj_s']['p99']:.2f}",
        f"{d['throughput_ratio']:.2f}",
    ]


def paced_runs() -> list[dict]:
    """The pacing result's runs of the operator as shipped (no --operator-arg) against Trainer v2 on a
    kube-controller-manager at Kubernetes' default QPS (no controller-manager args)."""
    runs = _result("operator_scale_jobset_pacing_1000_500.json")["runs"]
    return [
        r
        for r in runs
        if not r["controller_manager_args"] and "--operator-arg" not in r["command"] and "trainer" in r["paths"]
    ]


def jobset_vs_trainer_v2() -> tuple[list[str], list[str]]:
    runs = paced_runs()
    assert len(runs) == 2, "the row says: in two runs"
    (jobs,), (nodes,) = {r["jobs_per_phase"] for r in runs}, {r["p5_nodes"] for r in runs}

    def ratios(figure: str) -> list[float]:
        return [r["summary"][figure]["llmtrain-jobset"] / r["summary"][figure]["trainer"] for r in runs]

    return [f"{jobs:,}", f"{nodes:,}"], [
        *_span(ratios("create→all Running p99 (s)"), 2),
        *_span(ratios("jobs/s to the last all-Running"), 2),
    ]


def checkpoint_resume() -> tuple[list[str], list[str]]:
    """Each run of the old reader against the direct reader's run of the same session and number
    (alternated: f20-before-1 with f20-after-1, ...), in the sessions that ran the shipped reader
    (the result's `times_utc` says which: another session tried 4 read threads, which did not ship);
    S3: load against a plain download."""
    result = _result("checkpoint_disk_resume_alternated.json")
    shipped = {s for s, note in result["times_utc"].items() if "the committed code" in note}
    assert shipped, result["times_utc"]
    runs = {r["run"]: r["load_seconds"] for r in result["runs"] if r["run"].split("-", 1)[0] in shipped}
    speedups = [t / runs[name.replace("-before-", "-after-")] for name, t in runs.items() if "-before-" in name]
    return [], [*_span(speedups, 1), f"{_result('checkpoint_s3_direct_reader.json')['load_ratio']:.2f}"]


def planner_accuracy() -> tuple[list[str], list[str]]:
    rows = [r for r in _result("planner_accuracy.json")["rows"] if r["model"] == "124m"]
    assert {r["strategy"] for r in rows} == {"FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD"}
    return [], _span([r["ratio"] for r in rows], 2)


@cache
def _staging():
    spec = importlib.util.spec_from_file_location("checkpoint_staging", ROOT / "bench" / "checkpoint_staging.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def seventy_b_estimate() -> dict:
    """bench/checkpoint_staging.py's arithmetic at the staging rate the checkpointing page used: its
    staging term (the bench prints the rate to 2 digits and the seconds to 1, so the seconds say it
    more precisely)."""
    from llmtrain.render import TERMINATION_GRACE_SECONDS

    per_process_gb = _staging().seventy_b_arithmetic(1.0, TERMINATION_GRACE_SECONDS)["per_process_gb"]
    staging_s = float(re.search(r"staging ([\d.]+) s", _sigterm_section())[1])
    return _staging().seventy_b_arithmetic(per_process_gb / staging_s, TERMINATION_GRACE_SECONDS)


def _sigterm_section() -> str:
    page = (ROOT / "docs" / "trainer" / "checkpointing.md").read_text()
    return page.split("## Does the SIGTERM save fit the grace period?", 1)[1].split("\n## ", 1)[0]


def sigterm_save_70b() -> tuple[list[str], list[str]]:
    a = seventy_b_estimate()
    return [f"{a['checkpoint_gb'] / a['per_node_gb']:.0f}", f"{a['grace_s']}"], [f"{a['total_s']:.0f}"]


# The README row whose first cell starts with the key -> its source.
HEADLINES: dict[str, Callable[[], tuple[list[str], list[str]]]] = {
    "trainer fixed cost per step": trainer_overhead,
    "pod failed → next attempt's pods Running": control_plane_recovery,
    "trainer SIGKILL → first resumed step": trainer_recovery,
    "create → PyTorchJob p99": create_to_pytorchjob,
    "p99 create → all pods Running, llmtrain on JobSet vs Kubeflow Trainer v2": jobset_vs_trainer_v2,
    "checkpoint resume with the direct reader": checkpoint_resume,
    "`llmtrain plan` peak memory": planner_accuracy,
    "70B SIGTERM checkpoint": sigterm_save_70b,
}


def headline_rows(readme: str) -> list[tuple[str, str]]:
    """(label, figures) of each row of the README's "Headline figures" table."""
    section = readme.split("\n## Headline figures\n", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| ") and not ln.startswith("| |")]
    return [tuple(c.strip() for c in ln.strip("|").split(" | ", 1)) for ln in rows]


def numbers(cell: str) -> list[str]:
    return NUMBER.findall(re.sub(r"\]\([^)]*\)", "]", cell))


def links(cell: str) -> list[Path]:
    return [ROOT / t.split("#", 1)[0] for t in re.findall(r"\]\(([^)]+)\)", cell)]


def drift(readme: str) -> dict[str, str]:
    """Row -> what is wrong with it: a number that is not its result's, or no source for the row."""
    found: dict[str, str] = {}
    for label, figures in headline_rows(readme):
        source = next((f for key, f in HEADLINES.items() if label.startswith(key)), None)
        if source is None:
            found[label] = "no source in HEADLINES"
            continue
        want_label, want_figures = source()
        if numbers(label) != want_label or numbers(figures) != want_figures:
            found[label] = f"reads {numbers(label)} {numbers(figures)}, its result gives {want_label} {want_figures}"
    return found


def pages_missing(readme: str, page_text: Callable[[Path], str]) -> dict[str, list[str]]:
    """Row -> the figures of it that the page it links to does not give, nor, for a performance page,
    the performance overview."""
    found: dict[str, list[str]] = {}
    for label, figures in headline_rows(readme):
        pages = links(figures)
        for page in [*pages, *([OVERVIEW] if any(p.parent == OVERVIEW.parent for p in pages) else [])]:
            given = set(NUMBER.findall(page_text(page)))
            missing = [f"{page.relative_to(ROOT)}: {n}" for n in numbers(figures) if n not in given]
            found.setdefault(label, []).extend(missing)
    return {k: v for k, v in found.items() if v}


def test_every_headline_figure_is_its_results():
    readme = (ROOT / "README.md").read_text()
    assert len(headline_rows(readme)) == len(HEADLINES), "a source for every row, a row for every source"
    assert drift(readme) == {}


def test_the_pages_give_the_readmes_figures():
    assert pages_missing((ROOT / "README.md").read_text(), lambda p: p.read_text()) == {}


@pytest.mark.parametrize("key", HEADLINES)
def test_a_figure_that_drifts_from_its_result_fails(key):
    """Each row's first figure moved by one in its last digit, in a copy of the README: that row, and
    only it, is reported."""
    readme = (ROOT / "README.md").read_text()
    label, figures = next(row for row in headline_rows(readme) if row[0].startswith(key))
    first = NUMBER.search(figures)
    moved = first[0][:-1] + str((int(first[0][-1]) + 1) % 10)
    edited = readme.replace(
        f"{label} | {figures}", f"{label} | {figures[: first.start()]}{moved}{figures[first.end() :]}"
    )
    assert edited != readme
    assert list(drift(edited)) == [label]


def test_a_page_that_no_longer_gives_a_figure_fails():
    """A copy of the recovery page whose 200-job max moved: the recovery row is reported, for that page."""
    readme, page = (ROOT / "README.md").read_text(), ROOT / "docs" / "performance" / "recovery.md"
    edited = page.read_text().replace("1.18 s", "1.19 s")
    found = pages_missing(readme, lambda p: edited if p == page else p.read_text())
    assert found == {
        next(label for label, _ in headline_rows(readme) if label.startswith("pod failed")): [
            "docs/performance/recovery.md: 1.18"
        ]
    }


def test_a_row_without_a_source_fails():
    readme = (ROOT / "README.md").read_text()
    last = "| {} | {} |".format(*headline_rows(readme)[-1])
    edited = readme.replace(last, last + "\n| a figure from nowhere | **1.5×** |")
    assert drift(edited) == {"a figure from nowhere": "no source in HEADLINES"}


def test_the_recovery_figure_leaves_out_the_restart_floor():
    """The README says the operator's minimum backoff comes on top of the figure: no recovery in the
    result waited it (the runs predate it; the bench now turns it off)."""
    from llmtrain.controller.policy.config import OperatorConfig

    runs = _result("recovery_control_plane_merged.json")["scenarios"]["200"]["runs"]
    assert runs and all(r["total_s"] < OperatorConfig.min_restart_backoff for r in runs)


def test_the_70b_estimate_is_the_staging_benchs_arithmetic():
    """The checkpointing page's terms are bench/checkpoint_staging.py's, at the rate it states."""
    a, section = seventy_b_estimate(), " ".join(_sigterm_section().split())
    rate = a["per_process_gb"] / a["staging_s"]
    expected = [
        f"{a['checkpoint_gb']:.0f} GB of checkpoint",
        f"{a['per_node_gb']:.1f} GB per node",
        f"{a['per_process_gb']:.1f} GB per process",
        f"Stop ≤ {a['stop_latency_s']:.1f} s",
        f"{a['micro_batches_per_step']} micro-batches",
        f"({rate:.2f} GB/s per process",
        f"upload {a['upload_s']:.1f} s",
        f"exit {a['exit_s']:g} s",
        f"≈{a['total_s']:.0f} s against the {a['grace_s']} s grace period",
    ]
    assert [e for e in expected if e not in section] == []
