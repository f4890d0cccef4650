"""`spec.resilience.stragglers.action: replace` end to end, with the real trainer (issue 30's proof:
"With `replace`, the job moves and finishes").

The chain is tests/chain's (kube-apiserver + etcd + kube-scheduler + kwok nodes + the training-
operator), with this test's own operator process watching only its namespace (its production flags
and the chain tests' usual --progress-interval 0.5 s; nothing straggler-specific). The job is a tiny
CPU one: 2 ranks in 1 pod on one of two simulated cpu nodes, a checkpoint every 10 steps, replace
after durationMinutes 1 (the spec's minimum).

The slow node: whichever node attempt 1's pod lands on. There one of its two "GPUs" is throttled:
the test starts the pod's trainer (its own command, arguments and environment, as
tests/chain/test_goodput_chain.py does) with the documented test-only hook, which makes rank 1 sleep
SLEEP seconds in each step's compute (tests/trainer/hooks/straggler_testhook.py). A pod on any
other node runs without it. Nothing else is given to the operator: what it knows comes from rank 0's
/metrics (the straggler series the trainer computes) and the cluster.

What must happen, all of it from the real parts:
1. rank 0 scores rank 1 and names its node; the operator sets StragglerDetected (True, Straggler)
   and status.straggler naming rank 1 on that node;
2. once it has lasted a minute, the operator weighs the replacement with the job's own figures (the
   ETA at the slowed pace, the measured start-up, the checkpoint age) and, as it pays, starts
   attempt 2 away from the node: status.avoidNodes names it, no restart spent
   (stragglerReplacements 1), and the Restarting event says the sums and the evidence ("replacing
   node X: … saved vs … restart (…); rank 1 on node X computes …× the other ranks' median; the job
   runs …× slower for 1 min");
3. the old attempt's pod is stopped as a kubelet would (SIGTERM: the trainer saves its checkpoint);
   attempt 2's pod lands on the other node, resumes from that checkpoint, trains to the end: the
   job Succeeded;
4. the time the straggler cost is in status.goodput's slow bucket: attempt 1's record says more
   than nothing and less than it ran.

Its cost on top of the chain (the slow rank sleeps, the other one waits in gloo for it), printed
by the test: 45-63 CPU-seconds of trainer processes, about 5 of the operator's, and 3-6 minutes of
wall on this machine, most of it the minute durationMinutes asks for and the start-ups.

Run it: `.venv/bin/python -m pytest tests/chain/test_straggler_chain.py -p no:cacheprovider -s`
"""

from __future__ import annotations

import os
import re
import resource
import uuid
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from backend_child import attempt_pods, on
from backend_child import rank0 as rank0_of
from llmtrain.spec import API_VERSION, GROUP, KIND, PLURAL, VERSION
from llmtrain_devcluster.chain import COMPLETE_POD_LABEL
from llmtrain_devcluster.process import free_port_block
from operator_core.conftest import OperatorProcess

from .conftest import wait_for
from .pod_trainer import REPO, PodTrainer

pytestmark = [pytest.mark.slow]

STEPS, EVERY = 140, 10
# Seconds rank 1 sleeps per step on the slow node: the first window at step 20, the minute 30 steps
# later, and ~90 steps left at about 2.5 s each, so the replacement pays about twice over even with
# a minute of start-up on a loaded machine (at 1 s a step one run weighed 76 s saved vs 76 s).
SLEEP = 2.0
HOOKS = str(REPO / "tests" / "trainer" / "hooks")


