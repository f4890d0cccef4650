"""What the renderer adds for tenant isolation (issue 18, item 3): the attempt's etcd credentials
wired into the pods, the rendezvous id's namespace prefix, and the job's NetworkPolicy."""

from __future__ import annotations

import base64

import pytest

from llmtrain import rendezvous_auth as ra
from llmtrain.backends.pytorchjob import render_pytorchjob
from llmtrain.pod_contract import METRICS_PORT, rendezvous_id
from llmtrain.render import networkpolicy_name, render_networkpolicy, render_rendezvous_secret
from llmtrain.validation import parse_spec


def _spec(**over):
    raw = {
        "model": {"preset": "tiny"},
        "data": {"uri": "synthetic", "seqLen": 32},
        "cluster": {"instanceType": "cpu", "nodes": 2, "processesPerNode": 3},
        "training": {"globalBatchTokens": 32 * 6 * 2, "microBatchSize": 2},
    }
    for k, v in over.items():
        raw[k] = {**raw.get(k, {}), **v}
    return parse_spec(raw)


def _pod(obj):
    return obj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]


def _args(obj):
    return _pod(obj)["containers"][0]["args"]


@pytest.mark.parametrize("backend", ["etcd-v2", "etcd"])
def test_a_job_on_the_operators_etcd_mounts_its_attempts_credentials(backend):
    obj = render_pytorchjob(
        _spec(rendezvous={"backend": backend}),
        "llama",
        "team-a",
        2,
        "0123456789",
        "llmtrain-etcd.llmtrain-system.svc:2379",
        rendezvous_credentials=True,
    )
    pod = _pod(obj)
    [vol] = [v for v in pod["volumes"] if "secret" in v]
    # the Secret the operator creates for this attempt (render_rendezvous_secret)
    assert vol["secret"]["secretName"] == "llama-a2-rendezvous"
    assert vol["secret"]["defaultMode"] == 0o440 and pod["securityContext"]["fsGroup"] == 65532
    [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == vol["name"]]
    assert mount == {"name": vol["name"], "mountPath": "/etc/llmtrain/rendezvous", "readOnly": True}
    [conf] = [a for a in _args(obj) if a.startswith("--rdzv-conf=")]
    files = {"ca.crt", "tls.crt", "tls.key"}
    # the parameter names each torch backend's _create_etcd_client reads
    names = (
        {"protocol", "ca_cert", "ssl_cert", "ssl_cert_key"}
        if backend == "etcd-v2"
        else {"protocol", "cacert", "cert", "key", "etcd_prefix"}
    )
    pairs = dict(kv.split("=", 1) for kv in conf[len("--rdzv-conf=") :].split(","))
    assert set(pairs) == names and pairs["protocol"] == "https"
    paths = {k: v for k, v in pairs.items() if k not in ("protocol", "etcd_prefix")}
    assert {v.rsplit("/", 1)[-1] for v in paths.values()} == files
    assert all(v.startswith(mount["mountPath"] + "/") for v in paths.values())
    if backend == "etcd":
        # the legacy backend's keys go under the namespace's own directory, not the shared
        # /torchelastic/p2p that torch would create and write itself (issue 33)
        assert pairs["etcd_prefix"] == "/torchelastic/p2p/team-a."
    # the pod never sees the CA key
    assert "ca.key" not in str(obj)


@pytest.mark.parametrize(
    "rendezvous", [{"backend": "c10d"}, {"backend": "etcd-v2", "endpoint": "own-etcd.team-a:2379"}]
)
def test_a_job_elsewhere_gets_no_credentials(rendezvous):
    """c10d, or the job's own etcd: the operator's identities are not for those."""
    obj = render_pytorchjob(
        _spec(rendezvous=rendezvous),
        "llama",
        "team-a",
        1,
        "0123456789",
        "llmtrain-etcd.llmtrain-system.svc:2379",
        rendezvous_credentials=True,
    )
    assert not any("secret" in v for v in _pod(obj)["volumes"])
    assert not any(a.startswith("--rdzv-conf") for a in _args(obj))


def test_without_the_ca_nothing_changes():
    obj = render_pytorchjob(_spec(), "llama", "team-a", 1, "0123456789", "etcd.infra:2379")
    assert not any("secret" in v for v in _pod(obj)["volumes"])
    assert not any(a.startswith("--rdzv-conf") for a in _args(obj))


