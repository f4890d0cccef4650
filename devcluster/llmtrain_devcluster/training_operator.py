"""The Kubeflow training-operator's certificate workaround.

training-operator v1.9.x has no switch for its webhook server or its cert rotator. Before it
starts, the dev cluster creates what they wait for: its namespace, the (empty) Secret the rotator
fills, and serving-cert files for the webhook server, kept in the state dir (``TMPDIR`` points
controller-runtime's default cert dir there). No ValidatingWebhookConfiguration is installed, so
the API server never calls the webhook.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import pki
from .process import private_tmp_available, with_private_tmp

__all__ = ["NAMESPACE", "ROTATOR_CERT", "SECRET", "argv", "prepare"]

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
    tmp = _tmp(state_dir)
    certs = tmp / "k8s-webhook-server" / "serving-certs"
    certs.mkdir(parents=True, exist_ok=True)
    ca.issue_to_files(
        certs / "tls.crt",
        certs / "tls.key",
        "training-operator",
        server=True,
        dns=(f"training-operator.{NAMESPACE}.svc", "localhost"),
        ips=("127.0.0.1",),
    )
    # The rotator stats this literal path (not TMPDIR's) before it reports ready. In its mount
    # namespace that is the file just written; without one, only the public certificate goes
    # there, and only when nothing is there yet.
    private = private_tmp_available()
    if not private and not ROTATOR_CERT.exists():
        print(
            f"llmtrain_devcluster: no private mount namespace on this host (unshare --mount): "
            f"writing {ROTATOR_CERT} for the training-operator's cert rotator",
            file=sys.stderr,
        )
        ROTATOR_CERT.parent.mkdir(parents=True, exist_ok=True)
        ROTATOR_CERT.write_bytes((certs / "tls.crt").read_bytes())
    # In its namespace the state dir's tmp is mounted at /tmp.
    return dict(
        os.environ, KUBECONFIG=str(kubeconfig), TMPDIR="/tmp" if private else str(tmp), MY_POD_NAMESPACE=NAMESPACE
    )


def argv(state_dir: Path, operator_argv: Sequence[str | Path], *, kubeconfig: Path) -> list[str | Path]:
    """``operator_argv`` in its private mount namespace (``/tmp`` is the state dir's; its binary
    and ``kubeconfig`` stay visible where they are), or as is where the host cannot make one
    (:func:`prepare` then wrote the real path)."""
    keep = [Path(operator_argv[0]), kubeconfig]
    return with_private_tmp(_tmp(state_dir), operator_argv, keep=keep) or list(operator_argv)


def _tmp(state_dir: Path) -> Path:
    return state_dir / "training-operator" / "tmp"
