"""Bad-node avoidance and preflight on the real chain: a worker pod fails on node X (kwok's chaos
stage, with the exit code and termination message a real failure leaves), the real
training-operator fails the PyTorchJob and deletes its pods (on JobSet: the Job controller fails
the Job at backoffLimit 0, JobSet's controller the JobSet), and the operator, which caught the
pod's terminated state first, starts the next attempt away from X and says so in status.

A failure on a node and a failed preflight run on both backends (the `backend` fixture; one
operator serves both): what the operator reads there is the failed pod, trusted through the
child's owner chain, which is the backend's. Whether to avoid the node with too few left, and which
node of a gang a preflight verdict names, are decided from what was read, the same on either
backend: those run once, on PyTorchJob.

kwok's stage copies the `.../message` annotation into the container's terminated state verbatim
inside its YAML template, so the tests pass it as a YAML double-quoted scalar (json.dumps of the
text): the message the operator reads is exactly the text given.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
import yaml

from backend_child import OPERATOR_ARGS, attempt_pods, get_child, on, pod_template
from llmtrain.spec import GROUP, PLURAL, VERSION
from llmtrain_devcluster.chain import FAIL_EXIT_CODE_ANNOTATION, FAIL_POD_LABEL
from llmtrain_devcluster.process import free_port
from operator_core.conftest import OperatorProcess

from .conftest import wait_for

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
FAIL_MESSAGE_ANNOTATION = f"{FAIL_POD_LABEL}/message"
SUSPECT = "llmtrain.dev/suspect"
P5 = "p5.48xlarge"


@pytest.fixture(scope="module")
def operator(chain_cluster, tmp_path_factory):
    # Suspect taints on, at most half of a node group: with 2 × p5 that is one node.
    op = OperatorProcess(
        chain_cluster.kubeconfig,
        tmp_path_factory.mktemp("bad-nodes") / "operator.log",
        free_port(),
        extra_args=["--suspect-taint-fraction", "0.5", *OPERATOR_ARGS],
    )
    op.start()
    yield op
    op.stop()


@pytest.fixture
def untaint(chain):
    """The suspect taint outlives the test's namespace: take it off every node afterwards."""
    yield
    for node in chain.core.list_node(label_selector="type=kwok").items:
        taints = [t for t in node.spec.taints or [] if t.key != SUSPECT]
        if len(taints) != len(node.spec.taints or []):
            chain.core.patch_node(
                node.metadata.name,
                {"spec": {"taints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in taints]}},
            )


def _job(chain, ns: str, name: str, nodes: int, backend: str = "pytorchjob", **resilience) -> None:
    doc = on(yaml.safe_load((REPO / "examples" / "llama2-7b-p5.yaml").read_text()), backend)
    doc["metadata"] = {"name": name}
    doc["spec"]["cluster"]["nodes"] = nodes
    doc["spec"]["resilience"].update(maxRestarts=3, **resilience)
    sa = doc["spec"]["cluster"].get("serviceAccountName")
    if sa:
        chain.core.create_namespaced_service_account(ns, {"metadata": {"name": sa}})
    chain.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, doc)


def _status(chain, ns: str, name: str) -> dict:
    return chain.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name).get("status") or {}


def _fail(chain, ns: str, pod: str, exit_code: int, message: str) -> None:
    chain.core.patch_namespaced_pod(
        pod,
        ns,
        {
            "metadata": {
                "labels": {FAIL_POD_LABEL: "true"},
                "annotations": {
                    FAIL_EXIT_CODE_ANNOTATION: str(exit_code),
                    FAIL_MESSAGE_ANNOTATION: json.dumps(message),
                },
            }
        },
    )


def _running(chain, ns: str, job: str, attempt: int, count: int):
    return chain.wait_pods_running(ns, attempt_pods(job, attempt), count, 120)


def _events(chain, ns: str, reason: str) -> list[str]:
    return [e.message for e in chain.core.list_namespaced_event(ns).items if e.reason == reason]


def _event(chain, ns: str, reason: str, *fragments: str) -> str:
    """The first `reason` event whose message has every fragment (events are posted after the
    status write they report, so they are waited for)."""
    return wait_for(
        lambda: next((m for m in _events(chain, ns, reason) if all(f in m for f in fragments)), None),
        30,
        f"a {reason} event with {fragments}",
    )