def test_the_secret_carries_the_namespaces_identity_and_goes_with_the_job():
    ca = ra.CertificateAuthority.generate()
    creds = ca.issue(ra.user_name("team-a"))
    sec = render_rendezvous_secret("llama", "team-a", 2, "0123456789", creds)
    assert sec["metadata"]["name"] == "llama-a2-rendezvous" and sec["metadata"]["namespace"] == "team-a"
    assert sec["type"] == "kubernetes.io/tls"
    [owner] = sec["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("LLMTrainingJob", "llama", "0123456789")
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(base64.b64decode(sec["data"]["tls.crt"]))
    assert cert.subject.rfc4514_string() == "CN=llmtrain-ns-team-a"
    assert cert.issuer == ca.cert.subject
    assert set(sec["data"]) == {"ca.crt", "tls.crt", "tls.key"}


@pytest.mark.parametrize("ns", ["a", "ab", "abc", "team-a", "x" * 63])
def test_run_ids_start_with_a_prefix_no_other_namespace_shares(ns):
    rid = rendezvous_id(ns, "job", "0123456789", 1)
    prefix = ra.tenant_prefix(ns)
    assert rid.startswith(prefix) and prefix.rstrip(".") == ns
    # a longer namespace with this one as its start never has this prefix (the "." ends the name)
    assert not rendezvous_id(ns + "b", "job", "0123456789", 1).startswith(prefix)
    assert not rendezvous_id(ns + "-b", "job", "0123456789", 1).startswith(prefix)
    # base64 of the store's key prefix is a whole number of groups: the namespace's store keys,
    # and only those, start with its base64
    assert len("torch.rendezvous." + prefix) % 3 == 0
    key = base64.b64encode(f"torch.rendezvous.{rid}.0/MASTER_ADDR".encode()).decode()
    [store_pattern] = [p for p in ra.permissions(ns)["write"] if p.startswith(ra.STORE_DIR + "/")]
    assert key.startswith(store_pattern[len(ra.STORE_DIR) + 1 : -1])


def test_job_networkpolicy_admits_only_the_jobs_own_pods_but_on_the_metrics_ports():
    spec = _spec(rendezvous={"backend": "c10d"})
    obj = render_pytorchjob(spec, "llama", "team-a", 1, "0123456789")
    pol = render_networkpolicy(spec, "llama", "team-a", "0123456789")
    assert pol["kind"] == "NetworkPolicy" and pol["metadata"]["name"] == networkpolicy_name("llama")
    assert pol["metadata"]["namespace"] == "team-a"
    assert pol["metadata"]["ownerReferences"][0]["uid"] == "0123456789"
    sel = pol["spec"]["podSelector"]["matchLabels"]
    pod_labels = obj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"]["labels"]
    other_job = render_pytorchjob(spec, "other", "team-a", 1, "99")
    other_labels = other_job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"]["labels"]

    def selects(selector, labels):
        return all(labels.get(k) == v for k, v in selector.items())

    # it selects every attempt's worker pods of this job, none of another job's
    assert selects(sel, pod_labels) and not selects(sel, other_labels)
    assert pol["spec"]["policyTypes"] == ["Ingress"]
    peers, metrics = pol["spec"]["ingress"]
    # peers: this job's pods, in this namespace only (no namespaceSelector), on every port
    # (the c10d rendezvous port 29400 among them)
    [src] = peers["from"]
    assert set(src) == {"podSelector"} and selects(src["podSelector"]["matchLabels"], pod_labels)
    assert not selects(src["podSelector"]["matchLabels"], other_labels)
    assert "ports" not in peers
    # anyone, but only on the trainer's metrics ports (one per local rank: 3 here)
    assert "from" not in metrics
    assert metrics["ports"] == [{"protocol": "TCP", "port": METRICS_PORT, "endPort": METRICS_PORT + 2}]
    ports = [p["containerPort"] for p in _pod(obj)["containers"][0]["ports"]]
    assert ports == list(range(METRICS_PORT, METRICS_PORT + 3))
    assert not any(p <= 29400 <= p for p in ports)  # the rendezvous port is not among them