def _doc(name: str, ckpt: Path) -> dict:
    return on(
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": name},
            "spec": {
                "model": {"preset": "tiny"},
                "data": {"uri": "synthetic", "seqLen": 32},
                "cluster": {"instanceType": "cpu", "nodes": 1, "processesPerNode": 2},
                "fsdp": {
                    "shardingStrategy": "FULL_SHARD",
                    "mixedPrecision": "fp32",
                    "activationCheckpointing": "none",
                },
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
                    "maxRestarts": 0,  # a replacement spends none: with none to spend, it must still move
                    "restartBackoffSeconds": 0,
                    "maxRestartBackoffSeconds": 1,
                    "collectiveTimeoutMinutes": 2,
                    "preflight": False,
                    "stragglers": {"action": "replace", "durationMinutes": 1, "maxReplacements": 1},
                },
                "rendezvous": {"backend": "c10d"},
            },
        },
        "pytorchjob",
    )


@pytest.fixture
def cpu_nodes(chain_cluster, chain):
    """Two simulated cpu nodes (requested before chain_ns: they go after its pods): the slow one
    and the one attempt 2 moves to."""
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
    return free_port_block(2)


@pytest.fixture
def operator(chain_cluster, chain_ns, scrape_port, tmp_path):
    op = OperatorProcess(
        chain_cluster.kubeconfig,
        tmp_path / "operator.log",
        scrape_port,
        extra_args=["--namespace", chain_ns, "--backend", "pytorchjob"],
    )
    op.start()
    yield op
    op.stop()


@pytest.fixture
def trainers():
    started: list[PodTrainer] = []
    yield started
    for t in started:
        if t.proc.poll() is None:
            t.kill()


