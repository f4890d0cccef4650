"""What an attempt needs besides its child (PyTorchJob, JobSet), so other namespaces cannot reach its training
(docs/operations/tenant-isolation.md): the job's NetworkPolicy, and with a rendezvous CA the
Secret with its namespace's etcd credentials.

Both are only ever created, never read: the operator cannot read tenants' Secrets (no `get`).
An object already there (an operator restart, a retried attempt) is left as it is; if a tenant
put something else under that name in its own namespace, only its own job suffers.

Both features are off by default, and their client code is heavy to import (the networking API's
generated models, cryptography: 0.3 s of CPU at every operator start). `warm(cfg)` imports what the
configured features need at start, so the first job does not wait for it, and nothing else."""

from __future__ import annotations

import importlib
from functools import cache
from typing import TYPE_CHECKING

from kubernetes.client.exceptions import ApiException

from ...render import render_networkpolicy, render_rendezvous_secret, uses_operator_etcd
from ...spec import LLMTrainingJobSpec
from ..policy.config import OperatorConfig
from . import kube

if TYPE_CHECKING:
    from ... import rendezvous_auth


def warm(cfg: OperatorConfig) -> None:
    """Import the client code of the features `cfg` turns on."""
    if cfg.job_network_policy:
        _networking()
    if cfg.rendezvous_ca_dir:
        _auth()


def _networking():
    return importlib.import_module("kubernetes.client.api.networking_v1_api")


def _auth():
    return importlib.import_module("llmtrain.rendezvous_auth")


@cache
def _ca(ca_dir: str) -> rendezvous_auth.CertificateAuthority:
    return _auth().CertificateAuthority.from_dir(ca_dir)


@cache
def _admin(endpoint: str, ca_dir: str) -> rendezvous_auth.EtcdAdmin:
    admin = _auth().EtcdAdmin(endpoint, _ca(ca_dir))
    admin.bootstrap()
    return admin


def create_networkpolicy(obj: dict) -> bool:
    """True if created, False if one of that name was there already."""
    try:
        api = _networking().NetworkingV1Api(kube._client())
        api.create_namespaced_network_policy(obj["metadata"]["namespace"], obj)
        return True
    except ApiException as err:
        if err.status != 409:
            raise
        return False


def create_secret(obj: dict) -> bool:
    """True if created, False if one of that name was there already."""
    try:
        kube._request(
            "POST", "/api/v1/namespaces/{namespace}/secrets", {"namespace": obj["metadata"]["namespace"]}, obj
        )
        return True
    except ApiException as err:
        if err.status != 409:
            raise
        return False


def prepare_attempt(
    cfg: OperatorConfig, spec: LLMTrainingJobSpec, ns: str, name: str, uid: str | None, attempt: int
) -> None:
    """Before attempt N's child: its NetworkPolicy (with --job-network-policy) and, when it
    meets on the operator's etcd and the operator holds the rendezvous CA, its credentials."""
    if cfg.job_network_policy:
        create_networkpolicy(render_networkpolicy(spec, name, ns, uid))
    if cfg.rendezvous_ca_dir and cfg.default_etcd_endpoint and uses_operator_etcd(spec):
        admin = _admin(cfg.default_etcd_endpoint, cfg.rendezvous_ca_dir)
        admin.ensure_current()  # an etcd restarted without its data is set up (and wiped) again
        admin.ensure_namespace(ns)
        creds = _ca(cfg.rendezvous_ca_dir).issue(_auth().user_name(ns))
        create_secret(render_rendezvous_secret(name, ns, attempt, uid, creds))
