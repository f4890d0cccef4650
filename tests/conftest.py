"""Root test fixtures: a real local Kubernetes control plane.

``dev_cluster`` (session): etcd + kube-apiserver + kube-controller-manager on free loopback ports,
with the Kubeflow PyTorchJob CRD (and the project's CRD once ``llmtrain.crd`` exists) installed.
Binaries come from ``make tools``; without them the fixture errors (it never skips).

``namespace`` (function): a fresh namespace (its ``default`` ServiceAccount already created),
deleted afterwards.

llmtrain_devcluster is imported lazily so suites that need no cluster don't pay for it.
"""

from __future__ import annotations

import time
import uuid

import pytest


@pytest.fixture(scope="session")
def dev_cluster(tmp_path_factory):
    from llmtrain_devcluster import DevCluster

    # A context manager: up() on entry (which stops what it started if it fails), down() on exit.
    with DevCluster(tmp_path_factory.mktemp("dev-cluster")) as cluster:
        yield cluster


@pytest.fixture
def namespace(dev_cluster):
    from kubernetes import client

    name = f"t-{uuid.uuid4().hex[:10]}"
    with dev_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": name, "labels": {"llmtrain.dev/test": "true"}}})
        # Pods need the namespace's default ServiceAccount (made by the controller-manager).
        deadline = time.monotonic() + 60
        delay = 0.05
        while True:
            try:
                core.read_namespaced_service_account("default", name)
                break
            except client.ApiException as e:
                if e.status != 404 or time.monotonic() > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
        try:
            yield name
        finally:
            try:
                core.delete_namespace(name)
            except client.ApiException as e:
                if e.status != 404:
                    raise
