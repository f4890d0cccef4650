"""Random faults on the real chain (kube-apiserver + etcd + kube-scheduler + kwok nodes + the Kubeflow
training-operator, the JobSet and Job controllers + the operator as a process), on each backend
(the `backend` fixture: the jobs' children are PyTorchJobs, then JobSets): six jobs, 40 s of faults
drawn from a seed (worker pods failing, pods deleted, the attempts' children deleted by hand, nodes
deleted and replaced, nodes going NotReady, an attempt's pods all exiting 0, the operator SIGKILLed
and started again), then the invariants over everything the two watches saw
(tests/chain/faults.py): attempt and restarts never go back, no attempt's child is created twice,
the budget is never exceeded, terminal phases stay (a Succeeded job starts no attempt, whatever
happens to its leftovers), and every job converges.

The faults come at random moments; the assertions are about invariants, never about timings. The
other tests pin single paths the random runs may or may not draw: a deleted node's pods, failed by
the pod GC, count as failures on that node (found by the random runs); a finished job stays
Succeeded through what happens to its leftovers.

Reproduce a run: LLMTRAIN_FAULT_SEED=<the seed it printed> and `-k <backend>`
(LLMTRAIN_FAULT_SECONDS: how long the faults last, 40 by default, per backend; bench/random_faults.py
runs the long soak).
"""

from __future__ import annotations

import json
import os
import random
import signal

import pytest
from kubernetes import client

from backend_child import OPERATOR_ARGS, attempt_pods, children, get_child, kind, state
from llmtrain.pod_contract import child_name
from llmtrain.spec import GROUP, PLURAL, VERSION
from llmtrain_devcluster.chain import COMPLETE_POD_LABEL, node_manifest
from llmtrain_devcluster.process import free_port
from operator_core.conftest import OperatorProcess

from . import faults
from .conftest import wait_for

pytestmark = [pytest.mark.slow]

JOBS = 6
SPARE_NODES = 2  # beyond one per pod: a restart finds room while the old pods finish


@pytest.fixture
def cpu_nodes(chain_cluster, chain):
    """Simulated cpu nodes for this test only (the session's cluster keeps its GPU shape for the
    other chain tests). Requested before chain_ns, so they go after its pods are gone; the
    replacements the faults register go too."""
    pods = sum(nodes for _, nodes, _ in faults.draw_jobs(random.Random(0), JOBS))
    names = chain_cluster.add_nodes({faults.CPU: pods + SPARE_NODES})
    yield names
    for node in chain.core.list_node(label_selector="type=kwok").items:
        if node.metadata.name.startswith(faults.NODE_PREFIX):
            try:
                chain.core.delete_node(node.metadata.name)
            except client.ApiException as err:
                if err.status != 404:
                    raise


@pytest.fixture
def operator(chain_cluster, chain_ns, tmp_path):
    """This test's own operator, watching only its namespace (it is SIGKILLed on purpose), serving
    both backends."""
    op = OperatorProcess(
        chain_cluster.kubeconfig,
        tmp_path / "operator.log",
        free_port(),
        extra_args=["--namespace", chain_ns, "--verbose", *OPERATOR_ARGS],
    )
    op.start()
    yield op
    op.stop()


@pytest.mark.slow(seconds=90)  # 84-95 s a backend, quiet: the chain units are balanced by it
def test_random_faults_keep_every_invariant(chain_cluster, cpu_nodes, chain_ns, operator, backend):
    seed = int(os.environ.get("LLMTRAIN_FAULT_SEED") or random.SystemRandom().randrange(2**32))
    seconds = float(os.environ.get("LLMTRAIN_FAULT_SECONDS", "40"))
    print(
        f"\nrandom faults on {backend}: LLMTRAIN_FAULT_SEED={seed} for {seconds:.0f} s "
        f"(operator log: {operator.log_path})"
    )
    with chain_cluster.api_client() as api:
        result = faults.run(
            api, chain_ns, operator, cpu_nodes, seed=seed, jobs=JOBS, seconds=seconds, wait=wait_for, backend=backend
        )
    summary = result.summary()
    print(json.dumps(summary, indent=1))
    errors = [
        line
        for line in operator.metrics().splitlines()
        if line.startswith('llmtrain_operator_reconciles_total{outcome="error"}')
    ]
    print(errors)
    assert sum(result.done.values()) > 0, "no fault was applied"
    assert not result.violations, f"LLMTRAIN_FAULT_SEED={seed}:\n" + "\n".join(result.violations)


