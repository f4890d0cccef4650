"""An attempt's child and pods on any backend, for the tests that tell the same story on all of
them (issue 28's parity: random faults, failover, Kueue, bad nodes, goodput).

A test takes the ``backend`` fixture (tests/conftest.py: one run per backend); its operator enables
them all (``OPERATOR_ARGS``) and its jobs name theirs (``on``), so one operator process, and one
cluster, serve every run of a module. What differs per backend is read from the backend itself
(llmtrain.backends): the child's kind, its state in decide's words, rank 0's pod label. Pods are
found by the labels the renderer puts on every attempt's pods whatever the backend
(``attempt_pods``), never by a backend controller's own label.
"""

from __future__ import annotations

from kubernetes import client

from llmtrain.backends import BACKENDS, get
from llmtrain.render import ATTEMPT_LABEL, JOB_LABEL

NAMES = tuple(BACKENDS)
# an operator that serves jobs of every backend (the job's spec.cluster.backend picks)
OPERATOR_ARGS = tuple(arg for name in NAMES for arg in ("--backend", name))


def on(doc: dict, backend: str) -> dict:
    """The job document ``doc`` on ``backend`` (spec.cluster.backend)."""
    doc["spec"]["cluster"]["backend"] = backend
    return doc


def kind(backend: str) -> tuple[str, str, str]:
    """(group, version, plural) of the backend's child kind."""
    k = get(backend).child
    return k.group, k.version, k.plural


def attempt_pods(job: str, attempt: int) -> str:
    """The label selector of attempt ``attempt``'s pods of job ``job``, on any backend."""
    return f"{JOB_LABEL}={job},{ATTEMPT_LABEL}={attempt}"


def get_child(api: client.ApiClient, backend: str, ns: str, name: str) -> dict:
    group, version, plural = kind(backend)
    return client.CustomObjectsApi(api).get_namespaced_custom_object(group, version, ns, plural, name)


def children(api: client.ApiClient, backend: str, ns: str, job: str | None = None) -> list[dict]:
    """The backend's children in ``ns`` (of job ``job``, by the label the renderer puts on them)."""
    group, version, plural = kind(backend)
    selector = f"{JOB_LABEL}={job}" if job else None
    return client.CustomObjectsApi(api).list_namespaced_custom_object(
        group, version, ns, plural, label_selector=selector
    )["items"]


def live_names(items: list[dict]) -> list[str]:
    return sorted(i["metadata"]["name"] for i in items if not i["metadata"].get("deletionTimestamp"))


def state(backend: str, obj: dict) -> str | None:
    """The child's state in decide's words, as the operator reads it."""
    return get(backend).state(obj).state


# where each backend's child keeps the worker pod template (a backend missing here fails loudly)
_POD_TEMPLATE = {
    "pytorchjob": lambda obj: obj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"],
    "jobset": lambda obj: obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"],
    "job": lambda obj: obj["spec"]["template"],
}


def pod_template(backend: str, obj: dict) -> dict:
    """The worker pod template inside a rendered or stored child."""
    return _POD_TEMPLATE[backend](obj)


def suspended(backend: str, obj: dict) -> bool:
    return get(backend).state(obj).suspended


def rank0(backend: str, pods: list) -> object:
    """The pod where global rank 0 runs, among an attempt's pods (client objects)."""
    label = get(backend).rank_label
    (pod,) = [p for p in pods if (p.metadata.labels or {}).get(label) == "0"]
    return pod
