"""A hostile tenant's attack on the operator (issue 18, item 1): the operator serving two tenants'
namespaces, one of them hostile, keeps serving the other's new jobs with bounded memory.

In a module of its own: the operator measured here must be the only one serving both namespaces
(test_hostile_tenant.py's module shares one watching every namespace, which would create the
victim's PyTorchJobs whatever this one did; OperatorProcess.start refuses the overlap)."""

from __future__ import annotations

import time

import pytest

from llmtrain.spec import GROUP, PLURAL, VERSION
from llmtrain_devcluster.process import free_port
from llmtrain_devcluster.standins import running_at, worker0_pod

from .conftest import OperatorProcess, wait_for
from .test_hostile_tenant import MiB, _bound_pod, _terminated, hostile_server
from .test_operator_cluster import tiny

# --- the attack: one tenant against the operator, another tenant's new job ---------------------


@pytest.fixture
def other_namespace(dev_cluster):
    """A second tenant's namespace (the `namespace` fixture's way)."""
    import uuid

    from kubernetes import client

    name = f"t-{uuid.uuid4().hex[:10]}"
    with dev_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": name, "labels": {"llmtrain.dev/test": "true"}}})
        wait_for(lambda: core.read_namespaced_service_account("default", name), 60, "default ServiceAccount")
        try:
            yield name
        finally:
            core.delete_namespace(name)


def _rss_kib(pid: int) -> dict:
    with open(f"/proc/{pid}/status") as f:
        return {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in f) if k in ("VmRSS", "VmHWM")}


@pytest.mark.slow
def test_the_operator_under_a_tenants_attack_keeps_serving_another_namespace(
    dev_cluster, kube, namespace, other_namespace, tmp_path
):
    """Tenant A runs two jobs whose rank 0 is hostile (an endless /metrics body, a gzip bomb) and
    leaves a worker-labelled pod with a backtracking termination message, plus the same message from
    a pod of its own PyTorchJob. Meanwhile tenant B's new job must get its PyTorchJob within a few
    seconds, /healthz must keep answering, and the operator's peak RSS must stay far below the
    chart's 512 MiB limit. (Before the fix: /healthz stopped answering, B's job got no PyTorchJob
    in 80 s, and the scrapes alone took the operator past 3.5 GB.)"""
    import urllib.request

    port = free_port()
    watched = ["--namespace", namespace, "--namespace", other_namespace]
    op = OperatorProcess(dev_cluster.kubeconfig, tmp_path / "operator.log", port, watched)
    op.start()
    hostile_message = "xid" + " " * 4090 + "!"
    try:
        with (
            hostile_server("stream", "127.0.0.31", port) as (_, stream),
            hostile_server("gzip", "127.0.0.32", port) as (_, bomb),
        ):
            for name, ip in (("stream", "127.0.0.31"), ("bomb", "127.0.0.32")):
                kube.apply(namespace, kube.job_doc(name, tiny()))
                ptj = kube.wait_ptj(namespace, f"{name}-a1")
                kube.core.create_namespaced_pod(namespace, worker0_pod(name, 1, "llmtrain-trainer:dev", owner=ptj))
                kube.core.patch_namespaced_pod_status(f"{name}-a1-worker-0", namespace, running_at(ip))
                own = _bound_pod(worker0_pod(name, 1, "llmtrain-trainer:dev", owner=ptj), "node-a")
                own["metadata"]["name"] = f"{name}-a1-worker-1"
                kube.core.create_namespaced_pod(namespace, own)
                kube.core.patch_namespaced_pod_status(f"{name}-a1-worker-1", namespace, _terminated(hostile_message))
                kube.set_ptj_condition(namespace, f"{name}-a1", "Running")
            fake = _bound_pod(worker0_pod("stream", 1, "evil:latest"), "node-b")
            fake["metadata"]["name"] = "stream-a1-worker-9"
            kube.core.create_namespaced_pod(namespace, fake)
            kube.core.patch_namespaced_pod_status("stream-a1-worker-9", namespace, _terminated(hostile_message))
            # The attack is on: both hostile endpoints have been scraped (every 0.5 s).
            wait_for(lambda: stream.sent > 0 and bomb.requests > 2, 30, "the hostile endpoints scraped")

            latencies, health = [], []
            deadline = time.monotonic() + 60
            for i in range(5):
                started = time.monotonic()
                kube.custom.create_namespaced_custom_object(
                    GROUP, VERSION, other_namespace, PLURAL, kube.job_doc(f"victim-{i}", tiny())
                )
                kube.wait_ptj(other_namespace, f"victim-{i}-a1", timeout=30)
                latencies.append(time.monotonic() - started)
                for _ in range(4):
                    t = time.monotonic()
                    with urllib.request.urlopen(f"http://127.0.0.1:{op.liveness_port}/healthz", timeout=5) as r:
                        assert r.status == 200
                    health.append(time.monotonic() - t)
                    rss = _rss_kib(op.proc.pid)
                    assert rss["VmHWM"] < 512 * 1024, rss  # fail fast: never let it grow further
                    time.sleep(0.25)  # a paced probe, as the kubelet's liveness probe is
                assert time.monotonic() < deadline, "the attack test ran past its own bound"
            peak = _rss_kib(op.proc.pid)["VmHWM"]
            # hung up at the bound: what a request sent is the bound plus the sockets' buffers
            assert stream.sent / stream.requests < 32 * MiB, (stream.sent, stream.requests)
    finally:
        op.stop()
    # A new job's PyTorchJob on an idle operator: well under a second; 5 s leaves room for the
    # shared test machine. /healthz: each answer within 1 s. RSS: an idle operator is ~100 MiB.
    print(
        f"attack: new-job latencies {[round(x, 2) for x in latencies]} s, /healthz max {max(health):.3f} s, "
        f"peak RSS {peak / 1024:.0f} MiB, stream {stream.requests} requests / {stream.sent / MiB:.1f} MiB sent, "
        f"gzip bomb {bomb.requests} requests"
    )
    assert max(latencies) < 5.0, latencies
    assert max(health) < 1.0, health
    assert peak < 300 * 1024, f"peak RSS {peak / 1024:.0f} MiB"
