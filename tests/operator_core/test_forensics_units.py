"""Failure forensics, bad-node avoidance and preflight verdicts: the pure rules
(controller/policy/podfailure.py, nodes.py, preflight.py, forensics.py). The chain tests (tests/chain/test_bad_nodes.py)
prove the same behaviour end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmtrain.controller.adapters.taints import taint_budget, taint_value
from llmtrain.controller.policy import forensics, podfailure, preflight
from llmtrain.controller.policy.badnodes import plan_avoidance, record
from llmtrain.controller.policy.podfailure import PREFLIGHT_EXIT_CODE, classify, failure_of, xid_of
from llmtrain.status import Reason

PTJ_UID = "ptj-uid"
PTJ = {"metadata": {"name": "job-a1", "uid": PTJ_UID}, "status": {}}


def _pod(node="n1", exit_code=1, reason="Error", message="", deleting=False, phase="Failed"):
    # controlled by the attempt's PyTorchJob, as the training-operator makes its pods
    meta = {
        "name": "job-a1-worker-0",
        "ownerReferences": [
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "PyTorchJob",
                "name": "job-a1",
                "uid": PTJ_UID,
                "controller": True,
            }
        ],
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    term = {"exitCode": exit_code, "reason": reason, "finishedAt": "2026-01-01T00:00:01Z"}
    if message:
        term["message"] = message
    return {
        "metadata": meta,
        "spec": {"nodeName": node},
        "status": {"phase": phase, "containerStatuses": [{"name": "pytorch", "state": {"terminated": term}}]},
    }


@pytest.mark.parametrize(
    "text,xid",
    [
        ("NVRM: Xid (PCI:0000:53:00): 79, pid=1234, GPU has fallen off the bus.", 79),
        ("kernel: NVRM: Xid (PCI:0000:b9:00): 48, pid='<unknown>', An uncorrectable double bit error", 48),
        ("XID 94 contained ECC error", 94),
        ("xid=63 row remapping", 63),
        ("RuntimeError: CUDA error: an illegal memory access was encountered", None),
        ("rapid 79 steps", None),  # 'xid' must be its own word
        (None, None),
    ],
)
def test_xid_is_read_from_the_nvidia_driver_line(text, xid):
    assert xid_of(text) == xid


@pytest.mark.parametrize(
    "exit_code,reason,message,expected",
    [
        (137, "OOMKilled", "", "OOMKilled"),
        (1, "Error", "NVRM: Xid (PCI:0000:53:00): 79, GPU has fallen off the bus", "XID 79"),
        (
            1,
            "Error",
            "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=42, "
            "OpType=ALLREDUCE, Timeout(ms)=600000)",
            "NCCL collective timeout",
        ),
        (1, "Error", "NCCL WARN NET/OFI Request completed with error: fi_cq_readerr", "EFA error"),
        (
            1,
            "Error",
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error",
            "NCCL error",
        ),
        (PREFLIGHT_EXIT_CODE, "Error", '{"event":"healthcheck","healthy":false}', "preflight"),
        (139, "Error", "", "exit 139"),
        (2, "ContainerCannotRun", "", "ContainerCannotRun (exit 2)"),
    ],
)
def test_failure_reason_most_specific_first(exit_code, reason, message, expected):
    assert classify(exit_code, reason, message) == expected


def test_failure_of_names_the_node_and_keeps_the_message_and_xid():
    f = failure_of(
        _pod(
            node="ip-10-0-1-7", exit_code=1, message="NVRM: Xid (PCI:0000:53:00): 79, pid=1, GPU has fallen off the bus"
        )
    )
    assert f["node"] == "ip-10-0-1-7" and f["reason"] == "XID 79" and f["xid"] == 79
    assert f["exitCode"] == 1 and "fallen off the bus" in f["message"]


def test_bystanders_and_healthy_pods_are_not_blamed():
    assert failure_of(_pod(deleting=True, exit_code=143)) is None  # the gang's teardown killed it
    assert failure_of(_pod(exit_code=0, reason="Completed", phase="Succeeded")) is None
    unscheduled = _pod()
    unscheduled["spec"] = {}
    assert failure_of(unscheduled) is None  # never ran on a node: nothing to say about one
    running = {
        "metadata": {"name": "p"},
        "spec": {"nodeName": "n"},
        "status": {"phase": "Running", "containerStatuses": [{"state": {"running": {}}}]},
    }
    assert failure_of(running) is None


def test_an_evicted_pod_blames_its_node_with_the_eviction_reason():
    pod = {
        "metadata": {**_pod()["metadata"], "name": "p"},
        "spec": {"nodeName": "n9"},
        "status": {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."},
    }
    assert failure_of(pod)["reason"] == "Evicted" and failure_of(pod)["node"] == "n9"


def test_a_pod_the_pod_gc_failed_because_its_node_was_deleted_names_the_node():
    """Found by tests/chain/test_random_faults.py: when a node is deleted, the controller-manager's
    pod GC marks its pods Failed with only a DisruptionTarget condition (no status.reason; the
    containers still say running, nobody stopped them) and then deletes them. Such a pod was not a
    failure here, so the operator waited 5 s for one that never came, and the restart did not say
    that the node was gone."""
    pod = {
        "metadata": {**_pod()["metadata"], "name": "p"},
        "spec": {"nodeName": "kwok-cpu-2"},
        "status": {
            "phase": "Failed",
            "conditions": [
                {"type": "Ready", "status": "True"},
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "DeletionByPodGC",
                    "message": "PodGC: node no longer exists",
                },
            ],
            "containerStatuses": [{"name": "pytorch", "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}],
        },
    }
    f = failure_of(pod)
    assert f["node"] == "kwok-cpu-2" and f["reason"] == "DeletionByPodGC"
    assert f["message"] == "PodGC: node no longer exists"
    running = {**pod, "status": {**pod["status"], "phase": "Running"}}  # a disruption not carried out yet
    assert failure_of(running) is None


def test_a_pod_evicted_from_a_not_ready_node_is_a_failure_on_that_node():
    """The taint-eviction controller (a NotReady or unreachable node's NoExecute taint) marks the pod
    DisruptionTarget/DeletionByTaintManager while it still runs, then deletes it; the training-
    operator fails the attempt on the deleted pod. Found by the random faults (seed 7, a NotReady
    kwok-cpu-1): unrecognized, the operator waited 5 s for a failure that never came and named no
    node. It counts at once, and also once its killed container reports exit 137 on the way out
    (not a bystander of the gang's teardown: the eviction came first)."""
    evicted = {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "DeletionByTaintManager",
        "message": "Taint manager: deleting due to NoExecute taint",
    }
    running = {
        **_pod(node="kwok-cpu-1"),
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}, evicted],
            "containerStatuses": [{"name": "pytorch", "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}],
        },
    }
    f = failure_of(running)
    assert f is not None and f["node"] == "kwok-cpu-1" and f["reason"] == "DeletionByTaintManager"
    assert f["message"] == "Taint manager: deleting due to NoExecute taint"
    killed = _pod(node="kwok-cpu-1", exit_code=137, deleting=True)
    assert failure_of(killed) is None  # the gang's teardown: a bystander
    killed["status"]["conditions"] = [evicted]
    assert failure_of(killed)["reason"] == "DeletionByTaintManager"
    # other disruptions of a running pod are not the node's: a preemption, a drain's eviction
    for reason in ("PreemptionByScheduler", "EvictionByEvictionAPI"):
        other = {**running, "status": {**running["status"], "conditions": [{**evicted, "reason": reason}]}}
        assert failure_of(other) is None, reason


def test_bad_nodes_are_recorded_once_per_node_and_attempt_and_bounded():
    f = [
        {"node": "a", "pod": "p0", "reason": "exit 1", "exitCode": 1},
        {"node": "a", "pod": "p1", "reason": "exit 1", "exitCode": 1},
    ]
    out = record([], f, attempt=1, when="t1")
    assert out == [{"node": "a", "reason": "exit 1", "attempt": 1, "time": "t1", "pod": "p0", "exitCode": 1}]
    out = record(out, f, attempt=2, when="t2")
    assert [(b["node"], b["attempt"]) for b in out] == [("a", 1), ("a", 2)]
    many = record([], [{"node": f"n{i}", "pod": f"p{i}", "reason": "x"} for i in range(30)], 3, "t", limit=20)
    assert len(many) == 20 and many[-1]["node"] == "n29" and many[0]["node"] == "n10"  # newest kept


def test_avoidance_never_makes_the_job_unschedulable():
    bad = [{"node": "x"}, {"node": "y"}]
    ready = {"x", "y", "z", "w"}
    # 4 Ready nodes, 2 needed: both bad nodes can go
    assert plan_avoidance(bad, ready, 2)[0] == ["x", "y"]
    # 3 needed: only the newest bad node (y) is avoided; x stays in play, and the message says why
    avoid, why = plan_avoidance(bad, ready, 3)
    assert avoid == ["y"] and "not avoiding x" in why and "4 Ready node(s)" in why
    # as many needed as there are nodes: nothing avoided
    assert plan_avoidance(bad, ready, 4)[0] == []
    # a bad node that is not Ready any more costs nothing to avoid
    assert plan_avoidance([{"node": "gone"}], {"a", "b"}, 2)[0] == ["gone"]
    # nodes could not be counted: do not avoid, say so
    avoid, why = plan_avoidance(bad, None, 1)
    assert avoid == [] and "could not be counted" in why
    assert plan_avoidance([], ready, 1) == ([], "")


@pytest.mark.parametrize(
    "total,tainted,fraction,budget",
    [
        (10, 0, 0.1, 1),
        (10, 1, 0.1, 0),
        (2, 0, 0.5, 1),
        (9, 0, 0.1, 0),
        (16, 1, 0.25, 3),
        (10, 0, 0.0, 0),
        (0, 0, 0.5, 0),
        (10, 5, 0.2, 0),
        (3, 0, 1.0, 3),
        (10, 0, 0.3, 3),
    ],
)
def test_taint_budget_never_exceeds_the_fraction(total, tainted, fraction, budget):
    assert taint_budget(total, tainted, fraction) == budget
    assert tainted + taint_budget(total, tainted, fraction) <= max(tainted, fraction * total + 1e-9)


def test_taint_value_is_a_valid_label_value():
    assert taint_value("XID 79") == "XID-79"
    assert taint_value("preflight: links 0.1 and 0.2 GB/s") == "preflight-links-0.1-and-0.2-GB-s"
    assert len(taint_value("x" * 100)) == 63 and taint_value("::") == "failed"


def _verdict(**over):
    v = {
        "event": "healthcheck",
        "healthy": False,
        "worldSize": 16,
        "busBandwidthGBps": 12.5,
        "expectedBusBandwidthGBps": 400.0,
        "degraded": False,
        "suspectRanks": {"8": ["links 1.000 and 1.100 GB/s, below 50% of the median link (40.000 GB/s)"]},
        "suspectNodes": [{"node": 1, "host": "job-a1-worker-1", "nodeName": "ip-10-0-1-9"}],
    }
    v.update(over)
    return v


def test_preflight_verdict_is_read_from_the_termination_message_and_names_the_k8s_node():
    text = json.dumps(_verdict(), separators=(",", ":"))
    seen = [
        {"pod": "job-a1-worker-0", "node": "ip-10-0-1-8", "exitCode": PREFLIGHT_EXIT_CODE, "message": text},
        {"pod": "job-a1-worker-1", "node": "ip-10-0-1-9", "exitCode": PREFLIGHT_EXIT_CODE, "message": text},
    ]
    v = preflight.preflight_verdict(seen)
    ran = {"ip-10-0-1-8", "ip-10-0-1-9"}  # the nodes the attempt's pods ran on
    assert v["busBandwidthGBps"] == 12.5
    blamed = preflight.suspect_failures(v, seen, ran)
    assert [b["node"] for b in blamed] == ["ip-10-0-1-9"]  # only the slow node, not the gang
    assert blamed[0]["reason"].startswith("preflight: links 1.000 and 1.100 GB/s")
    # without the downward-API node name, the pod name (HOSTNAME) finds it among the failures
    v2 = _verdict(suspectNodes=[{"node": 1, "host": "job-a1-worker-1"}])
    assert [b["node"] for b in preflight.suspect_failures(v2, seen, ran)] == ["ip-10-0-1-9"]
    # a healthy verdict, another exit code or a non-verdict message is not a preflight failure
    assert preflight.preflight_verdict([{**seen[0], "message": json.dumps(_verdict(healthy=True))}]) is None
    assert preflight.preflight_verdict([{**seen[0], "exitCode": 1}]) is None
    assert preflight.preflight_verdict([{**seen[0], "message": "Traceback ..."}]) is None


def _spec(raw):
    from llmtrain.validation import parse_spec

    return parse_spec(raw)


GPU2 = {"model": {"preset": "tiny"}, "cluster": {"instanceType": "p5.48xlarge", "nodes": 2}}


def test_failed_preflight_amends_the_restart_with_bad_nodes_avoidance_and_bandwidth():
    text = json.dumps(_verdict(), separators=(",", ":"))
    seen = (
        {
            "pod": "job-a1-worker-1",
            "node": "ip-10-0-1-9",
            "reason": "preflight",
            "exitCode": PREFLIGHT_EXIT_CODE,
            "message": text,
        },
    )
    failed = forensics.failed_attempt(seen, "the PyTorchJob failed", preflight_failures=0)
    assert failed.reason == Reason.PREFLIGHT_FAILED and failed.spend is False
    update = {"phase": "Restarting", "message": "attempt 1 preflight-failed"}
    forensics.amend_failed(
        update,
        failed,
        spec=_spec(GPU2),
        attempt=1,
        bad_nodes=[],
        preflight_failures=0,
        ready={"ip-10-0-1-8", "ip-10-0-1-9", "ip-10-0-1-10"},
        when="2026-01-01T00:00:00Z",
    )
    assert update["avoidNodes"] == ["ip-10-0-1-9"]
    assert update["badNodes"][0]["node"] == "ip-10-0-1-9" and update["badNodes"][0]["attempt"] == 1
    assert update["preflight"]["busBandwidthGBps"] == 12.5 and update["preflight"]["suspectNodes"] == ["ip-10-0-1-9"]
    assert update["preflightFailures"] == 1 and "avoiding ip-10-0-1-9" in update["message"]
    # after MAX_FREE_RETRIES free preflight retries in a row, the next one spends the budget
    assert forensics.failed_attempt(seen, "", preflight.MAX_FREE_RETRIES).spend is True


def test_flight_recorder_is_named_on_hang_for_gpu_jobs_only():
    gpu = {**GPU2, "checkpoint": {"uri": "file:///mnt/fsx/ckpt/run1/"}}
    update = {"phase": "Restarting", "message": "attempt 3 hang"}
    forensics.amend_stuck(update, Reason.HANG, spec=_spec(gpu), attempt=3, bad_nodes=[], ready=None)
    assert update["flightRecorder"] == {
        "attempt": 3,
        "reason": "hang",
        "path": "/mnt/fsx/ckpt/run1/flight-recorder/attempt-3/rank_<rank>",
        "persistent": True,
        "note": "beside the checkpoints",
    }
    assert "flight-recorder/attempt-3" in update["message"]
    s3 = {**gpu, "checkpoint": {"uri": "s3://b/ckpt/"}}
    update = {"message": "m"}
    forensics.amend_stuck(update, Reason.STARTUP_TIMEOUT, spec=_spec(s3), attempt=3, bad_nodes=[], ready=None)
    fr = update["flightRecorder"]
    assert fr["path"].startswith("/var/lib/llmtrain/staging/flight-recorder/attempt-3/") and not fr["persistent"]
    assert fr["reason"] == "startup-timeout"
    cpu = {**gpu, "cluster": {"instanceType": "cpu", "nodes": 1}}
    for spec, reason in ((cpu, Reason.HANG), (gpu, Reason.FAILED)):
        update = {"message": "m"}
        forensics.amend_stuck(update, reason, spec=_spec(spec), attempt=3, bad_nodes=[], ready=None)
        assert "flightRecorder" not in update


def test_a_collective_timeout_failure_names_the_flight_recorder():
    seen = (
        {
            "pod": "j-a2-worker-0",
            "node": "n1",
            "reason": "NCCL collective timeout",
            "exitCode": 1,
            "message": "Watchdog caught collective operation timeout",
        },
    )
    failed = forensics.failed_attempt(seen, "replica worker failed", preflight_failures=0)
    assert failed.reason == Reason.FAILED and failed.spend is True
    update = {"phase": "Restarting", "message": "m"}
    forensics.amend_failed(
        update,
        failed,
        spec=_spec(GPU2),
        attempt=2,
        bad_nodes=[],
        preflight_failures=0,
        ready={"n1", "n2", "n3"},
        when="2026-01-01T00:00:00Z",
    )
    assert update["flightRecorder"]["attempt"] == 2 and update["flightRecorder"]["reason"] == "collective-timeout"
    assert update["avoidNodes"] == ["n1"]


def test_ranks_that_only_lost_a_peer_are_not_blamed_beside_the_one_that_failed():
    culprit = {"node": "a", "pod": "p0", "reason": "XID 79", "message": "NVRM: Xid (PCI:0000:53:00): 79"}
    victim = {
        "node": "b",
        "pod": "p1",
        "reason": "NCCL error",
        "message": "DistBackendError: NCCL error: remote process exited or there was a network error",
    }
    reset = {"node": "c", "pod": "p2", "reason": "exit 1", "message": "gloo: Connection reset by peer"}
    assert podfailure.culprits([victim, culprit, reset]) == [culprit]
    # only victims: nobody else to blame, so they are what is known
    assert podfailure.culprits([victim, reset]) == [victim, reset]


def test_a_stuck_attempt_plans_avoidance_again_against_the_nodes_ready_now():
    bad = [{"node": "n1", "reason": "XID 79", "attempt": 1}]
    spec = _spec(GPU2)
    # a node was lost meanwhile: only n1 and n2 are Ready, and the job needs both
    update = {"phase": "Restarting", "message": "m"}
    forensics.amend_stuck(update, Reason.STARTUP_TIMEOUT, spec=spec, attempt=2, bad_nodes=bad, ready={"n1", "n2"})
    assert update["avoidNodes"] == [] and "not avoiding n1" in update["message"]
    update = {"phase": "Restarting", "message": "m"}
    forensics.amend_stuck(update, Reason.HANG, spec=spec, attempt=2, bad_nodes=bad, ready={"n1", "n2", "n3"})
    assert update["avoidNodes"] == ["n1"]
    # giving up (Failed) plans nothing
    update = {"phase": "Failed", "message": "m"}
    forensics.amend_stuck(update, Reason.HANG, spec=spec, attempt=2, bad_nodes=bad, ready={"n1", "n2", "n3"})
    assert "avoidNodes" not in update


DATA = Path(__file__).parent / "data"


def test_a_pod_whose_peer_spent_its_in_place_restarts_is_not_blamed():
    """Two pods of one attempt, 2 ranks each, in-place restarts 1: pod A's local rank 1 SIGKILLed
    twice. A's torchrun gives up (its summary's root cause: Signal 9) and closes the rendezvous; B's,
    restarting in place, fails to rejoin with RendezvousClosedError. Only A's node is to blame (B's
    was blamed too). The texts are the two pods' log tails as the kubelet keeps them (the last
    80 lines, at most 2048 bytes) from a real run of two llmtrain_trainer.launch processes on this
    machine (torch 2.15, gloo, the etcd-v2 rendezvous), install paths shortened to the image's."""
    a = _pod(node="node-a", message=(DATA / "torchrun_inplace_spent_a.txt").read_text())
    b = _pod(node="node-b", message=(DATA / "torchrun_rendezvous_closed_b.txt").read_text())
    b["metadata"]["name"] = "job-a1-worker-1"
    fa, fb = failure_of(a), failure_of(b)
    assert fa is not None and fb is not None
    assert "Signal 9 (SIGKILL)" in fa["message"] and fb["message"].endswith("RendezvousClosedError")
    assert podfailure.culprits([fb, fa]) == [fa]
    failed = forensics.failed_attempt((fb, fa), "PyTorchJob job-a1 is failed", 0)
    assert [f["node"] for f in failed.blamed] == ["node-a"] and failed.spend


def test_a_failed_attempt_says_the_root_causes_own_words_bounded_and_on_one_line():
    """What a real pod's launcher wrote (a checkpoint path on a read-only volume): the restart's
    message names the path, after the classified reason, quoted, cut and on one line; a message that
    is not the launcher's root-cause line adds nothing (it is only the tenant's text)."""
    words = "checkpoint.uri /ckpt/ro is not writable: OSError: [Errno 30] Read-only file system: '/ckpt/ro'"
    launcher = f"torchrun failed; root cause: rank 0 (local 0): RuntimeError: {words}\nTraceback (most recent call):"
    pod = {"pod": "j-a1-worker-0", "node": "n1", "reason": "exit 1: RuntimeError", "exitCode": 1}
    seen = ({**pod, "message": launcher},)
    message = forensics.failed_attempt(seen, "Job j-a1 has failed", 0).message
    assert f'pod j-a1-worker-0 on node n1: exit 1: RuntimeError ("{words}")' in message, message
    long = {**seen[0], "message": launcher.replace(words, "x\x1b[2J" * 200)}
    message = forensics.failed_attempt((long,), "", 0).message
    quoted = message.split('("', 1)[1]
    assert len(quoted) <= podfailure.MAX_DETAIL_CHARS + 3 and "\x1b" not in quoted and quoted.endswith('…")'), quoted
    other = {**seen[0], "message": "Read-only file system, says a tenant's entrypoint"}
    assert "(" not in forensics.failed_attempt((other,), "", 0).message.split("on node n1:")[1]