def test_a_pod_failing_on_a_node_keeps_the_next_attempt_off_it(chain, chain_ns, operator, untaint, backend):
    name = "xid"
    _job(chain, chain_ns, name, nodes=1, backend=backend)
    (pod,) = _running(chain, chain_ns, name, 1, 1)
    bad = pod.spec.node_name
    wait_for(lambda: _status(chain, chain_ns, name).get("phase") == "Running", 60, f"{name} Running")

    xid = "NVRM: Xid (PCI:0000:53:00): 79, pid=2231, GPU has fallen off the bus."
    _fail(chain, chain_ns, pod.metadata.name, 1, f"RuntimeError: CUDA error: unspecified launch failure\n{xid}")

    wait_for(lambda: _status(chain, chain_ns, name).get("attempt") == 2, 60, f"attempt 2 (log: {operator.log_path})")
    st = _status(chain, chain_ns, name)
    assert st["restarts"] == 1
    (entry,) = st["badNodes"]
    assert entry["node"] == bad and entry["reason"] == "XID 79" and entry["xid"] == 79
    assert entry["attempt"] == 1 and entry["exitCode"] == 1 and xid in entry["message"]
    assert st["avoidNodes"] == [bad]

    (pod2,) = _running(chain, chain_ns, name, 2, 1)
    assert pod2.spec.node_name != bad
    assert chain.nodes_by_type()[pod2.spec.node_name] == P5
    # events name the node: the pod's failure, and the restart that avoids it
    _event(chain, chain_ns, "PodFailedOnNode", bad, "XID 79")
    _event(chain, chain_ns, "Restarting", f"avoiding {bad}")

    # opt-in suspect taint, within the fraction (1 of the 2 p5s)
    def tainted():
        return {
            n.metadata.name: t.value
            for n in chain.core.list_node(label_selector="type=kwok").items
            for t in n.spec.taints or []
            if t.key == SUSPECT
        }

    assert wait_for(tainted, 30, "suspect taint") == {bad: "XID-79"}
    assert 'llmtrain_operator_bad_nodes_total{reason="XID 79"}' in operator.metrics()
    # (the counter is the operator's, over both runs: it only says the failure was counted)


def test_a_failed_preflight_is_retried_elsewhere_without_spending_a_restart(
    chain, chain_ns, operator, untaint, backend
):
    from llmtrain.pod_contract import PREFLIGHT_EXIT_CODE
    from llmtrain_trainer.distributed.healthcheck import RankResult, judge, termination_message

    name = "preflight"
    _job(chain, chain_ns, name, nodes=1, backend=backend, preflight=True)
    (pod,) = _running(chain, chain_ns, name, 1, 1)
    bad = pod.spec.node_name
    child = get_child(chain.custom.api_client, backend, chain_ns, f"{name}-a1")
    env = {e["name"]: e for e in pod_template(backend, child)["spec"]["containers"][0]["env"]}
    assert env["LLMTRAIN_PREFLIGHT"]["value"] == "1"

    # What launch.py writes when the check finds this node's GPU 3 broken (healthcheck's own judge
    # and termination_message; the node name is what the downward API gives the pod).
    results = [
        RankResult(
            rank=r,
            node=0,
            host=pod.metadata.name,
            devices_ok=r != 3,
            compute_ok=True,
            memory_ok=True,
            link_gbps=40.0,
            node_name=bad,
            problems=["7 GPU(s) visible, 8 expected (one per local worker)"] if r == 3 else [],
        )
        for r in range(8)
    ]
    verdict = judge(results, busbw=310.5, expected_busbw=400.0, min_fraction=0.5)
    _fail(chain, chain_ns, pod.metadata.name, PREFLIGHT_EXIT_CODE, termination_message(verdict))

    wait_for(lambda: _status(chain, chain_ns, name).get("attempt") == 2, 60, f"attempt 2 (log: {operator.log_path})")
    st = _status(chain, chain_ns, name)
    assert st["restarts"] == 0  # the attempt never trained: no restart spent
    _event(
        chain,
        chain_ns,
        "Restarting",
        "attempt 1 preflight-failed",
        f"suspect node(s) {bad}",
        "all-reduce bus bandwidth 310.5 GB/s (expected 400.0 GB/s)",
        f"avoiding {bad}",
    )
    assert [b["node"] for b in st["badNodes"]] == [bad]
    assert st["badNodes"][0]["reason"].startswith("preflight: 7 GPU(s) visible")
    assert st["avoidNodes"] == [bad]
    assert st["preflight"]["busBandwidthGBps"] == 310.5 and st["preflight"]["suspectNodes"] == [bad]
    (pod2,) = _running(chain, chain_ns, name, 2, 1)
    assert pod2.spec.node_name != bad and chain.nodes_by_type()[pod2.spec.node_name] == P5
    gauge = f'llmtrain_operator_preflight_bus_bandwidth_gbps{{llmtrain_job="{name}",namespace="{chain_ns}"}} 310.5'
    wait_for(lambda: gauge in operator.metrics(), 30, f"{gauge} in the operator's metrics")


