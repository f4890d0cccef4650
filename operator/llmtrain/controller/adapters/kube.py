"""The few Kubernetes API calls the operator makes, through the official client's ApiClient.

LLMTrainingJobs (get, patch status), the attempts' children of every backend (get, create, delete:
`kind` is a backend's `child`, llmtrain.backends), the objects between a child and its pods (get:
`owner`, a JobSet's Jobs), Events (create), Kueue Workloads (list, for a queued job's message) and
API discovery (whether a backend's kind is served). Every permission the operator needs, these and
the others' (nodes.py, taints.py, tenancy.py, leader.py, kopf), is listed in rbac.py.

These, and the pod, node and Secret calls of nodes.py, taints.py and tenancy.py, are raw requests
(`_request`: the response's JSON as a dict), not the generated API classes: importing CoreV1Api
builds hundreds of model classes (the operator's import took 1.98 s of CPU with it and 1.10 s
without, on one loaded host: a cost every restart and failover pays before re-adopting anything),
and each generated method validates its arguments with pydantic (building that validator on its
first call) and returns models the operator would turn back into dicts. Only the Lease
(leader.py) and NetworkPolicy (tenancy.py) clients, imported when those features are on, are
generated ones.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from functools import cache
from importlib.metadata import PackageNotFoundError, version

import kubernetes
from kubernetes.client.exceptions import ApiException

from ...backends import ApiKind
from ...spec import GROUP, PLURAL, VERSION

# Kueue's Workloads (read only: controller/adapters/kueue.py); v1beta2 is served and stored since Kueue v0.15
KUEUE_GROUP, KUEUE_VERSION, WORKLOAD_PLURAL = "kueue.x-k8s.io", "v1beta2", "workloads"


# Enough pooled connections for every handler thread plus the scraper's executor: with the client's
# default (5 × CPUs) a busy operator on a 2-CPU pod queues its API calls on the pool.
CONNECTION_POOL_SIZE = 64


FIELD_MANAGER = "llmtrain-operator"


def _user_agent() -> str:
    """What the API server's audit log names as the operator's client, and what it names the field
    manager of everything the operator writes (its prefix before the first `/`): without it every
    write was `OpenAPI-Generator`'s, the Python client's default, indistinguishable from a user's
    script in `kubectl get --show-managed-fields`."""
    try:
        return f"{FIELD_MANAGER}/{version('llmtrain')}"
    except PackageNotFoundError:  # run from a source tree that is not installed
        return FIELD_MANAGER


@cache
def _client() -> kubernetes.client.ApiClient:
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    config = kubernetes.client.Configuration.get_default_copy()
    config.connection_pool_maxsize = CONNECTION_POOL_SIZE
    api = kubernetes.client.ApiClient(config)
    api.user_agent = _user_agent()
    return api


def _request(
    method: str,
    path: str,
    params: dict,
    body: dict | list | None = None,
    content_type: str = "application/json",
    query: dict[str, str] | None = None,
) -> dict:
    """One request, the response's JSON as a dict; ApiException on any non-2xx answer (its status
    and body, as the generated methods raise). `path` is a template filled from `params`; callers
    write the method, the path and the params dict out literally (module constants allowed), as
    tests/charts/test_operator_rbac.py reads them from the source for the RBAC table. The
    generated methods would also validate every argument with pydantic and wrap the call in their
    legacy options: 0.1-0.2 ms more client CPU per request (1.8-1.9 ms vs 1.6-1.8 ms against a
    local server)."""
    api = _client()
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = content_type
    request = api.param_serialize(
        method,
        path,
        path_params=params,
        query_params=list((query or {}).items()),
        body=body,
        header_params=headers,
        auth_settings=["BearerToken"],
    )
    response = api.call_api(*request)
    response.read()
    if not 200 <= response.status < 300:
        raise ApiException(http_resp=response)
    return json.loads(response.data or b"{}")


_OBJECTS = "/apis/{group}/{version}/namespaces/{namespace}/{plural}"


def get_job(namespace: str, name: str) -> dict | None:
    try:
        return _request(
            "GET",
            _OBJECTS + "/{name}",
            {"group": GROUP, "version": VERSION, "namespace": namespace, "plural": PLURAL, "name": name},
        )
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
    return _request(
        "PATCH",
        _OBJECTS + "/{name}/status",
        {"group": GROUP, "version": VERSION, "namespace": namespace, "plural": PLURAL, "name": name},
        body,
        "application/merge-patch+json",
    )


def patch_running_progress(namespace: str, name: str, progress: dict) -> dict | None:
    """Replace status.progress only while status.phase is Running, atomically: one JSON patch whose
    `test` fails (422) otherwise, and None then (or when the job is gone). The monitor's write: a
    scrape taken just before a job ended must not overwrite the final progress, or put back the
    ETA, that decide's write ending the job left (controller/policy/ending.py)."""
    try:
        return _request(
            "PATCH",
            _OBJECTS + "/{name}/status",
            {"group": GROUP, "version": VERSION, "namespace": namespace, "plural": PLURAL, "name": name},
            [
                {"op": "test", "path": "/status/phase", "value": "Running"},
                {"op": "add", "path": "/status/progress", "value": progress},
            ],
            "application/json-patch+json",
        )
    except ApiException as err:
        if err.status == 422:  # most often the test (the job moved on); the server's words say which
            logging.getLogger("llmtrain.operator").info(
                "progress of %s/%s not written: %s", namespace, name, str(err.body or err.reason or "")[:300]
            )
            return None
        if err.status == 404:
            return None
        raise


