"""The recovery page's words about in-memory snapshots hold for the planner's figures its generated
block shows (scripts/snapshot_case_study.py; the block itself is compared by
test_generated_docs.py): a planner change that turns a claim false fails here until the words
change, and the default stays off while the plan shows no gain at Llama 3's rate."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "performance" / "recovery.md"


def _study():
    sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location("snapshot_case_study", ROOT / "scripts" / "snapshot_case_study.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _runs():
    from llmtrain.snapshot_plan import snapshot_plan

    return {
        (name, scale): snapshot_plan(spec, failure_scale=scale) for name, spec in _study().cases() for scale in (1, 16)
    }


def test_the_page_has_the_generated_block_once():
    study, text = _study(), PAGE.read_text()
    assert text.count(study.BEGIN) == text.count(study.END) == 1
    section = text.split("## Recovery from memory (on paper)", 1)[1]
    assert study.BEGIN in section and "off by default" in section


def test_host_memory_and_the_network_are_not_the_limit_on_p5():
    for sp in _runs().values():
        assert sp.host.fits and sp.host.total_bytes < 0.25 * sp.host.node_bytes
        assert sp.replication_seconds < 1.0


def test_where_it_pays_and_where_it_does_not():
    runs = {key: sp.run for key, sp in _runs().items()}
    b70, b405 = (name for name, _ in _study().cases())
    assert runs[b70, 1].goodput < runs[b70, 1].durable.goodput  # "the snapshots cost more than they save"
    assert abs(runs[b405, 1].goodput - runs[b405, 1].durable.goodput) < 0.002  # "hardly moves"
    assert runs[b405, 16].goodput - runs[b405, 16].durable.goodput > 0.01  # "gains points of goodput"
    for run in runs.values():  # "badput does not halve on paper"
        assert (1 - run.goodput) > 0.5 * (1 - run.durable.goodput)


def test_validation_refuses_the_job_whose_memory_is_short():
    from llmtrain.validation import check

    problems = check(_study().short_case(), "j", "etcd:2379")
    assert [p.field for p in problems] == ["spec.cluster"], problems
    assert problems[0].reason.startswith("the in-memory snapshots (spec.checkpoint.memory) need")
