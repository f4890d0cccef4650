"""Terraform's rendezvous CA Secret (terraform/rendezvous_ca.tf) is the one the chart's etcd and
operator mount with etcd.auth.enabled (the default): same name for the release Terraform installs,
every key they read, created before the release; and the key format Terraform's tls provider
writes (SEC1 "EC PRIVATE KEY", P-256) is one the operator signs with. Without the Secret, the
Terraform install would wait on etcd and the operator forever."""

from __future__ import annotations

import datetime as dt
import re

import hcl2
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from chart_helpers import CHARTS, by_kind, one

TF = CHARTS.parent / "terraform"


def _unq(v):
    if isinstance(v, str):
        return v[1:-1] if len(v) >= 2 and v[0] == v[-1] == '"' else v
    if isinstance(v, dict):
        return {_unq(k): _unq(x) for k, x in v.items() if k not in ("__is_block__", "__comments__")}
    if isinstance(v, list):
        return [_unq(x) for x in v]
    return v


def _tf(name: str) -> dict:
    with (TF / name).open() as f:
        return _unq(hcl2.load(f))


def _secret() -> tuple[str, set[str]]:
    doc = _tf("rendezvous_ca.tf")
    loc = {k: v for entry in doc["locals"] for k, v in entry.items() if isinstance(v, str)}
    (body,) = [b for r in doc["resource"] for t, named in r.items() if t == "kubernetes_secret_v1"
               for b in named.values()]
    meta = body["metadata"][0] if isinstance(body["metadata"], list) else body["metadata"]
    name = meta["name"].replace("${local.etcd_service}", loc["etcd_service"])
    return name, set(body["data"])


def test_terraform_creates_the_secret_the_chart_mounts(helm):
    name, keys = _secret()
    # the release and namespace Terraform installs (terraform/helm.tf)
    helm_tf = (TF / "helm.tf").read_text()
    assert re.search(r'name\s*=\s*"llmtrain"', helm_tf) and 'llmtrain_namespace = "llmtrain-system"' in helm_tf
    docs = helm.manifests("--set", "etcd.enabled=true")
    sts = one(docs, "StatefulSet")
    etcd_vols = [v["secret"] for v in sts["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    dep = [d for d in by_kind(docs, "Deployment") if "operator" in d["metadata"]["name"]][0]
    op_vols = [v["secret"] for v in dep["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    mounted = [v for v in etcd_vols + op_vols if v["secretName"] == name]
    assert mounted and len(mounted) == len(etcd_vols + op_vols), (name, etcd_vols, op_vols)
    # what etcd mounts item by item, and the CA key the operator signs with
    wanted = {i["key"] for v in mounted for i in v.get("items") or []} | {"ca.crt", "ca.key"}
    assert wanted <= keys, wanted - keys
    assert "kubernetes_secret_v1.rendezvous_ca" in helm_tf  # created before the release waits on it


def test_the_operator_signs_with_a_sec1_p256_ca_key():
    from llmtrain.rendezvous_auth import CertificateAuthority

    key = ec.generate_private_key(ec.SECP256R1())
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                serialization.NoEncryption())
    assert key_pem.startswith(b"-----BEGIN EC PRIVATE KEY-----")  # what tls_private_key writes for ECDSA
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "llmtrain-rendezvous-ca")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    ca = CertificateAuthority(cert.public_bytes(serialization.Encoding.PEM), key_pem)
    creds = ca.issue("llmtrain-ns-team-a")
    client = x509.load_pem_x509_certificate(creds.cert_pem)
    assert client.issuer == name
    client.verify_directly_issued_by(cert)
