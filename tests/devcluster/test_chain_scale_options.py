"""The chain at scale-test size: node counts, training-operator and kube-controller-manager flags are
DevCluster options (bench/recovery.py --control-plane and bench/operator_scale.py --nodes use them)."""

from __future__ import annotations

from pathlib import Path

from kubernetes import client

from llmtrain_devcluster import DevCluster


def test_node_counts_training_operator_and_controller_manager_flags_reach_the_chain(own_clusters, tmp_path):
    with DevCluster(
        tmp_path / "chain",
        chain=True,
        nodes={"p5.48xlarge": 40},
        training_operator_args=["--controller-threads=3", "--kube-api-qps=40"],
        controller_manager_args=["--kube-api-qps=60", "--kube-api-burst=90"],
    ) as cluster:
        with cluster.api_client() as api:
            nodes = client.CoreV1Api(api).list_node(label_selector="type=kwok").items
        # Exactly the requested shape (none of the default p4de/p5en), every one Ready.
        assert len(nodes) == 40
        assert {n.metadata.labels["node.kubernetes.io/instance-type"] for n in nodes} == {"p5.48xlarge"}
        assert all(any(c.type == "Ready" and c.status == "True" for c in n.status.conditions) for n in nodes)
        # The training-operator runs (it passed its readiness probe) with the flags given.
        argv = Path(f"/proc/{cluster.pids()['training-operator']}/cmdline").read_bytes().split(b"\0")
        assert b"--controller-threads=3" in argv and b"--kube-api-qps=40" in argv
        # kube-controller-manager too (it passed its health check with them)
        argv = Path(f"/proc/{cluster.pids()['kube-controller-manager']}/cmdline").read_bytes().split(b"\0")
        assert b"--kube-api-qps=60" in argv and b"--kube-api-burst=90" in argv