def test_avoiding_would_leave_too_few_nodes_so_the_job_keeps_them(chain, chain_ns, operator, untaint):
    name = "gang"
    _job(chain, chain_ns, name, nodes=2)  # both p5s of the cluster
    pods = _running(chain, chain_ns, name, 1, 2)
    victim = sorted(pods, key=lambda p: p.metadata.name)[0]
    wait_for(lambda: _status(chain, chain_ns, name).get("phase") == "Running", 60, f"{name} Running")
    # preflight is on by default for 2 GPU nodes; here the failure is a training one
    _fail(
        chain,
        chain_ns,
        victim.metadata.name,
        1,
        "torch.distributed.DistBackendError: NCCL error: remote process exited or there was a network error, "
        "NCCL version 2.21.5 ncclRemoteError: A call failed possibly due to a network error",
    )
    wait_for(lambda: _status(chain, chain_ns, name).get("attempt") == 2, 60, f"attempt 2 (log: {operator.log_path})")
    st = _status(chain, chain_ns, name)
    assert [b["node"] for b in st["badNodes"]] == [victim.spec.node_name]
    assert st["badNodes"][0]["reason"] == "NCCL error"
    assert st["avoidNodes"] == []
    _event(chain, chain_ns, "Restarting", f"not avoiding {victim.spec.node_name}: only 2 Ready node(s)")
    pods2 = _running(chain, chain_ns, name, 2, 2)  # still schedulable: both p5s again
    assert {p.spec.node_name for p in pods2} == {p.spec.node_name for p in pods}
    assert not any(
        t.key == SUSPECT for n in chain.core.list_node(label_selector="type=kwok").items for t in n.spec.taints or []
    )  # a node the job still needs is never tainted


@pytest.fixture
def spare_p5(chain_cluster, chain):
    """A third p5 node for this test only (the session's cluster keeps its default shape for the
    other chain tests, which count its nodes)."""
    (name,) = chain_cluster.add_nodes({P5: 1})
    yield name
    # Requested before chain_ns, so this runs after the namespace's pods are gone; a pod left on
    # the node would outlive it (nothing finishes a pod of a deleted kwok node).
    wait_for(
        lambda: not chain.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}").items,
        60,
        f"no pods on {name}",
    )
    chain.core.delete_node(name)
    wait_for(lambda: name not in chain.nodes_by_type(), 60, f"node {name} gone")


