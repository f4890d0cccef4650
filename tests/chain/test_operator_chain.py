"""LLMTrainingJob → PyTorchJob → pods scheduled on simulated p5 nodes → Running → a pod fails →
attempt 2, on the real chain: the operator as a process, the real training-operator turning the
pod failure into a Failed PyTorchJob, the real scheduler and kwok nodes. Only observable
behaviour is asserted (status.attempt, the PyTorchJob names, where pods run)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from llmtrain.render import pytorchjob_name
from llmtrain.spec import GROUP, PLURAL, VERSION
from llmtrain_devcluster.process import free_port
from operator_core.conftest import OperatorProcess

from .conftest import PTJ, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def chain_operator(chain_cluster, tmp_path_factory):
    # No trainer serves metrics here (pods are simulated): progress scraping just finds nothing.
    op = OperatorProcess(
        chain_cluster.kubeconfig, tmp_path_factory.mktemp("chain-operator") / "operator.log", free_port()
    )
    op.start()
    yield op
    op.stop()


def _job_doc(name: str) -> dict:
    doc = yaml.safe_load((REPO / "examples" / "llama2-7b-p5.yaml").read_text())
    doc["metadata"] = {"name": name}
    doc["spec"]["resilience"]["maxRestarts"] = 2
    return doc


def test_pod_failure_on_p5_nodes_starts_attempt_2(chain_cluster, chain, chain_ns, chain_operator):
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

    a1 = pytorchjob_name(name, 1)
    pods = chain.wait_pods_running(chain_ns, f"training.kubeflow.org/job-name={a1}", nodes)
    assert {by_type[p.spec.node_name] for p in pods} == {"p5.48xlarge"}
    wait_for(lambda: status().get("phase") == "Running", 60, f"{name} Running (log: {chain_operator.log_path})")
    assert status().get("attempt", 1) == 1

    # kwok fails worker 0's container; the training-operator fails the PyTorchJob (backoffLimit 0)
    # and deletes its pods, so what the failure looked like is recorded first.
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

    a2 = pytorchjob_name(name, 2)
    wait_for(lambda: status().get("attempt") == 2, 60, f"{name} status.attempt 2 (log: {chain_operator.log_path})")
    assert status().get("restarts") == 1
    pods2 = chain.wait_pods_running(chain_ns, f"training.kubeflow.org/job-name={a2}", nodes, 120)
    assert {by_type[p.spec.node_name] for p in pods2} == {"p5.48xlarge"}
    wait_for(lambda: status().get("phase") == "Running", 60, f"{name} Running again")

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
