"""What an attempt needs besides its PyTorchJob, so other namespaces cannot reach its training
(docs/operations/tenant-isolation.md): the job's NetworkPolicy, and with a rendezvous CA the
Secret with its namespace's etcd credentials.

Both are only ever created, never read: the operator cannot read tenants' Secrets (no `get`).
An object already there (an operator restart, a retried attempt) is left as it is; if a tenant
put something else under that name in its own namespace, only its own job suffers."""

from __future__ import annotations

from functools import cache

from kubernetes.client.api.networking_v1_api import NetworkingV1Api
from kubernetes.client.exceptions import ApiException

from .. import rendezvous_auth
from ..render import render_networkpolicy, render_rendezvous_secret, uses_operator_etcd
from ..spec import LLMTrainingJobSpec
from . import kube
from .config import OperatorConfig


@cache
def _ca(ca_dir: str) -> rendezvous_auth.CertificateAuthority:
    return rendezvous_auth.CertificateAuthority.from_dir(ca_dir)


@cache
def _admin(endpoint: str, ca_dir: str) -> rendezvous_auth.EtcdAdmin:
    admin = rendezvous_auth.EtcdAdmin(endpoint, _ca(ca_dir))
    admin.bootstrap()
    return admin


def create_networkpolicy(obj: dict) -> bool:
    """True if created, False if one of that name was there already."""
    try:
        NetworkingV1Api(kube._client()).create_namespaced_network_policy(obj["metadata"]["namespace"], obj)
        return True
    except ApiException as err:
        if err.status != 409:
            raise
        return False


def create_secret(obj: dict) -> bool:
    """True if created, False if one of that name was there already."""
    try:
        kube.core().create_namespaced_secret(obj["metadata"]["namespace"], obj)
        return True
    except ApiException as err:
        if err.status != 409:
            raise
        return False


def prepare_attempt(
    cfg: OperatorConfig, spec: LLMTrainingJobSpec, ns: str, name: str, uid: str | None, attempt: int
) -> None:
    """Before attempt N's PyTorchJob: its NetworkPolicy (with --job-network-policy) and, when it
    meets on the operator's etcd and the operator holds the rendezvous CA, its credentials."""
    if cfg.job_network_policy:
        create_networkpolicy(render_networkpolicy(spec, name, ns, uid))
    if cfg.rendezvous_ca_dir and cfg.default_etcd_endpoint and uses_operator_etcd(spec):
        admin = _admin(cfg.default_etcd_endpoint, cfg.rendezvous_ca_dir)
        admin.ensure_current()  # an etcd restarted without its data is set up (and wiped) again
        admin.ensure_namespace(ns)
        creds = _ca(cfg.rendezvous_ca_dir).issue(rendezvous_auth.user_name(ns))
        create_secret(render_rendezvous_secret(name, ns, attempt, uid, creds))
