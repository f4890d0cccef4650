"""Grafana dashboards: generated JSON is current, Grafana's model (grafana-foundation-sdk) reads it
back without loss, every query is valid PromQL (promtool), and every metric a dashboard or an
alert rule names is one that the operator's or trainer's code registers or DCGM exporter exports.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from promql_names import metric_names, variable_query_selector

pytestmark = pytest.mark.infra

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "dashboards" / "generated"
RULES = ROOT / "dashboards" / "rules" / "llmtrain.rules.yaml"

# DCGM exporter fields the dashboards/rules use; all are in dcgm-exporter's default counter set
# (etc/default-counters.csv). Note the real name is DCGM_FI_DEV_MEM_COPY_UTIL (with DEV_).
DCGM_FIELDS = {
    "DCGM_FI_DEV_GPU_UTIL",  # GPU utilisation, %
    "DCGM_FI_DEV_MEM_COPY_UTIL",  # memory (copy engine) utilisation, %
    "DCGM_FI_DEV_XID_ERRORS",  # value of the last XID error
    "DCGM_FI_DEV_SM_CLOCK",  # SM clock, MHz
    "DCGM_FI_DEV_GPU_TEMP",  # GPU temperature, C
    "DCGM_FI_DEV_POWER_USAGE",  # power draw, W
    "DCGM_FI_DEV_FB_USED",  # framebuffer used, MiB
    "DCGM_FI_DEV_FB_FREE",  # framebuffer free, MiB
}


def _load_script():
    spec = importlib.util.spec_from_file_location("gen_dashboards", ROOT / "scripts" / "gen-dashboards.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _dashboards() -> dict[str, dict]:
    files = sorted(GENERATED.glob("*.json"))
    assert len(files) == 3, files
    return {f.stem: json.loads(f.read_text()) for f in files}


def _panels(d: dict):
    for p in d["panels"]:
        yield p
        yield from p.get("panels") or []


def _queries(d: dict) -> list[str]:
    return [t["expr"] for p in _panels(d) for t in p.get("targets") or []]


def _registered_names() -> set[str]:
    """Sample names (counter _total, histogram _bucket/_sum/_count) the code registers."""
    from prometheus_client import CollectorRegistry

    from llmtrain.controller.adapters.metrics import OperatorMetrics
    from llmtrain_trainer.metrics.prometheus import TrainerMetrics

    op, tr = CollectorRegistry(), CollectorRegistry()
    OperatorMetrics(op)
    TrainerMetrics(registry=tr, job="names", rank=0)
    names = set()
    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_sum", "_count"),
        "gauge": ("",),
        "summary": ("_sum", "_count", ""),
        "info": ("_info",),
    }
    for reg in (op, tr):
        for fam in reg.collect():
            names |= {fam.name + s for s in suffixes.get(fam.type, ("",))}
    return names


def _recorded_names() -> set[str]:
    doc = yaml.safe_load(RULES.read_text())
    return {r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r}


def _rule_exprs() -> list[str]:
    doc = yaml.safe_load(RULES.read_text())
    return [r["expr"] for g in doc["groups"] for r in g["rules"]]


def test_generated_json_is_current():
    stale = _load_script().stale_files()
    assert not stale, f"run scripts/gen-dashboards.py: {[str(p.relative_to(ROOT)) for p in stale]}"


def test_grafana_model_reads_dashboards_back_without_loss():
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models.dashboard import Dashboard

    register_default_plugins()
    for uid, data in _dashboards().items():
        model = Dashboard.from_json(data)
        again = json.loads(json.dumps(model, cls=JSONEncoder))
        assert again == data, f"{uid}: fields Grafana's model does not know or reshapes"
        assert data["uid"] == uid and data["schemaVersion"] >= 39


def test_layout_ids_datasources_and_variables():
    for uid, d in _dashboards().items():
        ids = [p["id"] for p in _panels(d)]
        assert len(ids) == len(set(ids)), f"{uid}: duplicate panel ids"
        variables = {v["name"]: v for v in d["templating"]["list"]}
        assert {"datasource", "namespace", "job"} <= set(variables), uid
        assert variables["datasource"]["query"] == "prometheus"
        used: set[str] = set()
        for p in _panels(d):
            g = p["gridPos"]
            assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, (uid, p["title"])
            if p["type"] == "row":
                continue
            assert p["targets"], (uid, p["title"])
            for t in p["targets"]:
                assert t["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, (uid, p["title"])
                used |= set(re.findall(r"\$(\w+)", t["expr"]))
        for v in variables.values():
            used |= set(re.findall(r"\$(\w+)", v.get("query") or "")) if v["type"] == "query" else set()
        builtin = {"__rate_interval", "__range", "__interval"}
        assert used - builtin - set(variables) == set(), f"{uid}: undefined variables"
        unused = set(variables) - used - {"datasource"}
        assert not unused, f"{uid}: variables no query uses: {unused}"


def _grafana_to_promql(expr: str) -> str:
    expr = expr.replace("$__rate_interval", "2m").replace("$__range", "6h").replace("$__interval", "1m")
    return re.sub(r"\$(\w+)", r".*", expr)


def test_every_query_is_valid_promql(promtool, tmp_path):
    """promtool parses each dashboard query (variables substituted) as a recording rule."""
    exprs = []
    for d in _dashboards().values():
        exprs += _queries(d)
        for v in d["templating"]["list"]:
            if v["type"] == "query":
                sel = variable_query_selector(v["query"])
                if sel:
                    exprs.append(sel)
    rules = {
        "groups": [
            {
                "name": "dashboards",
                "rules": [
                    {"record": f"dashboard:query_{i}", "expr": _grafana_to_promql(e)} for i, e in enumerate(exprs)
                ],
            }
        ]
    }
    f = tmp_path / "dashboard-queries.yaml"
    f.write_text(yaml.safe_dump(rules))
    r = subprocess.run([promtool, "check", "rules", f], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in r.stdout


def test_name_extractor_finds_the_metrics():
    assert metric_names(
        'histogram_quantile(0.95, sum by (le, llmtrain_job) (rate(a_bucket{x=~"$job"}[5m]))) '
        "/ on (ns) group_left (llmtrain_job) b offset 10m > 0.5 and time() - c:rec:avg"
    ) == {"a_bucket", "b", "c:rec:avg"}


def test_every_metric_named_by_dashboards_and_rules_is_exported():
    """Against the code's registries (operator + trainer), DCGM's documented fields and the
    rules' own recorded series."""
    known = _registered_names() | DCGM_FIELDS | _recorded_names()
    used: dict[str, set[str]] = {}
    for uid, d in _dashboards().items():
        for e in _queries(d):
            for n in metric_names(e):
                used.setdefault(n, set()).add(uid)
        for v in d["templating"]["list"]:
            if v["type"] == "query" and (sel := variable_query_selector(v["query"])):
                for n in metric_names(sel):
                    used.setdefault(n, set()).add(uid + " variables")
    for e in _rule_exprs():
        for n in metric_names(e):
            used.setdefault(n, set()).add("alert rules")
    unknown = {n: sorted(w) for n, w in used.items() if n not in known}
    assert not unknown, f"metrics nobody exports: {unknown}"
    # The list above is exactly what is used, and every trainer metric is shown somewhere.
    assert DCGM_FIELDS <= set(used), f"documented DCGM fields no query uses: {DCGM_FIELDS - set(used)}"
    trainer = {n for n in _registered_names() if n.startswith("llmtrain_trainer_")}
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in used}
    missing = {n for n in trainer if re.sub(r"_(bucket|sum|count)$", "", n) not in families}
    assert not missing, f"trainer metrics no dashboard/rule shows: {sorted(missing)}"
