"""A straggler from rank 0's metrics to the job's status, with the operator as a real process
against the real kube-apiserver: the scrape reads the straggler series, the snapshot checks the
node against the attempt's own pods, decide writes condition StragglerDetected and its event, and
the operator's per-job series follow. A node the attempt does not run on (the tenant's text) is not
believed. (The decisions themselves, replace and its sums included: test_decide_nodes.py.)

Rank 0 is a stand-in serving the straggler series as a Prometheus client writes them, on the
operator's --trainer-metrics-port at a loopback address of its own."""

from __future__ import annotations

import time
from contextlib import contextmanager

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from llmtrain import stragglers
from llmtrain_devcluster.process import free_port
from llmtrain_devcluster.standins import running_at, worker0_pod

from .conftest import OperatorProcess, wait_for
from .test_operator_cluster import tiny

NODE = "ip-10-0-3-7.ec2.internal"


@pytest.fixture(scope="module")
def operator(dev_cluster, tmp_path_factory):
    op = OperatorProcess(dev_cluster.kubeconfig, tmp_path_factory.mktemp("operator") / "operator.log", free_port())
    op.start()
    yield op
    op.stop()


@contextmanager
def rank0(op: OperatorProcess, ip: str):
    reg = CollectorRegistry()
    series = {
        "step": Gauge("llmtrain_trainer_step", "s", registry=reg),
        "heartbeat": Gauge("llmtrain_trainer_heartbeat_timestamp_seconds", "s", registry=reg),
        "score": Gauge(stragglers.SCORE, "s", ["rank", "node"], registry=reg),
        "slowdown": Gauge(stragglers.SLOWDOWN, "s", ["rank", "node"], registry=reg),
    }
    server, thread = start_http_server(op.trainer_metrics_port, addr=ip, registry=reg)
    try:
        yield series
    finally:
        server.shutdown()
        thread.join(5)


def condition(status: dict) -> dict:
    return next((c for c in status.get("conditions") or [] if c["type"] == "StragglerDetected"), {})


def test_a_straggler_on_the_attempts_node_is_reported_and_a_foreign_node_is_not(operator, kube, namespace):
    name, ip = "slow", "127.0.0.41"
    kube.apply(namespace, kube.job_doc(name, tiny()))
    with rank0(operator, ip) as m:
        m["step"].set(10)
        ptj = kube.wait_ptj(namespace, f"{name}-a1")
        pod = worker0_pod(name, 1, "llmtrain-trainer:dev", owner=ptj)
        pod["spec"]["nodeName"] = NODE  # where the scheduler put it
        kube.core.create_namespaced_pod(namespace, pod)
        kube.core.patch_namespaced_pod_status(f"{name}-a1-worker-0", namespace, running_at(ip))
        kube.set_ptj_condition(namespace, f"{name}-a1", "Running")
        kube.wait_phase(namespace, name, "Running")
        m["heartbeat"].set(time.time())
        m["score"].labels("1", NODE).set(1.6)
        m["slowdown"].labels("1", NODE).set(1.4)
        m["score"].labels("0", NODE).set(1.0)
        m["slowdown"].labels("0", NODE).set(1.0)

        found = f"rank 1 on node {NODE} computes 1.60× the other ranks' median; the job runs 1.40× slower"
        c = wait_for(
            lambda: (c := condition(kube.status(namespace, name))).get("status") == "True" and c,
            30,
            "StragglerDetected",
        )
        assert (c["reason"], c["message"]) == ("Straggler", found)
        st = kube.status(namespace, name)["straggler"]
        assert (st["attempt"], st["rank"], st["node"], st["score"], st["slowdown"]) == (1, 1, NODE, 1.6, 1.4)
        assert [e.message for e in kube.events(namespace, name) if e.reason == "Straggler" and e.type == "Warning"] == [
            found
        ]
        labels = f'llmtrain_job="{name}",namespace="{namespace}",node="{NODE}",rank="1"'
        series = f"llmtrain_job_straggler_slowdown{{{labels}}} 1.4"
        wait_for(lambda: series in operator.metrics(), 30, "the straggler's series")

        # The endpoint now blames a node none of the attempt's pods runs on: not believed.
        m["score"].clear()
        m["slowdown"].clear()
        m["score"].labels("1", "someone-elses-node").set(3.0)
        m["slowdown"].labels("1", "someone-elses-node").set(2.0)
        c = wait_for(
            lambda: (c := condition(kube.status(namespace, name))).get("status") == "False" and c, 30, "NoStraggler"
        )
        assert c["reason"] == "NoStraggler" and NODE in c["message"]
        assert "straggler" not in kube.status(namespace, name)
        wait_for(lambda: "llmtrain_job_straggler_slowdown{" not in operator.metrics(), 30, "the series gone")
        assert kube.status(namespace, name)["attempt"] == 1  # report: nothing restarts
