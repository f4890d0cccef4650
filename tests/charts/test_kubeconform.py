"""kubeconform (built from its Go module by scripts/install-kubeconform.sh) validates, in strict mode,
every manifest the chart renders under several value sets, the chart's CRDs, and the PyTorchJob
`llmtrain render` makes for every example, against Kubernetes 1.36's schemas and the CRDs' own.

Where the schemas come from (kube_json_schemas.py): the dev cluster's kube-apiserver v1.36.3
publishes its /openapi/v2, which holds every built-in kind and every installed CRD (the chart's
crds/: LLMTrainingJob; Kubeflow's PyTorchJob; and the Prometheus Operator CRDs the
script takes from the pinned prometheus-operator Go module). No kind is skipped: a manifest whose
kind has no schema fails."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from chart_helpers import CHARTS, ROOT
from kube_json_schemas import generate

from plugins.needs import needs

pytestmark = [pytest.mark.infra, pytest.mark.slow]

CHART_CI = CHARTS / "llmtrain-operator" / "ci"
VALUE_SETS = {
    "default": [],
    "all-on": ["-f", CHART_CI / "all-on-values.yaml"],
    "namespaced": ["-f", CHART_CI / "namespaced-values.yaml"],
    "etcd-persistent-no-netpol": ["--set", "etcd.enabled=true", "--set", "etcd.persistence.enabled=true",
                                  "--set", "networkPolicy.enabled=false", "--set", "rbac.userRoles=false",
                                  "--set", "debugTools.enabled=true"],
}


@pytest.fixture(scope="module")
@needs("tools")
def kubeconform() -> tuple[Path, Path]:
    r = subprocess.run(["bash", str(ROOT / "scripts" / "install-kubeconform.sh")], capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    home = Path(r.stdout.strip().splitlines()[-1])
    return home / "bin" / "kubeconform", home / "crds"


@pytest.fixture(scope="module")
def schemas(kubeconform, dev_cluster, tmp_path_factory) -> Path:
    _, prometheus_crds = kubeconform
    crds = sorted(prometheus_crds.glob("*.yaml")) + sorted((CHARTS / "llmtrain-operator" / "crds").glob("*.yaml"))
    for crd in crds:
        dev_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
    dev_cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                        *[f"crd/{yaml.safe_load(c.read_text())['metadata']['name']}" for c in crds])
    openapi = json.loads(dev_cluster.kubectl("get", "--raw", "/openapi/v2", timeout=120).stdout)
    out = tmp_path_factory.mktemp("k8s-1.36-json-schemas")
    written = generate(openapi, out)
    assert "deployment-apps-v1.json" in written and "llmtrainingjob-llmtrain-v1alpha1.json" in written
    assert "servicemonitor-monitoring-v1.json" in written and "pytorchjob-kubeflow-v1.json" in written
    return out


def run_kubeconform(kubeconform, schemas: Path, manifests: str) -> subprocess.CompletedProcess:
    binary, _ = kubeconform
    return subprocess.run([str(binary), "-strict", "-summary", "-output", "text", "-schema-location",
                           str(schemas / "{{ .ResourceKind }}{{ .KindSuffix }}.json"), "-"],
                          input=manifests, capture_output=True, text=True, timeout=300)


def test_schemas_are_strict_enough_to_catch_mistakes(kubeconform, schemas, helm):
    """The check itself can fail: a typo, a wrong type and an unknown kind are all reported."""
    docs = helm.manifests()
    dep = next(d for d in docs if d["kind"] == "Deployment")
    dep["spec"]["template"]["spec"]["containers"][0]["imagePullPolicey"] = "Always"
    svc = next(d for d in docs if d["kind"] == "Service")
    svc["spec"]["ports"][0]["port"] = "eight thousand"
    unknown = {"apiVersion": "example.com/v1", "kind": "Gizmo", "metadata": {"name": "x"}}
    r = run_kubeconform(kubeconform, schemas, yaml.safe_dump_all([dep, svc, unknown]))
    assert r.returncode != 0
    assert "imagePullPolicey" in r.stdout, r.stdout
    assert "eight thousand" in r.stdout or "port" in r.stdout, r.stdout
    assert "Gizmo" in r.stdout and "could not find schema" in r.stdout, r.stdout


@pytest.mark.parametrize("values", list(VALUE_SETS), ids=list(VALUE_SETS))
def test_every_rendered_chart_manifest_is_valid(kubeconform, schemas, helm, values):
    text = helm.template(*VALUE_SETS[values], "--include-crds").stdout
    kinds = {d["kind"] for d in yaml.safe_load_all(text) if d}
    assert "CustomResourceDefinition" in kinds and "Deployment" in kinds
    r = run_kubeconform(kubeconform, schemas, text)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Invalid: 0, Errors: 0, Skipped: 0" in r.stdout, r.stdout


def test_every_llmtrain_render_output_is_valid(kubeconform, schemas):
    rendered = []
    for example in sorted((ROOT / "examples").glob("*.yaml")):
        r = subprocess.run([sys.executable, "-m", "llmtrain.cli", "render", str(example)], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, f"{example.name}: {r.stderr}"
        rendered.append(r.stdout)
        rendered.append(example.read_text())  # the LLMTrainingJob itself, against the CRD's schema
    r = run_kubeconform(kubeconform, schemas, "\n---\n".join(rendered))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"Valid: {2 * len(list((ROOT / 'examples').glob('*.yaml')))}, Invalid: 0" in r.stdout, r.stdout


def test_llmtrain_prepare_cluster_job_is_valid(kubeconform, schemas):
    """The Indexed Job `llmtrain prepare --cluster` prints (prepare_cluster.render_job), with every option set."""
    from llmtrain_trainer.data.prepare_cluster import render_job

    jobs = [render_job("s3://tokens/run1/", 16),
            render_job("s3://tokens/run2/", 64, name="prep", namespace="data", parallelism=8, image="repo/img:1",
                       cpus=96, memory_gib=180, service_account="prepare-s3", env={"AWS_REGION": "us-west-2"})]
    r = run_kubeconform(kubeconform, schemas, yaml.safe_dump_all(jobs))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Valid: 2, Invalid: 0" in r.stdout, r.stdout
