"""The monitoring charts as Terraform installs them (issue 10, defect 4).

`terraform console` evaluates the exact values terraform/helm.tf passes to dcgm-exporter and
kube-prometheus-stack. They must carry what charts/upstream-values/*.yaml (the tested reference)
sets, and the GPU-idle alert must fire on DCGM series labelled the way Prometheus stores them under
that configuration: with `honorLabels: false` Prometheus keeps the exporter pod's own namespace/pod
and renames the exporter's (the GPU's pod) to exported_namespace/exported_pod, and the alert's
(namespace, pod) join with the trainer's series finds nothing."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml
from infra_hcl import ROOT, TF_DIR, tool_env

pytestmark = pytest.mark.infra

UPSTREAM = ROOT / "charts" / "upstream-values"
RULES = ROOT / "dashboards" / "rules" / "llmtrain.rules.yaml"
ANSI = re.compile(r"\x1b\[[0-9;]*m")

# Labels Prometheus Operator gives every target of a ServiceMonitor endpoint: the exporter pod's.
EXPORTER_TARGET = {
    "namespace": "monitoring",
    "pod": "dcgm-exporter-7xk2p",
    "container": "exporter",
    "service": "dcgm-exporter",
    "endpoint": "metrics",
    "job": "dcgm-exporter",
    "instance": "10.0.3.7:9400",
}
# What the exporter itself exports for a GPU held by a trainer pod (Kubernetes pod mapping on).
GPU_LABELS = {
    "gpu": "0",
    "UUID": "GPU-0",
    "Hostname": "node-a",
    "modelName": "NVIDIA H100 80GB HBM3",
    "namespace": "team-a",
    "pod": "llama-a1-worker-0",
    "container": "pytorch",
}
TRAINER = {
    "namespace": "team-a",
    "pod": "llama-a1-worker-0",
    "llmtrain_job": "llama",
    "rank": "0",
    "instance": "10.0.4.2:9410",
    "job": "team-a/llmtrain-trainer",
}


def stored_labels(exported: dict, target: dict, honor_labels: bool) -> dict:
    """Prometheus' honor_labels rule: true keeps the scraped labels on a clash; false keeps the
    target's and renames the scraped ones exported_<name>."""
    if honor_labels:
        return {**target, **exported}
    out = dict(target)
    for k, v in exported.items():
        out[f"exported_{k}" if k in target else k] = v
    return out


@pytest.fixture(scope="module")
def tf_values(terraform_bin, tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("tf-monitoring")
    shutil.copy(TF_DIR / "monitoring_values.tf", work)
    expr = "jsonencode({dcgm = local.dcgm_exporter_values, kps = local.kube_prometheus_stack_values})"
    proc = subprocess.run(
        [str(terraform_bin), "console"],
        input=expr + "\n",
        cwd=work,
        capture_output=True,
        text=True,
        env=tool_env(),
        timeout=120,
    )
    assert proc.returncode == 0 and "Error" not in proc.stderr, ANSI.sub("", proc.stderr)
    return json.loads(json.loads(ANSI.sub("", proc.stdout)))


def test_helm_releases_use_these_values():
    helm_tf = (TF_DIR / "helm.tf").read_text()
    assert "values = [yamlencode(local.dcgm_exporter_values)]" in helm_tf
    assert "values = [yamlencode(local.kube_prometheus_stack_values)]" in helm_tf


def test_terraform_sets_what_the_upstream_values_set(tf_values):
    dcgm = yaml.safe_load((UPSTREAM / "dcgm-exporter.yaml").read_text())
    assert tf_values["dcgm"]["serviceMonitor"]["honorLabels"] is dcgm["serviceMonitor"]["honorLabels"] is True
    kps = yaml.safe_load((UPSTREAM / "kube-prometheus-stack.yaml").read_text())
    want, got = kps["grafana"]["sidecar"]["dashboards"], tf_values["kps"]["grafana"]["sidecar"]["dashboards"]
    assert {k: got.get(k) for k in want} == want
    for key, value in kps["prometheus"]["prometheusSpec"].items():
        if key.endswith("NilUsesHelmValues"):
            assert tf_values["kps"]["prometheus"]["prometheusSpec"][key] == value, key


def _series(name: str, labels: dict) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def test_gpu_idle_alert_fires_on_series_labelled_as_terraform_stores_them(tf_values, tmp_path):
    from llmtrain_devcluster.tools import find_tool

    honor = bool(tf_values["dcgm"]["serviceMonitor"].get("honorLabels", False))
    dcgm = stored_labels(GPU_LABELS, EXPORTER_TARGET, honor)
    case = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": _series("DCGM_FI_DEV_GPU_UTIL", dcgm), "values": "97x10 0x40"},
                    {"series": _series("llmtrain_trainer_step", TRAINER), "values": "1+1x10 11x40"},
                ],
                "promql_expr_test": [
                    {
                        "expr": "llmtrain_job:dcgm_gpu_util:avg",
                        "eval_time": "5m",
                        "exp_samples": [
                            {
                                "labels": 'llmtrain_job:dcgm_gpu_util:avg{llmtrain_job="llama",namespace="team-a"}',
                                "value": 97,
                            }
                        ],
                    },
                    {
                        "expr": 'ALERTS{alertname="LLMTrainJobGPUsIdle",alertstate="firing"}',
                        "eval_time": "30m",
                        "exp_samples": [
                            {
                                "labels": 'ALERTS{alertname="LLMTrainJobGPUsIdle",alertstate="firing",'
                                'llmtrain_job="llama",namespace="team-a",severity="critical"}',
                                "value": 1,
                            }
                        ],
                    },
                ],
            }
        ],
    }
    test_file = tmp_path / "terraform-labels.test.yaml"
    test_file.write_text(yaml.safe_dump(case, sort_keys=False))
    r = subprocess.run(
        [str(find_tool("promtool")), "test", "rules", str(test_file)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, f"with honorLabels={honor} the series are stored as {dcgm}:\n{r.stdout}{r.stderr}"