@pytest.mark.slow(seconds=45)  # 38-54 s a backend, quiet
def test_a_deleted_node_fails_its_attempt_and_names_the_node(
    chain_cluster, chain, cpu_nodes, chain_ns, operator, backend
):
    """The pod GC marks a deleted node's pods Failed with only a DisruptionTarget condition; the
    operator counts that as a failure on the node (found by the random faults: it did not)."""
    name = "gone-node"
    doc = faults.job_doc(name, 1, 3, backend)
    chain.custom.create_namespaced_custom_object(GROUP, VERSION, chain_ns, PLURAL, doc)
    (pod,) = chain.wait_pods_running(chain_ns, attempt_pods(name, 1), 1)
    node = pod.spec.node_name
    chain.core.delete_node(node)
    chain.core.create_node(node_manifest(faults.CPU, 1 + max(int(n.rsplit("-", 1)[1]) for n in cpu_nodes)))

    def status():
        return chain.custom.get_namespaced_custom_object(GROUP, VERSION, chain_ns, PLURAL, name).get("status") or {}

    a1 = attempt_pods(name, 1)

    def replaced() -> bool:
        pods = chain.core.list_namespaced_pod(chain_ns, label_selector=a1).items
        return any(p.status.phase == "Running" and p.spec.node_name not in (None, node) for p in pods)

    # The pod GC waits 40 s (its quarantine) and looks every 20 s; it marks the pod Failed, then
    # deletes it. A training-operator whose reconcile sees the Failed pod fails the PyTorchJob, and
    # the operator starts attempt 2 naming the node; one whose reconcile comes after the deletion
    # creates the pod again in the same attempt (its torchrun resumes, as after an in-place restart):
    # the job then keeps attempt 1 and spends no restart. Which one is the two controllers' race.
    # (The Job controller tracks its pods with a finalizer, so it always sees the failure: on
    # JobSet the Job, then the JobSet, fails and the operator starts attempt 2.)
    def outcome():
        s = status()
        if s.get("attempt") == 2:
            return "new attempt", s
        return ("same attempt", s) if s.get("attempt") == 1 and replaced() else None

    how, st = wait_for(outcome, 120, f"attempt 2 or a replacement pod (log: {operator.log_path})")
    if how == "same attempt":
        assert st["restarts"] == 0 and st["phase"] in ("Running", "Pending"), st
        return
    assert st["restarts"] == 1
    (entry,) = st["badNodes"]
    assert entry["node"] == node and entry["reason"] == "DeletionByPodGC" and entry["attempt"] == 1
    assert "node no longer exists" in entry["message"]
    (pod2,) = chain.wait_pods_running(chain_ns, attempt_pods(name, 2), 1)
    assert pod2.spec.node_name != node


def test_a_finished_job_stays_succeeded_through_what_happens_to_its_leftovers(
    chain, cpu_nodes, chain_ns, operator, backend
):
    """Its pods exit 0 (kwok: the training run finished): the child's controller marks it Succeeded
    (the training-operator the PyTorchJob; the Job controller the Job, JobSet's the JobSet), the
    operator the job, attempt and restarts as they were. Then the child is deleted by hand and the
    operator SIGKILLed and started again: the restarted operator looks at the job (the reconcile it
    counts as "unchanged") and writes nothing; no child is made again."""
    name = "finished"
    chain.custom.create_namespaced_custom_object(GROUP, VERSION, chain_ns, PLURAL, faults.job_doc(name, 1, 3, backend))
    a1 = child_name(name, 1)
    (pod,) = chain.wait_pods_running(chain_ns, attempt_pods(name, 1), 1)

    def status():
        return chain.custom.get_namespaced_custom_object(GROUP, VERSION, chain_ns, PLURAL, name).get("status") or {}

    chain.core.patch_namespaced_pod(pod.metadata.name, chain_ns, {"metadata": {"labels": {COMPLETE_POD_LABEL: "true"}}})
    st = wait_for(
        lambda: (s := status()).get("phase") == "Succeeded" and s, 60, f"Succeeded (log: {operator.log_path})"
    )
    assert (st["attempt"], st["restarts"], st["reason"]) == (1, 0, "Succeeded") and st.get("completionTime")
    api = chain.custom.api_client
    assert state(backend, get_child(api, backend, chain_ns, a1)) == "Succeeded"

    group, version, plural = kind(backend)
    chain.custom.delete_namespaced_custom_object(group, version, chain_ns, plural, a1)

    def gone():
        try:
            get_child(api, backend, chain_ns, a1)
        except client.ApiException as err:
            return err.status == 404
        return False

    wait_for(gone, 60, f"{backend} child {a1} deleted")
    operator.stop(signal.SIGKILL)
    operator.start()

    def looked():
        line = 'llmtrain_operator_reconciles_total{outcome="unchanged"}'
        return any(m.startswith(line) and float(m.split()[-1]) >= 1 for m in operator.metrics().splitlines())

    wait_for(looked, 60, f"the restarted operator reconciled {name} (log: {operator.log_path})")
    assert status() == st
    assert children(api, backend, chain_ns, name) == []
