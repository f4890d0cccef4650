"""The Kubeflow training-operator's certificate workaround.

training-operator v1.9.3 has no switch for its webhook server or its cert rotator. Before it
starts, the dev cluster creates what they wait for: its namespace, the (empty) Secret the rotator
fills, and serving-cert files for the webhook server, kept in the state dir (``TMPDIR`` points
controller-runtime's default cert dir there). No ValidatingWebhookConfiguration is installed, so
the API server never calls the webhook.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from . import pki

__all__ = ["NAMESPACE", "ROTATOR_CERT", "SECRET", "prepare"]

NAMESPACE = "kubeflow"
# Its webhook Secret; the cert rotator only checks that a serving cert exists at a hard-coded
# path (pkg/cert: "/tmp/k8s-webhook-server/serving-certs").
SECRET = "training-operator-webhook-cert"
ROTATOR_CERT = Path("/tmp/k8s-webhook-server/serving-certs/tls.crt")


def prepare(api: Any, *, state_dir: Path, kubeconfig: Path, ca: pki.CertificateAuthority) -> dict[str, str]:
    """Create the namespace and Secret through ``api`` (a kubernetes ``ApiClient``), write the
    serving certs; return the environment to start the training-operator with."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    for create, body in (
        (lambda b: core.create_namespace(b), {"metadata": {"name": NAMESPACE}}),
        (lambda b: core.create_namespaced_secret(NAMESPACE, b), {"metadata": {"name": SECRET}}),
    ):
        try:
            create(body)
        except client.ApiException as e:
            if e.status != 409:
                raise
    tmp = state_dir / "training-operator" / "tmp"
    certs = tmp / "k8s-webhook-server" / "serving-certs"
    certs.mkdir(parents=True, exist_ok=True)
    ca.issue_to_files(
        certs / "tls.crt", certs / "tls.key", "training-operator", server=True,
        dns=(f"training-operator.{NAMESPACE}.svc", "localhost"), ips=("127.0.0.1",),
    )
    # The rotator stats this literal path (not TMPDIR's) before it reports ready; only the
    # public certificate goes there, and only when nothing is there yet.
    if not ROTATOR_CERT.exists():
        ROTATOR_CERT.parent.mkdir(parents=True, exist_ok=True)
        ROTATOR_CERT.write_bytes((certs / "tls.crt").read_bytes())
    return dict(os.environ, KUBECONFIG=str(kubeconfig), TMPDIR=str(tmp), MY_POD_NAMESPACE=NAMESPACE)
