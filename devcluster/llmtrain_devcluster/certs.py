"""The dev cluster's certificate set in ``<state_dir>/pki``: which certificates exist, for whom,
and the TLS contexts that use them (the primitives are in :mod:`.pki`)."""

from __future__ import annotations

import ssl
from pathlib import Path

from . import pki
from .components import SERVICE_IP

__all__ = ["admin_ssl_context", "insecure_ssl_context", "load_ca", "write_cluster_pki"]


def write_cluster_pki(p: Path) -> None:
    """CA, API-server serving cert, admin / controller-manager / scheduler client certs, the API
    server's kubelet client cert, the service-account key pair and the front-proxy CA, all under
    ``p``."""
    ca = pki.CertificateAuthority.create()
    ca.save(p / "ca.crt", p / "ca.key")
    ca.issue_to_files(
        p / "apiserver.crt",
        p / "apiserver.key",
        "kube-apiserver",
        server=True,
        dns=(
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ),
        ips=("127.0.0.1", SERVICE_IP),
    )
    ca.issue_to_files(p / "admin.crt", p / "admin.key", "kubernetes-admin", orgs=("system:masters",), client=True)
    ca.issue_to_files(
        p / "controller-manager.crt", p / "controller-manager.key", "system:kube-controller-manager", client=True
    )
    ca.issue_to_files(p / "scheduler.crt", p / "scheduler.key", "system:kube-scheduler", client=True)
    # The API server's identity towards kubelets (the real node's): logs, exec, port-forward.
    ca.issue_to_files(
        p / "apiserver-kubelet-client.crt",
        p / "apiserver-kubelet-client.key",
        "kube-apiserver-kubelet-client",
        orgs=("system:masters",),
        client=True,
    )
    pki.write_service_account_keypair(p / "sa.key", p / "sa.pub")
    # Front-proxy (aggregation layer) CA: the controller-manager's delegated authentication
    # reads it from kube-system/extension-apiserver-authentication and errors without it.
    fp = pki.CertificateAuthority.create("llmtrain-dev-front-proxy-ca")
    fp.save(p / "front-proxy-ca.crt", p / "front-proxy-ca.key")
    fp.issue_to_files(p / "front-proxy-client.crt", p / "front-proxy-client.key", "front-proxy-client", client=True)


def load_ca(p: Path) -> pki.CertificateAuthority:
    return pki.CertificateAuthority.load(p / "ca.crt", p / "ca.key")


def admin_ssl_context(p: Path) -> ssl.SSLContext:
    """Verifies the API server against the cluster CA and authenticates as the admin."""
    ctx = ssl.create_default_context(cafile=str(p / "ca.crt"))
    ctx.load_cert_chain(str(p / "admin.crt"), str(p / "admin.key"))
    return ctx


def insecure_ssl_context() -> ssl.SSLContext:
    """For the health endpoints of components whose serving certs are self-signed; loopback only."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx
