"""The chart's side of tenant isolation (issue 18, items 3 and 6), rendered: the bundled etcd
requires client certificates of the rendezvous CA, the operator (alone) holds the CA key and is
told to issue identities, and the admission policies' loader list is the operator's own."""

from __future__ import annotations

import pytest
import yaml
from chart_helpers import by_kind, one


def _etcd(helm, *args):
    docs = helm.manifests("--set", "etcd.enabled=true", *args)
    sts = one(docs, "StatefulSet")
    return docs, sts["spec"]["template"]["spec"]


def test_the_bundled_etcd_requires_client_certificates_of_the_ca(helm):
    docs, pod = _etcd(helm)
    [c] = pod["containers"]
    args = c["args"]
    assert "--client-cert-auth=true" in args and "--trusted-ca-file=/etc/etcd/tls/ca.crt" in args
    assert any(a.startswith("--listen-client-urls=https://") for a in args)
    assert any(a.startswith("--advertise-client-urls=https://llmtrain-etcd.llmtrain-system.svc:") for a in args)
    assert not any(a.startswith("--listen-client-urls=http://") for a in args)
    # the probes use the plain-HTTP metrics listener (the kubelet shows no client certificate)
    assert c["readinessProbe"]["httpGet"]["port"] == "metrics" == c["livenessProbe"]["httpGet"]["port"]
    [tls] = [v for v in pod["volumes"] if v["name"] == "tls"]
    assert tls["secret"]["secretName"] == "llmtrain-etcd-tls"
    assert {i["key"] for i in tls["secret"]["items"]} == {"ca.crt", "tls.crt", "tls.key"}  # never ca.key
    # the chart generates no key material (Argo CD would see a new one on every sync)
    assert not [s for s in by_kind(docs, "Secret")]

    _the_operator_holds_the_ca(docs, "llmtrain-etcd.llmtrain-system.svc:2379", "llmtrain-etcd-tls")


def _the_operator_holds_the_ca(docs, endpoint: str, secret: str) -> None:
    """The operator is told to issue identities on `endpoint`, with the CA (certificate and key,
    nothing else) mounted from `secret`."""
    dep = one(docs, "Deployment")["spec"]["template"]["spec"]
    op_args = dep["containers"][0]["args"]
    assert "--rendezvous-ca-dir=/etc/llmtrain/rendezvous-ca" in op_args
    assert f"--default-etcd-endpoint={endpoint}" in op_args
    [ca] = [v for v in dep["volumes"] if v["name"] == "rendezvous-ca"]
    assert ca["secret"]["secretName"] == secret
    assert {i["key"] for i in ca["secret"]["items"]} == {"ca.crt", "ca.key"}


def test_auth_off_is_plain_etcd_and_no_ca_for_the_operator(helm):
    docs, pod = _etcd(helm, "--set", "etcd.auth.enabled=false")
    args = pod["containers"][0]["args"]
    assert not any("client-cert-auth" in a for a in args)
    assert not any(a.startswith("--rendezvous-ca-dir") for a in one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"])


def test_job_network_policy_flag_follows_the_value(helm):
    on = one(helm.manifests(), "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    off = one(helm.manifests("--set", "jobNetworkPolicy.enabled=false"), "Deployment")
    assert "--job-network-policy" in on
    assert "--job-network-policy" not in off["spec"]["template"]["spec"]["containers"][0]["args"]


def test_admission_loader_list_is_the_operators(helm):
    from llmtrain.validation import LOADER_ENV, LOADER_ENV_PREFIXES

    [vap] = [d for d in by_kind(helm.manifests(), "ValidatingAdmissionPolicy")
             if d["metadata"]["name"].endswith(".job-env")]
    variables = {v["name"]: v["expression"] for v in vap["spec"]["variables"]}
    # CEL list literals of strings are YAML flow sequences
    assert set(yaml.safe_load(variables["denied"])) == set(LOADER_ENV)
    assert tuple(yaml.safe_load(variables["deniedPrefixes"])) == LOADER_ENV_PREFIXES


def test_admission_policies_can_be_switched_off(helm):
    assert not by_kind(helm.manifests("--set", "admissionPolicies.enabled=false"), "ValidatingAdmissionPolicy")


def _secret_rules(docs) -> list[dict]:
    return [
        r
        for role in by_kind(docs, "ClusterRole") + by_kind(docs, "Role")
        for r in role.get("rules") or []
        if "secrets" in r.get("resources", [])
    ]


def test_an_etcd_of_ones_own_secured_by_its_ca_secret(helm):
    """rendezvousCASecret: the operator holds that CA, issues the namespaces' identities (create on
    secrets, nothing else), and no etcd of the chart's runs."""
    docs = helm.manifests(
        "--set", "defaultEtcdEndpoint=10.245.0.1:2379", "--set", "rendezvousCASecret=my-rendezvous-ca"
    )
    assert not by_kind(docs, "StatefulSet") and not by_kind(docs, "Secret")
    _the_operator_holds_the_ca(docs, "10.245.0.1:2379", "my-rendezvous-ca")
    assert [r["verbs"] for r in _secret_rules(docs)] == [["create"]]
    # without it (and without the bundled etcd's auth) the operator may not touch secrets at all
    plain = helm.manifests("--set", "defaultEtcdEndpoint=10.245.0.1:2379")
    assert not _secret_rules(plain)
    assert not any(a.startswith("--rendezvous-ca-dir") for a in one(plain, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"])


@pytest.mark.parametrize(
    "args, words",
    [
        (["--set", "rendezvousCASecret=ca"], "rendezvousCASecret needs defaultEtcdEndpoint"),
        (
            ["--set", "rendezvousCASecret=ca", "--set", "defaultEtcdEndpoint=e:2379", "--set", "etcd.enabled=true"],
            "rendezvousCASecret is for an etcd of your own",
        ),
        (["--set", "rendezvousCASecret=Not_A_Name", "--set", "defaultEtcdEndpoint=e:2379"], "rendezvousCASecret"),
    ],
)
def test_rendezvous_ca_secret_refused_where_it_cannot_work(helm, args, words):
    r = helm.template(*args, check=False)
    assert r.returncode != 0 and words in r.stderr, r.stderr
