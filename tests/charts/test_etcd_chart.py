"""The bundled rendezvous etcd chart (issue 10, defect 10): persistence can be switched on by
`helm upgrade` against the real API server (a volumeClaimTemplates change is refused there), and
the schema keeps etcd on a v2-API release line and rejects typos in the values it models."""

from __future__ import annotations

import json
import uuid

import pytest

ETCD_CHART = "llmtrain-operator/charts/llmtrain-etcd"


def test_turning_persistence_on_is_an_ordinary_upgrade(helm, dev_cluster):
    ns = f"etcd-upg-{uuid.uuid4().hex[:6]}"
    chart = helm.charts / ETCD_CHART
    kc = dev_cluster.kubeconfig
    try:
        helm.run("install", "rdzv", chart, "-n", ns, "--create-namespace", kubeconfig=kc)
        r = helm.run("upgrade", "rdzv", chart, "-n", ns, "--set", "persistence.enabled=true",
                     "--set", "persistence.size=2Gi", kubeconfig=kc, check=False)
        assert r.returncode == 0, r.stderr  # before: "updates to statefulset spec ... are forbidden"
        sts = json.loads(dev_cluster.kubectl("get", "statefulset", "rdzv-etcd", "-n", ns, "-o", "json").stdout)
        (data,) = [v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "data"]
        claim = data["persistentVolumeClaim"]["claimName"]
        pvc = json.loads(dev_cluster.kubectl("get", "pvc", claim, "-n", ns, "-o", "json").stdout)
        assert pvc["spec"]["resources"]["requests"]["storage"] == "2Gi"
        # And back off again (the claim stays: helm.sh/resource-policy keep).
        helm.run("upgrade", "rdzv", chart, "-n", ns, "--set", "persistence.enabled=false", kubeconfig=kc)
        assert dev_cluster.kubectl("get", "pvc", claim, "-n", ns).returncode == 0
    finally:
        helm.run("uninstall", "rdzv", "-n", ns, kubeconfig=kc, check=False)
        dev_cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.mark.parametrize("args,words", [
    (["--set", "etcd.image.tag=3.6.0"], ["image.tag", "Does not match pattern"]),
    (["--set", "etcd.image.tag=v3.6.5"], ["image.tag", "Does not match pattern"]),
    (["--set", "etcd.podSecurityContext.runAsNonroot=true"], ["Additional property runAsNonroot is not allowed"]),
    (["--set", "etcd.resources.limits.memroy=1Gi"], ["Additional property memroy is not allowed"]),
    (["--set", "securityContext.readOnlyRootFS=true"], ["Additional property readOnlyRootFS is not allowed"]),
    (["--set", "tolerations[0].efect=NoSchedule"], ["Additional property efect is not allowed"]),
    (["--set", "affinity.nodeAfinity.x=y"], ["Additional property nodeAfinity is not allowed"]),
])
def test_schema_rejects_v3_api_only_etcd_and_typos(helm, args, words):
    r = helm.template("--set", "etcd.enabled=true", *args, check=False)
    assert r.returncode != 0, f"accepted {args}"
    for w in words:
        assert w in r.stderr, f"{w!r} not in: {r.stderr}"


@pytest.mark.parametrize("tag", ["", "v3.5.17", "3.4.35", "v3.5.21-amd64"])
def test_schema_accepts_v2_capable_etcd(helm, tag):
    helm.template("--set", "etcd.enabled=true", "--set", f"etcd.image.tag={tag}")
