"""checkov (the pinned one from scripts/infra-checkov.sh) on what we deploy: every manifest the
chart renders with everything on, and the worker pods `llmtrain render` produces for a CPU and an
EFA GPU job. Every skipped check carries its reason in place, as a `checkov.io/skip<N>:
CKV_…=<why>` annotation on the object that needs it; nothing is skipped on the command line. The
chart's skips are in its templates. The worker pods' skips are this test's own configuration
(checkov_worker_pods.yaml), added to the test's copy of the pods: the pods users run carry no
linter annotations (issue 21)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from chart_helpers import CHARTS, ROOT

from plugins.needs import needs

pytestmark = pytest.mark.infra

ALL_ON = ["-f", CHARTS / "llmtrain-operator" / "ci" / "all-on-values.yaml", "--set", "debugTools.enabled=true"]
SKIP_KEY = re.compile(r"^checkov\.io/skip\d+$")
WORKER_POD_SKIPS = yaml.safe_load((Path(__file__).with_name("checkov_worker_pods.yaml")).read_text())

JOBS = {
    "cpu": {"model": {"preset": "tiny"}, "cluster": {"instanceType": "cpu"}, "fsdp": {"mixedPrecision": "fp32"}},
    "p5": {"model": {"preset": "llama2-7b", "hfTokenSecretRef": {"name": "hf"}},
           "data": {"uri": "s3://b/t/", "seqLen": 4096}, "cluster": {"instanceType": "p5.48xlarge", "nodes": 2}},
}


@pytest.fixture(scope="module")
@needs("tools")
def checkov() -> Path:
    r = subprocess.run(["bash", str(ROOT / "scripts" / "infra-checkov.sh")], cwd=ROOT, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return Path(r.stdout.strip().splitlines()[-1])


def rendered_worker_pods() -> list[dict]:
    from llmtrain.backends.pytorchjob import render_pytorchjob
    from llmtrain.validation import parse_spec

    pods = []
    for name, raw in JOBS.items():
        ptj = render_pytorchjob(parse_spec(raw), f"ck-{name}", "llmtrain-jobs", default_etcd_endpoint="e.x.svc:2379")
        tpl = ptj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
        pods.append({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": f"ck-{name}-worker-0", "namespace": "llmtrain-jobs", **tpl["metadata"]},
                     "spec": tpl["spec"]})
    return pods


def worker_pods() -> list[dict]:
    """The rendered pods, with this test's skips (and their reasons) added as checkov annotations."""
    from llmtrain.catalog import instance_types

    pods = rendered_worker_pods()
    for pod, raw in zip(pods, JOBS.values()):
        table = dict(WORKER_POD_SKIPS["all"])
        if instance_types()[raw["cluster"]["instanceType"]].efa_interfaces:
            table.update(WORKER_POD_SKIPS["efa"])
        if raw["model"].get("hfTokenSecretRef"):
            table.update(WORKER_POD_SKIPS["hf_token_secret"])
        annotations = pod["metadata"].setdefault("annotations", {})
        annotations.update({f"checkov.io/skip{i}": f"{check}={why}" for i, (check, why) in enumerate(table.items(), 1)})
    return pods


def test_rendered_worker_pods_carry_no_linter_annotations():
    for pod in rendered_worker_pods():
        found = [k for k in (pod["metadata"].get("annotations") or {}) if k.startswith("checkov.io")]
        assert not found, f"{pod['metadata']['name']}: {found}"


def skips(doc: dict) -> dict[str, str]:
    """check id → reason, from the object's annotations (and its pod template's)."""
    out = {}
    metas = [doc.get("metadata") or {}, ((doc.get("spec") or {}).get("template") or {}).get("metadata") or {}]
    for meta in metas:
        for key, value in (meta.get("annotations") or {}).items():
            if SKIP_KEY.match(key):
                check, _, reason = value.partition("=")
                out[check] = reason
    return out


@pytest.mark.slow
def test_chart_and_worker_pods_pass_checkov(checkov, helm, tmp_path):
    chart_docs = helm.manifests(*ALL_ON)
    (tmp_path / "chart.yaml").write_text(yaml.safe_dump_all(chart_docs))
    (tmp_path / "pods.yaml").write_text(yaml.safe_dump_all(worker_pods()))
    r = subprocess.run([str(checkov), "-d", str(tmp_path), "--framework", "kubernetes", "-o", "json", "--quiet",
                        "--compact"], capture_output=True, text=True, timeout=600)
    reports = json.loads(r.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    failed = [f"{c['check_id']} {c['resource']}: {c['check_name']}"
              for rep in reports for c in rep["results"]["failed_checks"]]
    assert not failed, "\n".join(failed)
    passed = sum(rep["summary"]["passed"] for rep in reports)
    skipped = [c for rep in reports for c in rep["results"].get("skipped_checks", [])]
    assert passed > 100, r.stdout[-2000:]  # it really scanned the Deployment, StatefulSet, pods...
    assert sum(rep["summary"]["skipped"] for rep in reports) >= 20  # the in-place skips were read
    for c in skipped:  # each skip is one of ours, with a reason
        assert len(c.get("suppress_comment") or "") >= 20, c


def test_every_skip_in_the_sources_carries_a_real_reason():
    found = {}
    for f in (CHARTS / "llmtrain-operator").rglob("templates/*.yaml"):
        for m in re.finditer(r'checkov\.io/skip\d+: "(CKV\w+)=([^"]*)"', f.read_text()):
            found[(f.name, m.group(1))] = m.group(2)
    for table in WORKER_POD_SKIPS.values():
        found.update({("checkov_worker_pods.yaml", k): v for k, v in table.items()})
    assert len(found) >= 20
    for (where, check), why in found.items():
        assert len(why.strip()) >= 30, f"{where}: {check} skipped without a real reason"
