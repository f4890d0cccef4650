"""The real chain: a dev cluster with kube-scheduler, kwok nodes shaped from the instance catalog
(2 × p5.48xlarge, 1 × p4de.24xlarge, 1 × p5en.48xlarge) and the Kubeflow training-operator.

Nothing here writes a PyTorchJob's or a pod's status by hand: the training-operator makes the
pods, the scheduler binds them, kwok runs them (and fails one on request, via its chaos stage).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client, watch

from llmtrain_devcluster.chain import FAIL_EXIT_CODE_ANNOTATION, FAIL_POD_LABEL
from llmtrain_devcluster.process import wait_until
from operator_core.conftest import trainer_endpoint  # noqa: F401 - rank 0's metrics, for the chain's tests too
from plugins.needs import needs

PTJ = ("kubeflow.org", "v1", "pytorchjobs")


def p5_job_doc(name: str, max_restarts: int = 2) -> dict:
    """examples/llama2-7b-p5.yaml as job `name` (2 p5 nodes), restarting at once up to `max_restarts`."""
    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "llama2-7b-p5.yaml").read_text())
    doc["metadata"] = {"name": name}
    doc["spec"]["resilience"].update(maxRestarts=max_restarts, restartBackoffSeconds=0)
    return doc


def wait_for(fn, timeout: float = 60, what: str = "condition"):
    return wait_until(fn, timeout=timeout, what=what, on_fail=AssertionError)


def delete_namespace_and_its_pods(core: client.CoreV1Api, name: str, timeout: float = 60) -> None:
    """Delete namespace ``name`` and wait until its pods are gone: the simulated nodes are few, and
    the next test needs them free.

    The namespace controller starts on a deleted namespace only after a fixed 5 s (Kubernetes'
    namespaceDeletionGracePeriod, no flag), which every chain test paid in its teardown. Once the
    namespace is Terminating, the API server admits no new object in it (NamespaceLifecycle), so
    no controller can make its pods again: they are deleted here at once, kwok finishes them, and
    the namespace controller removes the rest as before."""
    core.delete_namespace(name)
    core.delete_collection_namespaced_pod(name)
    wait_for(lambda: not core.list_namespaced_pod(name).items, timeout, f"pods of namespace {name} gone")


# Package scope: only tests/chain uses it, and make test runs its tests as two units, each whole on one worker
# (tests/plugins/schedule.py), so it stops when they are done instead of idling to the end of the
# session (a chain cluster idles at ~2.6 CPU-seconds a minute, measured at load 20).
@pytest.fixture(scope="package")
@needs("cluster")
def chain_cluster(tmp_path_factory):
    from llmtrain_devcluster import DevCluster

    with DevCluster(tmp_path_factory.mktemp("chain-cluster"), chain=True) as cluster:
        yield cluster


@pytest.fixture
def chain_ns(chain_cluster):
    name = f"c-{uuid.uuid4().hex[:10]}"
    with chain_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": name}})
        wait_for(lambda: core.read_namespaced_service_account("default", name), 60, f"default ServiceAccount in {name}")
        try:
            yield name
        finally:
            delete_namespace_and_its_pods(core, name)


class Chain:
    """Read-side helpers over the chain cluster (plus the one write a test may do: ask kwok to
    fail a pod)."""

    def __init__(self, api):
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    def nodes_by_type(self) -> dict[str, str]:
        """node name -> instance type, for kwok nodes."""
        return {
            n.metadata.name: n.metadata.labels["node.kubernetes.io/instance-type"]
            for n in self.core.list_node(label_selector="type=kwok").items
        }

    def pods(self, ns: str, selector: str) -> list:
        return self.core.list_namespaced_pod(ns, label_selector=selector).items

    def wait_pods_running(self, ns: str, selector: str, count: int, timeout: float = 120) -> list:
        def running():
            pods = [p for p in self.pods(ns, selector) if p.metadata.deletion_timestamp is None]
            ok = len(pods) == count and all(p.status.phase == "Running" for p in pods)
            return pods if ok else None

        return wait_for(running, timeout, f"{count} pods Running for {selector} in {ns}")

    def fail_pod(self, ns: str, name: str, exit_code: int = 137) -> None:
        """kwok's chaos stage pod-container-running-failed: the container exits ``exit_code``."""
        self.core.patch_namespaced_pod(
            name,
            ns,
            {
                "metadata": {
                    "labels": {FAIL_POD_LABEL: "true"},
                    "annotations": {FAIL_EXIT_CODE_ANNOTATION: str(exit_code)},
                }
            },
        )

    def fail_pod_and_watch(self, ns: str, name: str, exit_code: int = 137, timeout: int = 60):
        """Fail pod ``name`` through kwok and return the pod as it was when it turned Failed.

        Watched, not polled: the training-operator deletes every pod of a failed job at once, so
        a Failed pod may exist for only milliseconds."""
        rv = self.core.list_namespaced_pod(ns, field_selector=f"metadata.name={name}").metadata.resource_version
        self.fail_pod(ns, name, exit_code)
        w = watch.Watch()
        try:
            for ev in w.stream(
                self.core.list_namespaced_pod,
                ns,
                field_selector=f"metadata.name={name}",
                resource_version=rv,
                timeout_seconds=timeout,
            ):
                pod = ev["object"]
                if pod.status.phase == "Failed":
                    return pod
        finally:
            w.stop()
        raise AssertionError(f"pod {ns}/{name} never turned Failed within {timeout}s")

    def serve_pod_here(self, ns: str, name: str) -> None:
        """Pod ``name``'s IP as a kubelet would report it, 127.0.0.1: where the test serves what
        the pod's trainer would (kwok's pods run nothing), so the operator scrapes it there."""
        self.core.patch_namespaced_pod_status(
            name,
            ns,
            [
                {"op": "replace", "path": "/status/podIP", "value": "127.0.0.1"},
                {"op": "replace", "path": "/status/podIPs", "value": [{"ip": "127.0.0.1"}]},
            ],
        )

    def ptj(self, ns: str, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(*PTJ[:2], ns, PTJ[2], name)

    def ptj_condition(self, ns: str, name: str, ctype: str) -> bool:
        conds = (self.ptj(ns, name).get("status") or {}).get("conditions") or []
        return any(c["type"] == ctype and c["status"] == "True" for c in conds)

    def scheduling_message(self, ns: str, pod: str) -> str | None:
        for e in self.core.list_namespaced_event(ns).items:
            if e.involved_object.name == pod and e.reason == "FailedScheduling":
                return e.message
        p = self.core.read_namespaced_pod(pod, ns)
        for c in p.status.conditions or []:
            if c.type == "PodScheduled" and c.status == "False" and c.message:
                return c.message
        return None


@pytest.fixture
def chain(chain_cluster):
    with chain_cluster.api_client() as api:
        yield Chain(api)
