"""Kueue's topology-aware placement on the real chain: six p5.48xlarge kwok nodes labelled with the
EKS network layers (blocks of four under one network-node-layer-3: kwok-p5-48xlarge-0..3 and -4..5),
a Kueue Topology of those levels, topology-aware flavors. A 4-node job that requires one layer-3
block lands in one; a 5-node one waits in the queue rather than spreading, though the quota and the
nodes would hold it. On both backends (the `backend` fixture; one cluster and operator for both):
Kueue reads the pod set's topology annotation from a PyTorchJob's Worker template or a JobSet's
replicated Job's."""

from __future__ import annotations

import pytest
from kubernetes import client

from backend_child import OPERATOR_ARGS, attempt_pods, pod_template
from llmtrain_devcluster.chain import TOPOLOGY_LABELS
from llmtrain_devcluster.process import free_port
from operator_core.conftest import OperatorProcess
from plugins.needs import needs

from .conftest import wait_for
from .test_kueue_chain import Jobs, p5_job, queue_ns  # noqa: F401 — the fixture, on this module's cluster

pytestmark = [pytest.mark.slow]
LAYER3 = TOPOLOGY_LABELS[2]


@pytest.fixture(scope="module")
@needs("cluster")
def kueue_cluster(tmp_path_factory):
    from llmtrain_devcluster import DevCluster

    with DevCluster(
        tmp_path_factory.mktemp("kueue-tas"), chain=True, kueue=True, kueue_topology=True, nodes={"p5.48xlarge": 6}
    ) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def kueue_operator(kueue_cluster, tmp_path_factory):
    op = OperatorProcess(
        kueue_cluster.kubeconfig,
        tmp_path_factory.mktemp("kueue-tas-operator") / "operator.log",
        free_port(),
        extra_args=list(OPERATOR_ARGS),
    )
    op.start()
    yield op
    op.stop()


@pytest.fixture
def api(kueue_cluster):
    with kueue_cluster.api_client() as api:
        yield api


def topology_job(name: str, nodes: int, backend: str) -> dict:
    doc = p5_job(name, backend=backend)
    doc["spec"]["cluster"].update(nodes=nodes, topology={"mode": "required", "level": LAYER3})
    doc["spec"]["training"]["globalBatchTokens"] = nodes * 8 * 4096 * 16
    return doc


def test_required_layer3_lands_in_one_block_or_waits(kueue_operator, api, queue_ns, backend):  # noqa: F811
    jobs = Jobs(api, queue_ns, backend)
    core = client.CoreV1Api(api)
    block = {n.metadata.name: n.metadata.labels[LAYER3] for n in core.list_node().items}
    jobs.create(topology_job("close", 4, backend))
    jobs.wait("close", "Running", timeout=180)
    template = pod_template(backend, jobs.child("close-a1"))
    assert template["metadata"]["annotations"]["kueue.x-k8s.io/podset-required-topology"] == LAYER3
    pods = core.list_namespaced_pod(queue_ns, label_selector=attempt_pods("close", 1)).items
    assert len(pods) == 4 and len({block[p.spec.node_name] for p in pods}) == 1, [p.spec.node_name for p in pods]

    jobs.delete("close")
    wait_for(lambda: not core.list_namespaced_pod(queue_ns).items, 90, "the 4-node job's pods gone")
    jobs.create(topology_job("wide", 5, backend))  # no block has 5 nodes: it waits, it does not spread
    queued = jobs.wait("wide", "Pending", "Queued", timeout=90)
    assert queued["restarts"] == 0 and not core.list_namespaced_pod(queue_ns).items
    wait_for(
        lambda: "topology" in (jobs.status("wide").get("message") or "").lower(), 60, "Kueue's words about the topology"
    )
