"""The renderer's resource requests, scheduled by the real kube-scheduler onto kwok nodes shaped
from the instance catalog: a p5.48xlarge job lands on p5 nodes and nowhere smaller."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes.utils import parse_quantity

from llmtrain.backends.pytorchjob import render_pytorchjob
from llmtrain.catalog import instance_type
from llmtrain.render import INSTANCE_TYPE_LABEL
from llmtrain.validation import load_job
from llmtrain_devcluster.chain import DEFAULT_NODES

from .conftest import PTJ, wait_for

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "llama2-7b-p5.yaml"


def _rendered(ns: str, core) -> dict:
    job = load_job(str(EXAMPLE))
    assert job.spec.cluster.instance_type == "p5.48xlarge"
    sa = job.spec.cluster.service_account_name
    if sa:
        core.create_namespaced_service_account(ns, {"metadata": {"name": sa}})
    return render_pytorchjob(job.spec, job.name, ns, default_etcd_endpoint="etcd.test.svc:2379")


def test_catalog_shapes_the_kwok_nodes(chain):
    core = chain.core
    by_type = chain.nodes_by_type()
    assert sorted(by_type.values()) == sorted(t for t, n in DEFAULT_NODES.items() for _ in range(n))
    for name, t in by_type.items():
        node = core.read_node(name)
        inst = instance_type(t)
        cap = node.status.capacity
        assert cap["nvidia.com/gpu"] == str(inst.gpus_per_node)
        assert cap["vpc.amazonaws.com/efa"] == str(inst.efa_interfaces)
        assert parse_quantity(cap["hugepages-2Mi"]) == parse_quantity(inst.hugepages_2mi)
        assert parse_quantity(cap["memory"]) == inst.memory_gib * 2**30
        assert cap["cpu"] == str(inst.vcpus)
        assert {(t_.key, t_.effect) for t_ in node.spec.taints} == {
            ("nvidia.com/gpu", "NoSchedule"),
            ("vpc.amazonaws.com/efa", "NoSchedule"),
        }
        assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)


def test_rendered_p5_pytorchjob_runs_on_p5_nodes_only(chain, chain_ns):
    obj = _rendered(chain_ns, chain.core)
    name = obj["metadata"]["name"]
    replicas = obj["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"]
    chain.custom.create_namespaced_custom_object(*PTJ[:2], chain_ns, PTJ[2], obj)
    pods = chain.wait_pods_running(chain_ns, f"training.kubeflow.org/job-name={name}", replicas)
    by_type = chain.nodes_by_type()
    placed = {p.metadata.name: p.spec.node_name for p in pods}
    assert {by_type[n] for n in placed.values()} == {"p5.48xlarge"}, placed
    # Each worker asks for all 8 GPUs and 32 EFA interfaces of a node: one worker per node.
    assert len(set(placed.values())) == replicas, placed
    wait_for(
        lambda: chain.ptj_condition(chain_ns, name, "Running"),
        60,
        f"PyTorchJob {name} Running (set by the training-operator)",
    )


def test_without_the_instance_type_pin_smaller_nodes_lack_the_efa_count(chain, chain_ns):
    obj = _rendered(chain_ns, chain.core)
    tmpl = obj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    spec = dict(tmpl["spec"])
    spec.pop("nodeSelector", None)
    # Keep the p5s out of reach: what is left must be refused on resources alone.
    spec["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": INSTANCE_TYPE_LABEL, "operator": "NotIn", "values": ["p5.48xlarge"]}]}
                ]
            }
        }
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p5-worker-off-p5", "labels": tmpl["metadata"].get("labels", {})},
        "spec": spec,
    }
    chain.core.create_namespaced_pod(chain_ns, pod)
    msg = wait_for(
        lambda: chain.scheduling_message(chain_ns, "p5-worker-off-p5"),
        60,
        "FailedScheduling for the p5 worker kept off p5 nodes",
    )
    total = sum(DEFAULT_NODES.values())
    smaller = sum(n for t, n in DEFAULT_NODES.items() if t != "p5.48xlarge")
    assert f"0/{total} nodes are available" in msg, msg
    assert f"{smaller} Insufficient vpc.amazonaws.com/efa" in msg, msg
    assert chain.core.read_namespaced_pod("p5-worker-off-p5", chain_ns).spec.node_name is None
