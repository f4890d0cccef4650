"""The few Kubernetes API calls the operator makes, through the official client.

Kept in one place so the RBAC the chart grants can be read off this file: LLMTrainingJobs
(get, patch status), PyTorchJobs (get, create, delete), Pods (list).
"""

from __future__ import annotations

from functools import cache

import kubernetes
from kubernetes.client.exceptions import ApiException

from ..spec import GROUP, PLURAL, VERSION

PTJ_GROUP, PTJ_VERSION, PTJ_PLURAL = "kubeflow.org", "v1", "pytorchjobs"


@cache
def _client() -> kubernetes.client.ApiClient:
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    return kubernetes.client.ApiClient()


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


def delete_pytorchjob(namespace: str, name: str) -> None:
    try:
        custom().delete_namespaced_custom_object(
            PTJ_GROUP, PTJ_VERSION, namespace, PTJ_PLURAL, name,
            body=kubernetes.client.V1DeleteOptions(propagation_policy="Background"))
    except ApiException as err:
        if err.status != 404:
            raise


def rank0_pod_ip(namespace: str, job: str, attempt: int) -> str | None:
    """IP of the attempt's first worker pod (replica index 0), where local rank 0 serves metrics."""
    from ..render import ATTEMPT_LABEL, JOB_LABEL, REPLICA_INDEX_LABEL
    pods = core().list_namespaced_pod(
        namespace, label_selector=f"{JOB_LABEL}={job},{ATTEMPT_LABEL}={attempt}").items
    pods.sort(key=lambda p: (p.metadata.labels.get(REPLICA_INDEX_LABEL, "~"), p.metadata.name))
    for pod in pods:
        if pod.status and pod.status.pod_ip:
            return pod.status.pod_ip
    return None
