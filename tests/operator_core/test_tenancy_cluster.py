"""The operator's tenant isolation on the real API server and a real etcd (issue 18, item 3):
with the rendezvous CA it gives every attempt on its etcd a Secret with the namespace's identity,
wires it into the PyTorchJob, and makes the job's NetworkPolicy; the identity from one
namespace's Secret is refused on another namespace's rendezvous by etcd itself."""

from __future__ import annotations

import base64
import uuid

import etcd as python_etcd
import pytest
from kubernetes import client

from llmtrain import rendezvous_auth as ra
from llmtrain.render import networkpolicy_name

from .conftest import OperatorProcess, wait_for
from .test_operator_cluster import tiny


@pytest.fixture(scope="module")
def tenancy(dev_cluster, trainer_endpoint, tmp_path_factory):
    from secured_etcd import secured_etcd

    tmp = tmp_path_factory.mktemp("tenancy")
    ca = ra.CertificateAuthority.generate()
    ca_dir = tmp / "ca"
    ca_dir.mkdir()
    (ca_dir / "ca.crt").write_bytes(ca.cert_pem)
    (ca_dir / "ca.key").write_bytes(ca.key_pem())
    with secured_etcd(tmp / "etcd", ca) as endpoint:
        op = OperatorProcess(
            dev_cluster.kubeconfig,
            tmp / "operator.log",
            trainer_endpoint[1],
            extra_args=[
                "--default-etcd-endpoint",
                endpoint,
                "--rendezvous-ca-dir",
                str(ca_dir),
                "--job-network-policy",
            ],
        )
        op.start()
        try:
            yield endpoint, ca
        finally:
            op.stop()


@pytest.fixture
def other_namespace(dev_cluster):
    name = f"t-{uuid.uuid4().hex[:10]}"
    with dev_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": name}})
        try:
            yield name
        finally:
            core.delete_namespace(name)


def _etcd_client(endpoint: str, secret: client.V1Secret, tmp) -> python_etcd.Client:
    d = tmp / uuid.uuid4().hex[:8]
    d.mkdir()
    for key, value in secret.data.items():
        (d / key).write_bytes(base64.b64decode(value))
    host, port = endpoint.split(":")
    return python_etcd.Client(
        host,
        int(port),
        protocol="https",
        cert=(str(d / "tls.crt"), str(d / "tls.key")),
        ca_cert=str(d / "ca.crt"),
        read_timeout=10,
    )


def _start(kube, namespace: str, name: str) -> tuple[dict, client.V1Secret]:
    kube.apply(namespace, kube.job_doc(name, tiny(rendezvous={"backend": "etcd-v2"})))
    ptj = kube.wait_ptj(namespace, f"{name}-a1")
    secret = wait_for(lambda: kube.core.read_namespaced_secret(f"{name}-a1-rendezvous", namespace), 10, "secret")
    return ptj, secret


def test_each_attempt_gets_its_namespaces_identity_and_only_that(tenancy, kube, namespace, other_namespace, tmp_path):
    endpoint, ca = tenancy
    ptj, secret = _start(kube, namespace, "alpha")
    job = kube.job(namespace, "alpha")
    # owned by the job (garbage-collected with it), never by the tenant
    assert [(o.kind, o.uid) for o in secret.metadata.owner_references] == [("LLMTrainingJob", job["metadata"]["uid"])]
    assert secret.type == "kubernetes.io/tls" and set(secret.data) == {"ca.crt", "tls.crt", "tls.key"}
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(base64.b64decode(secret.data["tls.crt"]))
    assert cert.subject.rfc4514_string() == f"CN={ra.user_name(namespace)}" and cert.issuer == ca.cert.subject

    pod = ptj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert {
        "name": "rendezvous-credentials",
        "secret": {"secretName": secret.metadata.name, "defaultMode": 0o440},
    } in pod["volumes"]
    args = pod["containers"][0]["args"]
    assert f"--rdzv-endpoint={endpoint}" in args and any(a.startswith("--rdzv-conf=protocol=https,") for a in args)

    pol = kube.cluster.kubectl(
        "get",
        "networkpolicy",
        networkpolicy_name("alpha"),
        "-n",
        namespace,
        "-o",
        "jsonpath={.metadata.ownerReferences[0].uid}",
    ).stdout
    assert pol == job["metadata"]["uid"]

    # The two namespaces' identities against etcd: each writes its own rendezvous only.
    _, other_secret = _start(kube, other_namespace, "beta")
    mine, theirs = _etcd_client(endpoint, secret, tmp_path), _etcd_client(endpoint, other_secret, tmp_path)
    key = ra.STATE_PREFIX + ptj["spec"]["elasticPolicy"]["rdzvId"]
    mine.write(key, "state")
    with pytest.raises(python_etcd.EtcdException, match="credentials"):
        theirs.write(key, "a pickle")
    with pytest.raises(python_etcd.EtcdException, match="credentials"):
        theirs.read(key)
    assert mine.read(key).value == "state"


def test_a_c10d_job_gets_its_networkpolicy_but_no_credentials(tenancy, kube, namespace):
    kube.apply(namespace, kube.job_doc("gamma", tiny()))  # tiny(): c10d
    ptj = kube.wait_ptj(namespace, "gamma-a1")
    pod = ptj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert not any("secret" in v for v in pod["volumes"])
    names = kube.cluster.kubectl(
        "get", "networkpolicy,secret", "-n", namespace, "-o", "jsonpath={.items[*].metadata.name}"
    ).stdout.split()
    assert networkpolicy_name("gamma") in names and "gamma-a1-rendezvous" not in names
