"""The few Kubernetes API calls the operator makes, through the official client.

LLMTrainingJobs (get, patch status), PyTorchJobs (get, create, delete). Every permission the
operator needs, these and the others' (nodes.py, leader.py, kopf), is listed in rbac.py.
"""

from __future__ import annotations

from functools import cache

import kubernetes
from kubernetes.client.exceptions import ApiException

from ..spec import GROUP, PLURAL, VERSION

PTJ_GROUP, PTJ_VERSION, PTJ_PLURAL = "kubeflow.org", "v1", "pytorchjobs"


# Enough pooled connections for every handler thread plus the scraper's executor: with the client's
# default (5 × CPUs) a busy operator on a 2-CPU pod queues its API calls on the pool.
CONNECTION_POOL_SIZE = 64


@cache
def _client() -> kubernetes.client.ApiClient:
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    config = kubernetes.client.Configuration.get_default_copy()
    config.connection_pool_maxsize = CONNECTION_POOL_SIZE
    return kubernetes.client.ApiClient(config)


def custom() -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(_client())


def core() -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(_client())


def get_job(namespace: str, name: str) -> dict | None:
    try:
        return custom().get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def patch_job_status(namespace: str, name: str, status: dict, resource_version: str | None = None) -> dict:
    """Merge-patch the status subresource. With `resource_version` the patch only applies if nobody
    changed the object since it was read (409 otherwise): the guard against acting twice."""
    body: dict = {"status": status}
    if resource_version:
        body["metadata"] = {"resourceVersion": resource_version}
    return custom().patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name, body)


def get_pytorchjob(namespace: str, name: str) -> dict | None:
    try:
        return custom().get_namespaced_custom_object(PTJ_GROUP, PTJ_VERSION, namespace, PTJ_PLURAL, name)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def create_pytorchjob(obj: dict) -> tuple[dict, bool]:
    """Create, or adopt the one already there (an operator restart must never duplicate).
    Returns (object, created)."""
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    try:
        return custom().create_namespaced_custom_object(PTJ_GROUP, PTJ_VERSION, ns, PTJ_PLURAL, obj), True
    except ApiException as err:
        if err.status != 409:
            raise
    existing = get_pytorchjob(ns, name)
    if existing is None:  # deleted between our create and get: let the caller retry
        raise RuntimeError(f"PyTorchJob {ns}/{name} vanished while being adopted")
    return existing, False


def ensure_pytorchjob(obj: dict, probably_exists: bool) -> tuple[dict, bool]:
    """The PyTorchJob `obj` names, created if missing. When it probably exists already (a resumed
    job whose status records it) one GET adopts it; otherwise one POST creates it."""
    if probably_exists:
        existing = get_pytorchjob(obj["metadata"]["namespace"], obj["metadata"]["name"])
        if existing is not None:
            return existing, False
    return create_pytorchjob(obj)


def delete_pytorchjob(namespace: str, name: str) -> None:
    try:
        custom().delete_namespaced_custom_object(
            PTJ_GROUP, PTJ_VERSION, namespace, PTJ_PLURAL, name,
            body=kubernetes.client.V1DeleteOptions(propagation_policy="Background"))
    except ApiException as err:
        if err.status != 404:
            raise
