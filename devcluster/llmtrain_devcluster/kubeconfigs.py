"""Kubeconfig files for the dev cluster: the admin's, the components', users' (client certs) and
ServiceAccounts' (bound tokens). All are written 0600, atomically."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import yaml

__all__ = [
    "CLUSTER_NAME",
    "kubeconfig_doc",
    "write_cert_kubeconfig",
    "write_component_kubeconfigs",
    "write_token_kubeconfig",
    "write_yaml",
]

CLUSTER_NAME = "llmtrain-dev"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def kubeconfig_doc(server: str, ca_pem: bytes, user: str, auth: dict) -> dict:
    """A one-cluster, one-user kubeconfig; ``auth`` is the user's ``user:`` stanza."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CLUSTER_NAME, "cluster": {"server": server, "certificate-authority-data": _b64(ca_pem)}}],
        "users": [{"name": user, "user": auth}],
        "contexts": [{"name": f"{user}@{CLUSTER_NAME}", "context": {"cluster": CLUSTER_NAME, "user": user}}],
        "current-context": f"{user}@{CLUSTER_NAME}",
        "preferences": {},
    }


def write_yaml(path: Path, doc: dict, mode: int = 0o600) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    tmp.chmod(mode)
    os.replace(tmp, path)
    return path


def write_cert_kubeconfig(
    path: Path, *, server: str, ca_pem: bytes, user: str, cert_pem: bytes, key_pem: bytes
) -> Path:
    auth = {"client-certificate-data": _b64(cert_pem), "client-key-data": _b64(key_pem)}
    return write_yaml(path, kubeconfig_doc(server, ca_pem, user, auth))


def write_token_kubeconfig(path: Path, *, server: str, ca_pem: bytes, user: str, token: str) -> Path:
    return write_yaml(path, kubeconfig_doc(server, ca_pem, user, {"token": token}))


def write_component_kubeconfigs(state_dir: Path, pki: Path, server: str) -> None:
    """``kubeconfig`` (admin), ``controller-manager.kubeconfig`` and ``scheduler.kubeconfig``."""
    ca_pem = (pki / "ca.crt").read_bytes()
    for path, user, name in (
        (state_dir / "kubeconfig", "admin", "admin"),
        (state_dir / "controller-manager.kubeconfig", "system:kube-controller-manager", "controller-manager"),
        (state_dir / "scheduler.kubeconfig", "system:kube-scheduler", "scheduler"),
    ):
        write_cert_kubeconfig(
            path,
            server=server,
            ca_pem=ca_pem,
            user=user,
            cert_pem=(pki / f"{name}.crt").read_bytes(),
            key_pem=(pki / f"{name}.key").read_bytes(),
        )
