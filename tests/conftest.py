"""Root test fixtures: a real local Kubernetes control plane.

``dev_cluster`` (session): etcd + kube-apiserver + kube-controller-manager on free loopback ports,
with the Kubeflow PyTorchJob CRD (and the project's CRD once ``llmtrain.crd`` exists) installed.
Binaries come from ``make tools``; without them the fixture errors (it never skips).

``namespace`` (function): a fresh namespace (its ``default`` ServiceAccount already created),
deleted afterwards.

``kube_tools`` / ``own_clusters``: for a test that runs the tools or starts clusters itself. Each
fixture here says what it needs (``@needs``), which marks the tests that use it (tests/plugins).

llmtrain_devcluster is imported lazily so suites that need no cluster don't pay for it.
"""

from __future__ import annotations

import os
import time
import uuid

# One intra-op thread for torch in every test process and whatever it starts (set before any test
# module imports torch): make test runs 4 workers on 2 cores, where a second OpenMP thread per
# process only spins. The trainer launches and benches already set it (their figures do not
# depend on this); in the in-process trainer unit tests it cut CPU by a fifth on a quiet machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The Go processes the tests start (each test cluster's etcd, kube-apiserver and controllers, kwok,
# Kueue; helm, kubectl, terraform) run with one scheduler thread (P) and collect garbage less often.
# With four workers' clusters on two cores a second P mostly spins looking for work; GOGC=300 trades
# memory the machine has (a chain test's kube-apiserver peaks at ~1.0 GB RSS instead of ~0.6) for
# CPU it lacks; GOMEMLIMIT (soft) has a Go process past 1 GiB collect as often as it must, so the
# memory GOGC=300 adds stays bounded.
# Measured (docs: Build and test): the operator_core and charts suites on 4 workers 221 -> 208 CPU-s
# with one P, then -> 185 with GOGC=300; three chain modules 120 -> 99 -> 92. Outside the tests
# (make demo, make dev-cluster, a bench run by hand) Go's defaults hold.
os.environ.setdefault("GOMAXPROCS", "1")
os.environ.setdefault("GOGC", "300")
os.environ.setdefault("GOMEMLIMIT", "1GiB")

import pytest

from llmtrain.backends import BACKENDS

# Markers from fixtures (cluster, tools), the order and grouping of xdist runs (make test), and
# the time per suite at the end of every run.
pytest_plugins = ["plugins.needs", "plugins.schedule", "plugins.suite_times"]
pytest.register_assert_rewrite(*pytest_plugins)  # imported here before pytest loads them

from plugins.needs import needs  # noqa: E402


@pytest.fixture(scope="session")
@needs("cluster")
def dev_cluster(tmp_path_factory):
    from llmtrain_devcluster import DevCluster

    # A context manager: up() on entry (which stops what it started if it fails), down() on exit.
    with DevCluster(tmp_path_factory.mktemp("dev-cluster")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
@needs("tools")
def kube_tools():
    """The directory of `make tools`' binaries, for a test that runs them itself."""
    from llmtrain_devcluster.tools import tools_dir

    return tools_dir()


@pytest.fixture
@needs("cluster")
def own_clusters():
    """For a test that starts and stops dev clusters itself (the CLI's `up` and `down`, a cluster
    of another shape): it says so, and gets the `cluster` marker."""


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


@pytest.fixture(params=tuple(BACKENDS))
def backend(request) -> str:
    """The training backend a parity test runs on (issue 28): each such test runs once per backend
    (every one llmtrain.backends registers), all on the same module's cluster and operator
    (tests/backend_child.py)."""
    return request.param
