"""The --kueue mode's inputs that need no cluster: the pin (in the one tools module), the Kueue
objects generated from the instance catalog, the webhook configurations and the integrations."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import yaml

from llmtrain.catalog import instance_type
from llmtrain_devcluster import kueue
from llmtrain_devcluster.tools import _KEY_FILES, tools_key

ROOT = Path(__file__).resolve().parents[2]


def test_kueue_is_pinned_in_the_one_tools_module_at_v0_19_2(kube_tools):
    gomod = (ROOT / "tools" / "k8s" / "go.mod").read_text()
    assert re.search(r"^\s*sigs.k8s.io/kueue v0\.19\.2$", gomod, re.M)
    assert "k8s/go.mod" in _KEY_FILES  # bumping it makes a new tools key (unchanged packages stay cached)
    assert kueue.kueue_dir().parent.name == tools_key()


def test_a_flavor_per_instance_type_and_quota_for_exactly_the_nodes():
    shapes = {"p5.48xlarge": 2, "p4de.24xlarge": 1}
    flavors = kueue.resource_flavors(shapes)
    assert [(f["metadata"]["name"], f["spec"]["nodeLabels"]) for f in flavors] == [
        ("p5-48xlarge", {"node.kubernetes.io/instance-type": "p5.48xlarge"}),
        ("p4de-24xlarge", {"node.kubernetes.io/instance-type": "p4de.24xlarge"}),
    ]
    cq = kueue.cluster_queue(shapes)
    (group,) = cq["spec"]["resourceGroups"]
    assert {"nvidia.com/gpu", "vpc.amazonaws.com/efa", "cpu", "memory"} <= set(group["coveredResources"])
    quota = {f["name"]: {r["name"]: r["nominalQuota"] for r in f["resources"]} for f in group["flavors"]}
    p5 = instance_type("p5.48xlarge")
    assert quota["p5-48xlarge"]["nvidia.com/gpu"] == str(2 * p5.gpus_per_node)
    assert quota["p5-48xlarge"]["vpc.amazonaws.com/efa"] == str(2 * p5.efa_interfaces)
    assert quota["p5-48xlarge"]["cpu"] == str(2 * p5.vcpus)
    assert quota["p4de-24xlarge"]["nvidia.com/gpu"] == str(instance_type("p4de.24xlarge").gpus_per_node)


def _manifests(*hooks: tuple[str, str]) -> str:
    return yaml.safe_dump_all(
        [
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "MutatingWebhookConfiguration",
                "metadata": {"name": "mutating-webhook-configuration"},
                "webhooks": [
                    {"name": n, "clientConfig": {"service": {"name": "kueue-webhook-service", "path": p}}}
                    for n, p in hooks
                ],
            }
        ]
    )


HOOKS = (
    ("mpytorchjob.kb.io", "/mutate-kubeflow-org-v1-pytorchjob"),
    ("mpod.kb.io", "/mutate--v1-pod"),
    ("mjobset.kb.io", "/mutate-jobset-x-k8s-io-v1alpha2-jobset"),
    ("mdeployment.kb.io", "/mutate-apps-v1-deployment"),
    ("mworkload.kb.io", "/mutate-kueue-x-k8s-io-v1beta2-workload"),
)


def test_only_the_served_webhooks_are_registered_on_the_loopback_url_with_the_ca():
    (cfg,) = kueue.webhook_configurations(_manifests(*HOOKS), url="https://127.0.0.1:9443", ca_pem=b"CA")
    # Both backends' kinds and Kueue's own; no pod or deployment hook (those integrations are off).
    assert [h["name"] for h in cfg["webhooks"]] == ["mpytorchjob.kb.io", "mjobset.kb.io", "mworkload.kb.io"]
    assert cfg["webhooks"][0]["clientConfig"] == {
        "url": "https://127.0.0.1:9443/mutate-kubeflow-org-v1-pytorchjob",
        "caBundle": base64.b64encode(b"CA").decode(),
    }
    # The release's namespace selector on the integrations' hooks, not on Kueue's own.
    ns = {h["name"]: h.get("namespaceSelector") for h in cfg["webhooks"]}
    assert ns["mworkload.kb.io"] is None
    assert ns["mjobset.kb.io"]["matchExpressions"][0]["values"] == ["kube-system", kueue.NAMESPACE]


def test_with_other_frameworks_their_hooks_are_served_and_the_others_not():
    frameworks = ("batch/job", "pod", "deployment", "jobset.x-k8s.io/jobset")
    (cfg,) = kueue.webhook_configurations(_manifests(*HOOKS), url="https://x", ca_pem=b"CA", frameworks=frameworks)
    assert [h["name"] for h in cfg["webhooks"]] == [
        "mpod.kb.io",
        "mjobset.kb.io",
        "mdeployment.kb.io",
        "mworkload.kb.io",
    ]


def test_the_pinned_releases_own_webhooks_cover_every_backends_kind(kube_tools):
    """Against the pinned release's manifests: a mutating and a validating hook for each backend's
    kind, and the release's defaults (v0.19: PyTorchJob's integration commented out) serve none for
    PyTorchJobs while JobSet's and batch Jobs' stay."""
    text = (kueue.kueue_dir() / "webhook" / "manifests.yaml").read_text()

    def paths(frameworks):
        docs = kueue.webhook_configurations(text, url="", ca_pem=b"CA", frameworks=frameworks)
        return {
            h["clientConfig"]["url"]
            for d in docs
            for h in d["webhooks"]
            if "kueue-x-k8s-io" not in h["clientConfig"]["url"]
        }

    assert paths(kueue.CHAIN_FRAMEWORKS) == {
        f"/{op}-{kind}"
        for op in ("mutate", "validate")
        for kind in ("kubeflow-org-v1-pytorchjob", "jobset-x-k8s-io-v1alpha2-jobset", "batch-v1-job")
    }
    defaults = kueue.release_default_frameworks()
    assert "kubeflow.org/pytorchjob" not in defaults and "jobset.x-k8s.io/jobset" in defaults
    served = paths(defaults)
    assert "/mutate-jobset-x-k8s-io-v1alpha2-jobset" in served and "/mutate--v1-pod" in served
    assert "/mutate-batch-v1-job" in served and "batch/job" in defaults
    assert not any("pytorchjob" in p for p in served)


def test_the_configuration_enables_every_backends_integration_or_the_given_ones(tmp_path):
    cfg = yaml.safe_load(kueue.config_yaml(webhook_port=1, probe_port=2, cert_dir=tmp_path))
    assert cfg["integrations"]["frameworks"] == ["kubeflow.org/pytorchjob", "jobset.x-k8s.io/jobset", "batch/job"]
    assert cfg["webhook"] == {"port": 1, "host": "127.0.0.1", "certDir": str(tmp_path)}
    assert cfg["manageJobsWithoutQueueName"] is False
    other = yaml.safe_load(kueue.config_yaml(webhook_port=1, probe_port=2, cert_dir=tmp_path, frameworks=("pod",)))
    assert other["integrations"]["frameworks"] == ["pod"]


def test_kwok_nodes_carry_the_eks_network_layers_in_blocks_of_four():
    from llmtrain_devcluster.chain import node_manifest

    labels = [node_manifest("p5.48xlarge", i)["metadata"]["labels"] for i in range(6)]
    layer3 = [lab["topology.k8s.aws/network-node-layer-3"] for lab in labels]
    assert layer3[:4] == [layer3[0]] * 4 and layer3[4] == layer3[5] != layer3[0]
    assert len({lab["topology.k8s.aws/network-node-layer-1"] for lab in labels}) == 1
    levels = [lv["nodeLabel"] for lv in kueue.topology()["spec"]["levels"]]
    assert levels == [f"topology.k8s.aws/network-node-layer-{i}" for i in (1, 2, 3)] + ["kubernetes.io/hostname"]
    (flavor,) = kueue.resource_flavors({"p5.48xlarge": 6}, topology_aware=True)
    assert flavor["spec"]["topologyName"] == kueue.topology()["metadata"]["name"]
    assert "topologyName" not in kueue.resource_flavors({"p5.48xlarge": 6})[0]["spec"]


def test_the_upstream_kueue_values_are_the_releases_defaults_plus_pytorchjob(kube_tools):
    """charts/upstream-values/kueue.yaml (what the docs and Terraform install Kueue's chart with):
    the pinned release's own integrations, plus ``kubeflow.org/pytorchjob``, which v0.19 left out."""
    values = yaml.safe_load((ROOT / "charts" / "upstream-values" / "kueue.yaml").read_text())
    cfg = yaml.safe_load(values["managerConfig"]["controllerManagerConfigYaml"])
    frameworks = cfg["integrations"]["frameworks"]
    assert set(kueue.CHAIN_FRAMEWORKS) <= set(frameworks)
    assert set(frameworks) == {*kueue.release_default_frameworks(), "kubeflow.org/pytorchjob"}
    assert cfg["apiVersion"] == "config.kueue.x-k8s.io/v1beta2" and cfg["webhook"]["port"] == 9443