def get_child(kind: ApiKind, namespace: str, name: str) -> dict | None:
    try:
        return _request(
            "GET",
            _OBJECTS + "/{name}",
            {"group": kind.group, "version": kind.version, "namespace": namespace, "plural": kind.plural, "name": name},
        )
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def create_child(kind: ApiKind, obj: dict) -> tuple[dict, bool]:
    """Create, or adopt the one already there (an operator restart must never duplicate).
    Returns (object, created)."""
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    try:
        return _request(
            "POST",
            _OBJECTS,
            {"group": kind.group, "version": kind.version, "namespace": ns, "plural": kind.plural},
            obj,
        ), True
    except ApiException as err:
        if err.status != 409:
            raise
    existing = get_child(kind, ns, name)
    if existing is None:  # deleted between our create and get: let the caller retry
        raise RuntimeError(f"{kind.kind} {ns}/{name} vanished while being adopted")
    return existing, False


def create_service(obj: dict) -> bool:
    """A child's companion Service (Backend.companions): True if created, False if one of that name
    was there already (left as it is: created only, never read)."""
    try:
        _request("POST", "/api/v1/namespaces/{namespace}/services", {"namespace": obj["metadata"]["namespace"]}, obj)
        return True
    except ApiException as err:
        if err.status != 409:
            raise
        return False


def delete_child(kind: ApiKind, namespace: str, name: str) -> None:
    try:
        _request(
            "DELETE",
            _OBJECTS + "/{name}",
            {"group": kind.group, "version": kind.version, "namespace": namespace, "plural": kind.plural, "name": name},
            {"propagationPolicy": "Background"},
        )
    except ApiException as err:
        if err.status != 404:
            raise


def get_owner(owner: ApiKind, namespace: str, name: str) -> dict | None:
    """One object between a child and its pods (a JobSet's Job), to check whose it is (owners.py)."""
    try:
        return _request(
            "GET",
            _OBJECTS + "/{name}",
            {
                "group": owner.group,
                "version": owner.version,
                "namespace": namespace,
                "plural": owner.plural,
                "name": name,
            },
        )
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def served(kind: ApiKind) -> bool:
    """Whether the API server serves `kind` (its CRD is installed and established): API discovery,
    which every authenticated client may read (system:discovery), no RBAC of ours."""
    try:
        found = _request("GET", "/apis/{group}/{version}", {"group": kind.group, "version": kind.version})
    except ApiException as err:
        if err.status == 404:
            return False
        raise
    return any(r.get("name") == kind.plural for r in found.get("resources") or [])