@pytest.mark.slow(seconds=180)  # 3-6 min at load 7-14: its minute of durationMinutes and two start-ups
def test_replace_moves_a_straggling_job_off_its_node_and_it_finishes(
    chain, cpu_nodes, chain_ns, operator, scrape_port, trainers, tmp_path
):
    from llmtrain_trainer.metrics.stragglers import TESTHOOK_ENV

    name = f"slow-{uuid.uuid4().hex[:6]}"
    ns = chain_ns
    log = f"(operator log: {operator.log_path})"
    cpu0 = _cpu()

    def status() -> dict:
        return chain.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name).get("status") or {}

    def rank0(attempt: int):
        return rank0_of("pytorchjob", chain.wait_pods_running(ns, attempt_pods(name, attempt), 1))

    chain.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _doc(name, tmp_path / "ckpt"))

    # --- attempt 1, on the slow node: rank 1 throttled ------------------------------------------
    pod1 = rank0(1)
    slow_node = pod1.spec.node_name
    assert slow_node in cpu_nodes
    t1 = PodTrainer(pod1, scrape_port, tmp_path, extra_env={TESTHOOK_ENV: f"1:{SLEEP}", "PYTHONPATH": HOOKS})
    trainers.append(t1)
    chain.serve_pod_here(ns, pod1.metadata.name)

    found = wait_for(lambda: status().get("straggler"), 120, f"{name} straggler verdict {log}")
    assert (found["attempt"], found["rank"], found["node"]) == (1, 1, slow_node), found
    assert found["score"] >= 1.2 and found["slowdown"] >= 1.02, found
    cond = next(c for c in status()["conditions"] if c["type"] == "StragglerDetected")
    assert (cond["status"], cond["reason"]) == ("True", "Straggler"), cond
    assert f"rank 1 on node {slow_node}" in cond["message"], cond

    # --- the replacement: after durationMinutes, weighed, away from the node ---------------------
    wait_for(lambda: status().get("attempt") == 2, 150, f"{name} replaced (attempt 2) {log}")
    s = status()
    assert (s.get("restarts"), s.get("stragglerReplacements")) == (0, 1), s
    assert slow_node in (s.get("avoidNodes") or []), s

    def restarting() -> list[str]:
        return [
            e.message
            for e in chain.core.list_namespaced_event(ns).items
            if e.reason == "Restarting" and e.involved_object.name == name
        ]

    # act.finish posts a transition's events after its status write applied: poll for it
    wait_for(restarting, 30, f"{name} Restarting event {log}")
    (moved,) = restarting()
    m = re.search(
        rf"replacing node {re.escape(slow_node)}: (\S+ \S+) saved vs (\S+ \S+) restart "
        rf"\((\S+ \S+) start-up \+ (\S+ \S+) since the newest checkpoint\); "
        rf"rank 1 on node {re.escape(slow_node)} computes ([0-9.]+)× the other ranks' median; "
        rf"the job runs ([0-9.]+)× slower for (\S+ \S+)",
        moved,
    )
    assert m, moved
    print(f"\nthe replacement's event: {moved}")
    assert float(m.group(5)) >= 1.2 and float(m.group(6)) >= 1.02, moved

    # the kubelet stops attempt 1's container: SIGTERM, the trainer saves and exits
    t1.terminate(60)
    assert any(e.get("signal") == "SIGTERM" for e in t1.of("stop")), t1.stderr()
    saved = max(e["step"] for e in t1.of("checkpoint"))  # the SIGTERM save, or the last before it

    # --- attempt 2, on the other node: no throttling, resumes, finishes -------------------------
    pod2 = rank0(2)
    assert pod2.spec.node_name != slow_node and pod2.spec.node_name in cpu_nodes, pod2.spec.node_name
    t2 = PodTrainer(pod2, scrape_port, tmp_path)
    trainers.append(t2)
    chain.serve_pod_here(ns, pod2.metadata.name)
    rc = t2.wait(240)
    assert rc == 0, t2.stderr()
    (resume,) = t2.of("resume")
    assert resume["step"] == saved > 0, (resume, saved)
    assert max(e["step"] for e in t2.of("step")) == STEPS
    chain.core.patch_namespaced_pod(pod2.metadata.name, ns, {"metadata": {"labels": {COMPLETE_POD_LABEL: "true"}}})
    wait_for(lambda: status().get("phase") == "Succeeded", 60, f"{name} Succeeded {log}")

    # --- what the straggler cost, in goodput ------------------------------------------------------
    g = status()["goodput"]
    recs = {r["attempt"]: r for r in g["attempts"]}
    assert recs[1]["endReason"] == "Straggler" and recs[1]["slowSeconds"] > 0, recs[1]
    # Attempt 2 runs unthrottled, but on this CPU trainer rank 0 also serves the operator's scrapes
    # (every 0.5 s here) and commits the checkpoints, and a loaded machine lands unevenly on the
    # ranks: at load averages of 10-14 its score crossed 1.2 for a second in one run, for three
    # windows in another (docs: Slow and sick nodes). What attempt 2 lost is bounded, not asserted
    # zero, and printed.
    windows2 = [(e["step"], [(r["rank"], r["score"], r["slowdown"]) for r in e["ranks"]]) for e in t2.of("stragglers")]
    print(f"\nattempt 2's windows (step, [(rank, score, slowdown)]): {windows2}")
    ran1 = _t(recs[1]["endTime"]) - _t(recs[1]["createdTime"])
    assert (recs[2].get("slowSeconds") or 0) < recs[1]["slowSeconds"] < ran1, (recs, ran1)
    # the bucket: the records' lost seconds, each at its attempt's share of productive time
    assert 0 < g["seconds"]["slow"] <= recs[1]["slowSeconds"] + (recs[2].get("slowSeconds") or 0) + 0.1, g
    test, trainers_cpu = (a - b for a, b in zip(_cpu(), cpu0, strict=True))
    op_cpu = _proc_cpu(operator.proc.pid)
    print(
        f"goodput seconds: {g['seconds']}; CPU-s: trainers {trainers_cpu:.1f}, operator {op_cpu:.1f}, "
        f"this process {test:.1f}"
    )


def _cpu() -> tuple[float, float]:
    """CPU-seconds of this process, and of its children that have exited (the trainers' process
    trees: each launcher waits for torchrun, which waits for its workers)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def _proc_cpu(pid: int) -> float:
    """CPU-seconds a running process has used (/proc/PID/stat's utime + stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _t(stamp: str) -> float:
    from llmtrain.controller.policy.child_status import parse_time

    return parse_time(stamp).timestamp()
