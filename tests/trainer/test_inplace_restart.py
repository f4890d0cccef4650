"""In-place restarts on this machine: one torchrun (a pod) with 2 ranks (gloo, CPU) meeting through a
real etcd, local rank 1 SIGKILLed mid-run. torchrun (`--max-restarts`, spec.resilience.inPlaceRestarts)
restarts both workers in place, they meet in a new rendezvous round, resume from the newest checkpoint
and train to the end: no new launcher, one in-place restart spent, and the attempt's counters carried
across the two worker processes (metrics/restarts.py) as the operator's scrape sees them.

The goodput buckets the operator's code computes from that scrape (llmtrain/goodput.py) must match a
hand computation from the trainer's step log, as tests/trainer/test_goodput_local.py does for two
attempts: the restart's gap is restarting, the steps redone after it lost work.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from test_goodput_local import Monitor

from conftest import base_spec
from goodput_hand import generations, hand
from llmtrain import goodput as gp
from llmtrain_trainer.metrics.restarts import read_ledger

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

STEPS, KILL_AT, EVERY = 60, 25, 10


def test_a_killed_rank_restarts_in_place_and_the_attempt_keeps_its_counters(launch, etcd, tmp_path):
    spec = base_spec(
        **{
            "training.maxSteps": STEPS,
            "checkpoint.uri": f"file://{tmp_path}/ckpt",
            "checkpoint.intervalSteps": EVERY,
            "checkpoint.keep": 2,
            "rendezvous.backend": "etcd-v2",
            "resilience.inPlaceRestarts": 1,
        }
    )
    created = time.time()
    g = gp.opened({}, 1, created, job_created=created)
    # --max-restarts=1: the one kill may cost one restart, no more (with the TCPStore torchrun's
    # agent shares across rounds, the restarted workers often spent a second one: launch.py)
    w = launch(spec, 2, rdzv=("etcd-v2", etcd), max_restarts=1, env={"LLMTRAIN_ATTEMPT": "1"})
    mon = Monitor(w.metrics_port, 1)
    w.wait_for(lambda e: e.get("event") == "step" and e["step"] >= KILL_AT)
    launcher, torchrun = w.proc.pid, w.worker_pids()
    os.kill(w.worker(1), signal.SIGKILL)
    rc = w.wait(240)
    ended = time.time()
    progress = mon.stop()
    assert rc == 0, w.stderr()
    assert w.proc.pid == launcher and torchrun  # the same launcher (pod) throughout

    configs = w.of("config")
    assert [c["in_place_restarts"] for c in configs] == [0, 1], configs
    gens = generations(w.events)
    high = gens[0][-1]["step"]
    (resume,) = w.of("resume")
    assert resume["step"] % EVERY == 0 and 0 < resume["step"] < KILL_AT <= high
    assert [s["step"] for s in gens[1]] == list(range(resume["step"] + 1, STEPS + 1))

    # the count, as the operator's scrape of rank 0 sees it (status.progress.inPlaceRestarts)
    assert progress["inPlaceRestarts"] == 1
    # rank 0's ledger: the attempt's counters over both processes, exactly the step log's
    ledger = read_ledger(str(tmp_path / "staging" / "inplace-ledger-r0.json"), w.rdzv_id, 1)
    assert ledger is not None
    assert ledger["processes"] == 2 and ledger["resume_step"] == 0 and ledger["high_step"] == STEPS
    assert ledger["steps"] == len(gens[0]) + len(gens[1])
    assert ledger["redone_steps"] == high - resume["step"]
    redone = sum(s["step_seconds"] - s["data_wait_seconds"] for s in gens[1] if s["step"] <= high)
    assert ledger["redone_seconds"] == pytest.approx(redone, abs=0.01)
    gap = (gens[1][0]["time"] - gens[1][0]["step_seconds"]) - gens[0][-1]["time"]
    assert ledger["restart_seconds"] == pytest.approx(gap, abs=0.5)

    # the operator's accounting from its scrape, against the step log
    g = gp.closed(g, 1, ended, "Succeeded", progress)
    auto = gp.buckets(gp.timeline_of(g, created), ended)
    hand_ = hand([{"created": created, "end": ended, "why": "Succeeded", "gens": gens}], created, ended)
    wall = ended - created
    assert sum(auto.values()) == pytest.approx(wall) and sum(hand_.values()) == pytest.approx(wall)
    tolerance = max(0.02 * wall, 2.5)  # as test_goodput_local: a scrape's resolution at the ends
    report = {k: (round(auto[k], 3), round(hand_[k], 3)) for k in gp.BUCKETS}
    print(f"wall {wall:.2f} s; in-place gap {gap:.2f} s; bucket: (status.goodput, step log) {report}")
    off = {k: v for k, v in report.items() if abs(v[0] - v[1]) > tolerance}
    assert not off, f"buckets off by more than {tolerance:.2f} s of {wall:.1f} s: {off}; all: {report}"
    # the restart's gap is restarting and the redone steps lost work, not productive time (status
    # times are whole seconds: the attempt's end, written truncated, leaves up to 1 s of restarting)
    assert auto["restarting"] == pytest.approx(gap, abs=1.0) and auto["lostWork"] == pytest.approx(redone, abs=0.05)
    assert gp.steps_redone(gp.timeline_of(g, created)) == high - resume["step"]


def _kubelet_tail(text: str) -> str:
    """What `terminationMessagePolicy: FallbackToLogsOnError` keeps of a log: the last 80 lines,
    at most 2048 bytes."""
    tail = "\n".join(text.splitlines()[-80:]).encode()[-2048:]
    return tail.decode(errors="replace")


def test_a_rank_that_keeps_failing_in_place_fails_its_pod_and_names_its_node(launch, etcd, tmp_path):
    """Once the pod's in-place restarts are spent, torchrun gives up: the pod's container exits
    non-zero and its log tail (the termination message) is the last failure's, so the operator's
    existing bad-node path (controller/policy/podfailure.py, badnodes.py) blames the node it ran on,
    as for any pod failure."""
    from llmtrain import pod_contract, render
    from llmtrain.controller.policy import badnodes, podfailure

    spec = base_spec(
        **{
            "training.maxSteps": 400,
            "checkpoint.uri": f"file://{tmp_path}/ckpt",
            "checkpoint.intervalSteps": EVERY,
            "rendezvous.backend": "etcd-v2",
            "resilience.inPlaceRestarts": 1,
        }
    )
    term = tmp_path / "termination-log"
    w = launch(spec, 2, rdzv=("etcd-v2", etcd), max_restarts=1, env={"LLMTRAIN_TERMINATION_LOG": str(term)})
    w.wait_for(lambda e: e.get("event") == "step" and e["step"] >= 12)
    os.kill(w.worker(1), signal.SIGKILL)
    w.wait_for(lambda e: e.get("event") == "config")  # restarted in place, once
    w.wait_for(lambda e: e.get("event") == "step")
    second = w.worker(1)
    os.kill(second, signal.SIGKILL)  # again: the restart is spent
    rc = w.wait(120)
    assert rc not in (0, None, pod_contract.PREFLIGHT_EXIT_CODE), rc
    assert [c["in_place_restarts"] for c in w.of("config")] == [0, 1]

    log = w.stderr_path.read_text()
    # torchrun's summary, whose failures are the last round's: the rank SIGKILLed the second time
    assert f"Signal 9 (SIGKILL) received by PID {second}" in log, log[-3000:]
    # Its "Root Cause" is whichever failure it stamped first, sometimes rank 0 (which only lost its
    # peer), whose traceback then fills the 2 KiB the kubelet keeps; the launcher's own line comes
    # last, so the kubelet's tail still names the SIGKILLed rank
    tail = _kubelet_tail(log)
    assert (
        tail.rstrip().splitlines()[-1]
        == f"llmtrain launch: {pod_contract.ROOT_CAUSE} rank 1 (local 1): SIGKILL (signal 9)"
    ), tail
    # the termination message (the launcher's, else the kubelet's tail of the log) puts it first,
    # before any rank that only lost it (llmtrain_trainer.launch.root_cause_message)
    message = (term.read_text() if term.exists() else "") or _kubelet_tail(log)
    assert message.startswith(f"{pod_contract.ROOT_CAUSE} rank 1 (local 1): SIGKILL (signal 9)"), message
    pod = {
        "metadata": {
            "name": "j-a1-worker-0",
            "labels": {render.JOB_LABEL: "j", render.ATTEMPT_LABEL: "1"},
            "ownerReferences": [
                {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "j-a1", "uid": "u1", "controller": True}
            ],
        },
        "spec": {"nodeName": "ip-10-0-0-7"},
        "status": {
            "phase": "Failed",
            "containerStatuses": [{"state": {"terminated": {"exitCode": rc, "reason": "Error", "message": message}}}],
        },
    }
    failure = podfailure.failure_of(pod)
    assert failure is not None and failure["node"] == "ip-10-0-0-7" and failure["exitCode"] == rc
    assert podfailure.culprits([failure]) == [failure] and failure["reason"] == "exit 1: SIGKILL"
    (bad,) = badnodes.record([], [failure], attempt=1, when="2026-12-01T00:00:00Z")
    assert bad["node"] == "ip-10-0-0-7" and bad["reason"] == failure["reason"] and bad["attempt"] == 1
