"""LLMTrainingJob → PyTorchJob → pods scheduled on simulated p5 nodes → Running → an in-place restart
→ a pod fails → attempt 2, on the real chain: the operator as a process, the real training-operator
turning the pod failure into a Failed PyTorchJob, the real scheduler and kwok nodes. Only observable
behaviour is asserted (status, the PyTorchJob and pod objects, where pods run).

The pods are kwok's, so no trainer runs in them: rank 0's /metrics is the trainer's own
TrainerMetrics on a loopback port (operator_core's `trainer_endpoint`), and worker 0's pod IP is set
to 127.0.0.1 once kwok has it Running (as a kubelet reports the IP), so the operator scrapes it there.
What an in-place restart looks like to the control plane is what that endpoint says: torchrun
restarts the workers inside the pods, which the API server never sees."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from llmtrain.backends.pytorchjob import REPLICA_INDEX_LABEL
from llmtrain.pod_contract import child_name
from llmtrain.spec import GROUP, PLURAL, VERSION
from operator_core.conftest import OperatorProcess

from .conftest import PTJ, wait_for

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
IN_PLACE_RESTARTS = 4  # not maxRestarts' 2, nor the default: the pods must carry this one


@pytest.fixture(scope="module")
def chain_operator(chain_cluster, trainer_endpoint, tmp_path_factory):
    op = OperatorProcess(
        chain_cluster.kubeconfig, tmp_path_factory.mktemp("chain-operator") / "operator.log", trainer_endpoint[1]
    )
    op.start()
    yield op
    op.stop()


def _job_doc(name: str) -> dict:
    doc = yaml.safe_load((REPO / "examples" / "llama2-7b-p5.yaml").read_text())
    doc["metadata"] = {"name": name}
    doc["spec"]["resilience"].update(maxRestarts=2, inPlaceRestarts=IN_PLACE_RESTARTS)
    return doc


def _torchrun_flags(container) -> dict[str, str]:
    """--flag=value arguments of the container (torchrun's, before `-m MODULE`)."""
    out = {}
    for a in container.args:
        if a == "-m":
            break
        flag, _, value = a.partition("=")
        out[flag] = value
    return out


def _assert_pods_carry_the_in_place_restarts(chain, ns: str, ptj_name: str, pods) -> None:
    """(a) The real training-operator took the rendered elasticPolicy (maxRestarts = inPlaceRestarts)
    and set torchrun's PET_* variables from it; each one it set agrees with the rendered torchrun
    argument of the same name (torchrun reads PET_X as the default of --x), so torchrun gets one
    answer either way."""
    ptj = chain.ptj(ns, ptj_name)
    assert ptj["spec"]["elasticPolicy"]["maxRestarts"] == IN_PLACE_RESTARTS
    for pod in pods:
        (container,) = [c for c in pod.spec.containers if c.name == "pytorch"]
        env = {e.name: e.value for e in container.env or []}
        pet = {k: v for k, v in env.items() if k.startswith("PET_")}
        assert pet.get("PET_MAX_RESTARTS") == str(IN_PLACE_RESTARTS), pet
        flags = _torchrun_flags(container)
        assert flags["--max-restarts"] == str(IN_PLACE_RESTARTS)
        for var, value in pet.items():
            flag = "--" + var.removeprefix("PET_").lower().replace("_", "-")
            if flag in flags:
                assert flags[flag] == value, (var, value, flag, flags[flag])
        # the rendezvous the training-operator wrote from the policy is the one the args name
        assert pet["PET_RDZV_ENDPOINT"] == flags["--rdzv-endpoint"] and pet["PET_NNODES"] == flags["--nnodes"]


def test_in_place_restart_then_pod_failure_on_p5_nodes(
    chain_cluster, chain, chain_ns, chain_operator, trainer_endpoint
):
    metrics, _ = trainer_endpoint
    name = "chain-7b"
    doc = _job_doc(name)
    sa = doc["spec"]["cluster"].get("serviceAccountName")
    if sa:
        chain.core.create_namespaced_service_account(chain_ns, {"metadata": {"name": sa}})
    chain.custom.create_namespaced_custom_object(GROUP, VERSION, chain_ns, PLURAL, doc)
    nodes = doc["spec"]["cluster"]["nodes"]
    by_type = chain.nodes_by_type()

    def status():
        return chain.custom.get_namespaced_custom_object(GROUP, VERSION, chain_ns, PLURAL, name).get("status") or {}

    a1 = child_name(name, 1)
    pods = chain.wait_pods_running(chain_ns, f"training.kubeflow.org/job-name={a1}", nodes)
    assert {by_type[p.spec.node_name] for p in pods} == {"p5.48xlarge"}
    wait_for(lambda: status().get("phase") == "Running", 60, f"{name} Running (log: {chain_operator.log_path})")
    assert status().get("attempt", 1) == 1
    _assert_pods_carry_the_in_place_restarts(chain, chain_ns, a1, pods)

    # (b) rank 0's trainer reports an in-place restart: torchrun replaced the worker processes inside
    # the same pods (a new rendezvous round, resumed from step 40's checkpoint, 3 steps redone)
    ptj_uid = chain.ptj(chain_ns, a1)["metadata"]["uid"]
    pod_uids = sorted(p.metadata.uid for p in pods)
    now = time.time()
    metrics.step.set(45)
    metrics.heartbeat_timestamp_seconds.set(now)
    metrics.train_start_timestamp_seconds.set(now - 120)
    metrics.resume_step.set(0)
    metrics.last_checkpoint_step.set(40)
    metrics.last_checkpoint_timestamp_seconds.set(now - 30)
    metrics.attempt_steps.set(48)
    metrics.attempt_step_seconds.set(96.0)
    metrics.inplace_restarts.set(1)
    metrics.inplace_restart_seconds.set(12.5)
    metrics.inplace_redone_steps.set(3)
    metrics.inplace_redone_seconds.set(6.0)
    (rank0,) = [p for p in pods if p.metadata.labels.get(REPLICA_INDEX_LABEL) == "0"]
    chain.serve_pod_here(chain_ns, rank0.metadata.name)  # worker 0: the test's trainer endpoint
    progress = wait_for(
        lambda: (p := status().get("progress") or {}).get("inPlaceRestarts") == 1 and p,
        30,
        f"status.progress.inPlaceRestarts (log: {chain_operator.log_path})",
    )
    assert (progress["attempt"], progress["inPlaceRestartSeconds"], progress["inPlaceRedoneSteps"]) == (1, 12.5, 3)
    s = status()
    assert s["attempt"] == 1 and not s.get("restarts") and s["phase"] == "Running"
    # nothing in the control plane moved: the same PyTorchJob, the same pods, no second attempt
    assert chain.ptj(chain_ns, a1)["metadata"]["uid"] == ptj_uid
    same = chain.pods(chain_ns, f"training.kubeflow.org/job-name={a1}")
    assert sorted(p.metadata.uid for p in same) == pod_uids
    assert all(p.status.phase == "Running" and p.metadata.deletion_timestamp is None for p in same)
    assert [
        p["metadata"]["name"] for p in chain.custom.list_namespaced_custom_object(*PTJ[:2], chain_ns, PTJ[2])["items"]
    ] == [a1]
    assert not [e for e in chain.core.list_namespaced_event(chain_ns).items if e.reason == "Restarting"]

    # (c) then the pod fails (its in-place restarts spent, or the node): kwok fails worker 0's
    # container; the training-operator fails the PyTorchJob (backoffLimit 0) and deletes its pods,
    # so what the failure looked like is recorded first.
    victim = sorted(pods, key=lambda p: p.metadata.name)[0]
    failed_pod = chain.fail_pod_and_watch(chain_ns, victim.metadata.name, exit_code=137)
    term = next(c.state.terminated for c in failed_pod.status.container_statuses if c.state.terminated)
    assert term.exit_code == 137 and failed_pod.spec.node_name == victim.spec.node_name

    def a1_failed() -> bool:
        try:
            return chain.ptj_condition(chain_ns, a1, "Failed")
        except ApiException as err:
            # Gone already: the operator saw it fail, started attempt 2 and deleted attempt 1.
            if err.status == 404:
                return status().get("attempt", 1) >= 2
            raise

    wait_for(a1_failed, 60, f"PyTorchJob {a1} Failed (by the training-operator)")

    a2 = child_name(name, 2)
    wait_for(lambda: status().get("attempt") == 2, 60, f"{name} status.attempt 2 (log: {chain_operator.log_path})")
    assert status().get("restarts") == 1  # the pod failure spent one; the in-place restart none
    pods2 = chain.wait_pods_running(chain_ns, f"training.kubeflow.org/job-name={a2}", nodes, 120)
    assert {by_type[p.spec.node_name] for p in pods2} == {"p5.48xlarge"}
    wait_for(lambda: status().get("phase") == "Running", 60, f"{name} Running again")
    # attempt 1's goodput record closed with the trainer's counters: its in-place restart and the
    # newest checkpoint it reported (llmtrain goodput marks it)
    (rec1,) = [r for r in status()["goodput"]["attempts"] if r["attempt"] == 1]
    assert (rec1["inPlaceRestarts"], rec1["inPlaceRestartSeconds"], rec1["lastCheckpointStep"]) == (1, 12.5, 40)

    # Exactly one live attempt: attempt 1 is finished (Failed) or gone, attempt 2 is the only
    # PyTorchJob that is not.
    ptjs = chain.custom.list_namespaced_custom_object(*PTJ[:2], chain_ns, PTJ[2])["items"]
    live = [
        p["metadata"]["name"]
        for p in ptjs
        if not any(
            c["type"] in ("Failed", "Succeeded") and c["status"] == "True"
            for c in (p.get("status") or {}).get("conditions") or []
        )
    ]
    assert live == [a2], [p["metadata"]["name"] for p in ptjs]