def list_workloads(namespace: str, label_selector: str) -> list[dict]:
    """Kueue's Workloads in `namespace` matching the selector (controller/adapters/kueue.py)."""
    return _request(
        "GET",
        _OBJECTS,
        {"group": KUEUE_GROUP, "version": KUEUE_VERSION, "namespace": namespace, "plural": WORKLOAD_PLURAL},
        query={"labelSelector": label_selector},
    )["items"]


# The operator's own ConfigMaps, in its namespace (retired.py's ledger). Replaced whole, on the
# resourceVersion read: a write that finds it changed is a 409.
_CONFIGMAPS = "/api/v1/namespaces/{namespace}/configmaps"
CONFIGMAP_LABELS = {"app.kubernetes.io/managed-by": "llmtrain-operator"}


def _configmap(namespace: str, name: str, data: dict[str, str], resource_version: str | None = None) -> dict:
    meta: dict = {"name": name, "namespace": namespace, "labels": CONFIGMAP_LABELS}
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def get_configmap(namespace: str, name: str) -> dict | None:
    try:
        return _request("GET", _CONFIGMAPS + "/{name}", {"namespace": namespace, "name": name})
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def create_configmap(namespace: str, name: str, data: dict[str, str]) -> dict:
    """409 when it exists already."""
    return _request("POST", _CONFIGMAPS, {"namespace": namespace}, _configmap(namespace, name, data))


def replace_configmap(namespace: str, name: str, data: dict[str, str], resource_version: str) -> dict:
    """409 when it changed since `resource_version` was read."""
    return _request(
        "PUT",
        _CONFIGMAPS + "/{name}",
        {"namespace": namespace, "name": name},
        _configmap(namespace, name, data, resource_version),
    )


# The Event kopf.info/warn would post (kopf's default reporting fields: `kubectl describe` shows the
# same "From"), posted here with one blocking request from the calling thread.
EVENT_NAME_PREFIX, REPORTING_COMPONENT, REPORTING_INSTANCE = "kopf-event-", "kopf", "dev"
MAX_EVENT_MESSAGE = 1024


def post_event(ref: dict, warning: bool, reason: str, message: str) -> None:
    """Create an Event about the object `ref` (apiVersion, kind, name, uid, namespace). Events are
    auxiliary: a failure is logged, never raised. The response is not turned into a V1Event."""
    if len(message) > MAX_EVENT_MESSAGE:
        half = (MAX_EVENT_MESSAGE - 3) // 2
        message = f"{message[:half]}...{message[-(MAX_EVENT_MESSAGE - 3 - half) :]}"
    at = dt.datetime.now(dt.UTC).isoformat()
    body = {
        "metadata": {"namespace": ref["namespace"], "generateName": EVENT_NAME_PREFIX},
        "action": reason,
        "type": "Warning" if warning else "Normal",
        "reason": reason,
        "message": message,
        "reportingComponent": REPORTING_COMPONENT,
        "reportingInstance": REPORTING_INSTANCE,
        "source": {"component": REPORTING_COMPONENT},
        "involvedObject": ref,
        "firstTimestamp": at,
        "lastTimestamp": at,
        "eventTime": at,
    }
    try:
        # The raw call (`_request`): CoreV1Api.create_namespaced_event would validate the dict into
        # a CoreV1Event model (pydantic) and build another from the response, for nothing.
        _request("POST", "/api/v1/namespaces/{namespace}/events", {"namespace": ref["namespace"]}, body)
    except Exception as err:  # noqa: BLE001 — as kopf: an event never fails the handling
        logging.getLogger("llmtrain.operator").warning(
            "failed to post event %s %s about %s/%s: %r", reason, message[:80], ref["namespace"], ref["name"], err
        )
