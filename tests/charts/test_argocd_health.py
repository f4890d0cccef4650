"""The Argo CD health check for LLMTrainingJob, run by a real Lua 5.1 interpreter (Argo CD's Lua is
gopher-lua, 5.1 semantics) against Argo's own test layout, and the Application examples' shape."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.infra

ROOT = Path(__file__).resolve().parents[2]
ARGO = ROOT / "examples" / "argocd"
HEALTH = ARGO / "health" / "llmtrain.dev" / "LLMTrainingJob"
PHASES = {"Pending", "Running", "Restarting", "Suspended", "Succeeded", "Failed"}


def _to_lua(lua, value):
    if isinstance(value, dict):
        return lua.table_from({k: _to_lua(lua, v) for k, v in value.items()})
    if isinstance(value, list):
        return lua.table_from([_to_lua(lua, v) for v in value])
    return value


def run_health(obj: dict) -> dict:
    from lupa.lua51 import LuaRuntime

    lua = LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = _to_lua(lua, obj)
    # Argo CD runs the script as a chunk; `return hs` ends it.
    result = lua.execute((HEALTH / "health.lua").read_text())
    return {"status": result["status"], "message": result["message"]}


CASES = yaml.safe_load((HEALTH / "health_test.yaml").read_text())["tests"]


@pytest.mark.parametrize("case", CASES, ids=[Path(c["inputPath"]).stem for c in CASES])
def test_health_check_maps_each_case(case):
    obj = yaml.safe_load((HEALTH / case["inputPath"]).read_text())
    assert run_health(obj) == case["healthStatus"]


def test_every_phase_is_covered_and_mapped_sensibly():
    seen = {}
    for case in CASES:
        obj = yaml.safe_load((HEALTH / case["inputPath"]).read_text())
        phase = (obj.get("status") or {}).get("phase")
        conds = (obj.get("status") or {}).get("conditions") or []
        if phase and obj["metadata"].get("generation") == obj["status"].get("observedGeneration") and not conds:
            seen[phase] = case["healthStatus"]["status"]
    assert seen == {"Pending": "Progressing", "Running": "Healthy", "Restarting": "Progressing",
                    "Suspended": "Suspended", "Succeeded": "Healthy", "Failed": "Degraded"}
    assert set(seen) == PHASES


def test_unknown_phase_is_unknown_not_healthy():
    obj = {"metadata": {"generation": 1}, "status": {"phase": "Exploded", "observedGeneration": 1}}
    assert run_health(obj)["status"] == "Unknown"


def test_phases_match_the_operator():
    from llmtrain.status import Phase

    assert {p.value for p in Phase} == PHASES


def test_argocd_cm_embeds_the_same_script():
    cm = yaml.safe_load((ARGO / "argocd-cm.yaml").read_text())
    assert cm["data"]["resource.customizations.health.llmtrain.dev_LLMTrainingJob"] == (HEALTH / "health.lua").read_text()


def test_applications_point_at_real_paths():
    op = yaml.safe_load((ARGO / "llmtrain-operator-application.yaml").read_text())
    jobs = yaml.safe_load((ARGO / "llmtrain-jobs-application.yaml").read_text())
    for app in (op, jobs):
        assert app["kind"] == "Application" and app["apiVersion"] == "argoproj.io/v1alpha1"
        assert (ROOT / app["spec"]["source"]["path"]).is_dir()
    assert (ROOT / op["spec"]["source"]["path"] / "Chart.yaml").is_file()
    # Operator (and its CRDs) before jobs.
    wave = lambda a: int(a["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"])  # noqa: E731
    assert wave(op) < wave(jobs)
    # The jobs directory holds LLMTrainingJobs.
    src = ROOT / jobs["spec"]["source"]["path"]
    kinds = {yaml.safe_load(f.read_text()).get("kind") for f in src.glob(jobs["spec"]["source"]["directory"]["include"])}
    assert kinds == {"LLMTrainingJob"}
    assert jobs["spec"]["syncPolicy"]["automated"]["prune"] is False


def test_operator_application_values_pass_the_chart_schema(helm, tmp_path):
    op = yaml.safe_load((ARGO / "llmtrain-operator-application.yaml").read_text())
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(op["spec"]["source"]["helm"]["valuesObject"]))
    helm.template("-f", values, release=op["spec"]["source"]["helm"]["releaseName"],
                  namespace=op["spec"]["destination"]["namespace"])