def test_a_gang_drops_only_the_node_its_preflight_names(chain, spare_p5, chain_ns, operator, untaint):
    from llmtrain.pod_contract import PREFLIGHT_EXIT_CODE
    from llmtrain_trainer.distributed.healthcheck import RankResult, judge, termination_message

    name = "gang-preflight"
    _job(chain, chain_ns, name, nodes=2)  # preflight on by default: 2 GPU nodes
    pods = sorted(_running(chain, chain_ns, name, 1, 2), key=lambda p: p.metadata.name)
    placed = {p.metadata.name: p.spec.node_name for p in pods}
    slow_pod = pods[1].metadata.name
    slow = placed[slow_pod]
    healthy = placed[pods[0].metadata.name]
    # 16 ranks over the two nodes; every link of node 1's ranks (8..15) is 20x slower. Both pods'
    # launchers would exit 86 with this verdict; the first one kwok fails is enough.
    results = [
        RankResult(
            rank=r,
            node=r // 8,
            host=pods[r // 8].metadata.name,
            devices_ok=True,
            compute_ok=True,
            memory_ok=True,
            link_gbps=2.0 if r // 8 else 40.0,
            node_name=placed[pods[r // 8].metadata.name],
        )
        for r in range(16)
    ]
    verdict = judge(results, busbw=20.0, expected_busbw=400.0, min_fraction=0.5)
    assert verdict["suspectNodes"][0]["nodeName"] == slow and len(verdict["suspectNodes"]) == 1
    _fail(chain, chain_ns, slow_pod, PREFLIGHT_EXIT_CODE, termination_message(verdict))

    wait_for(lambda: _status(chain, chain_ns, name).get("attempt") == 2, 60, f"attempt 2 (log: {operator.log_path})")
    st = _status(chain, chain_ns, name)
    assert st["restarts"] == 0 and st["avoidNodes"] == [slow]
    assert st["preflight"]["busBandwidthGBps"] == 20.0 and st["preflight"]["degraded"] is True
    pods2 = _running(chain, chain_ns, name, 2, 2)
    p5s = {n for n, t in chain.nodes_by_type().items() if t == P5}
    assert len(p5s) == 3 and spare_p5 in p5s
    # the slow node out; the healthy one kept; the third p5 (the spare, or the other default node
    # when the scheduler had put attempt 1 on the spare) in
    assert {p.spec.node_name for p in pods2} == p5s - {slow} and healthy in p5s - {slow}


def _condition(chain, node: str, status: str | None) -> None:
    """Set the node's AcceleratedHardwareReady as the EKS node monitoring agent does (a status
    patch of the node); None removes it."""
    cond: dict = {"type": "AcceleratedHardwareReady"}
    if status is None:
        cond["$patch"] = "delete"
    else:
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        cond.update(
            status=status,
            reason="NvidiaXID79Error" if status == "False" else "AcceleratedHardwareIsReady",
            message="GPU has fallen off the bus" if status == "False" else "",
            lastTransitionTime=now,
            lastHeartbeatTime=now,
        )
    chain.core.patch_node_status(node, {"status": {"conditions": [cond]}})


@pytest.fixture
def healthy_again(chain):
    """The condition outlives the test's namespace: take it off every kwok node afterwards."""
    yield
    for node in chain.nodes_by_type():
        _condition(chain, node, None)


def test_a_sick_node_moves_the_attempt_away_without_spending_a_restart(chain, chain_ns, operator, healthy_again):
    name = "sick"
    _job(chain, chain_ns, name, nodes=1)
    (pod,) = _running(chain, chain_ns, name, 1, 1)
    bad = pod.spec.node_name
    wait_for(lambda: _status(chain, chain_ns, name).get("phase") == "Running", 60, f"{name} Running")

    _condition(chain, bad, "False")
    wait_for(lambda: _status(chain, chain_ns, name).get("attempt") == 2, 60, f"attempt 2 (log: {operator.log_path})")
    st = _status(chain, chain_ns, name)
    assert (st["restarts"], st["reason"], st["nodeMoves"]) == (0, "NodeUnhealthy", 1)
    assert (
        f"node {bad} has AcceleratedHardwareReady=False (NvidiaXID79Error: GPU has fallen off the bus)"
        in (st["message"])
    )
    assert st["avoidNodes"] == [bad] and st["badNodes"][0]["reason"] == "AcceleratedHardwareReady=False"
    (pod2,) = _running(chain, chain_ns, name, 2, 1)
    other = pod2.spec.node_name
    assert other != bad and chain.nodes_by_type()[other] == P5
    _event(chain, chain_ns, "Restarting", "node-unhealthy", f"node {bad} has AcceleratedHardwareReady=False")

    # The avoided node flaps and ends healthy: no pod of the job is there, so nothing moves. Then
    # the node under attempt 2 turns sick: exactly one more move (a flap that had moved the job
    # would show as attempt 4), still no restart spent; with only 2 p5s the first node is given
    # back (too few Ready nodes to avoid both), and attempt 3 runs there.
    for status in ("False", "True", "False", "True"):
        _condition(chain, bad, status)
    _condition(chain, other, "False")
    wait_for(lambda: _status(chain, chain_ns, name).get("attempt") == 3, 60, f"attempt 3 (log: {operator.log_path})")
    (pod3,) = _running(chain, chain_ns, name, 3, 1)
    assert pod3.spec.node_name == bad
    wait_for(lambda: _status(chain, chain_ns, name).get("phase") == "Running", 60, f"{name} Running again")
    st = _status(chain, chain_ns, name)
    assert (st["attempt"], st["restarts"], st["nodeMoves"]) == (3, 0, 2)
    _event(
        chain, chain_ns, "Restarting", "attempt 2 node-unhealthy", f"node {other} has AcceleratedHardwareReady=False"
    )
