"""The generated references (scripts/gen-docs.py) match their sources: the API from spec.py, the CLI
from its argparse parser, the metrics from the prometheus-client registries, the Helm values from the
`# --` comments of values.yaml. Regenerate with `.venv/bin/python scripts/gen-docs.py`."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _gen():
    sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen-docs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generated_references_are_up_to_date():
    gen = _gen()
    import generated_files

    stale = generated_files.stale(gen.expected_files())
    assert not stale, f"run scripts/gen-docs.py: {[str(p.relative_to(ROOT)) for p in stale]}"


def test_api_reference_lists_every_spec_field():
    """Independent of the generator: every wire field name of every spec model appears in the page."""
    from pydantic import BaseModel

    from llmtrain import spec

    text = (ROOT / "docs" / "reference" / "api.md").read_text()
    models = [
        m
        for m in vars(spec).values()
        if isinstance(m, type)
        and issubclass(m, BaseModel)
        and m.__module__ == spec.__name__
        and not m.__name__.startswith("_")
    ]
    missing = [
        f"{m.__name__}.{f.alias or n}"
        for m in models
        for n, f in m.model_fields.items()
        if f"| `{f.alias or n}` |" not in text
    ]
    assert not missing, missing


def test_cli_reference_has_every_subcommand():
    from llmtrain.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    text = (ROOT / "docs" / "reference" / "cli.md").read_text()
    assert [n for n in sub.choices if f"## llmtrain {n}\n" not in text] == []


def test_metrics_reference_has_what_the_dashboards_query():
    """Every llmtrain_* series an alert rule queries is in the metrics page (by its family name)."""
    text = (ROOT / "docs" / "reference" / "metrics.md").read_text()
    documented = set(re.findall(r"`(llmtrain_[a-z0-9_]+)`", text))
    rules = (ROOT / "dashboards").rglob("*.y*ml")
    queried = {n for f in rules for n in re.findall(r"\bllmtrain_(?:operator|trainer)_[a-z0-9_]+", f.read_text())}
    base = {re.sub(r"_(bucket|sum|count)$", "", n) for n in queried}
    assert not [n for n in base if n not in documented], sorted(base - documented)


def test_every_helm_value_is_documented():
    """Every leaf of values.yaml (or a mapping documented as a whole) has a `# --` description, and every
    top-level key appears in the chart README."""
    gen = _gen()
    rows = gen.values_rows((ROOT / "charts" / "llmtrain-operator" / "values.yaml").read_text())
    assert [k for k, _, d in rows if not d] == []
    values = yaml.safe_load((ROOT / "charts" / "llmtrain-operator" / "values.yaml").read_text())
    readme = (ROOT / "charts" / "llmtrain-operator" / "README.md").read_text()
    assert [k for k in values if not re.search(rf"\| `{re.escape(k)}(\.|`)", readme)] == []
