"""Which rank's exception failed a pod, and why, in its termination message.

The workers' entry point records its exception with torch's `@record` (llmtrain_trainer/__main__.py);
torchrun, run as llmtrain_trainer.torchrun, writes every failed rank (or its agent's own exception)
to a file of the launcher's, and the launcher writes the container's termination message from it,
first line llmtrain.pod_contract.ROOT_CAUSE. With 8 ranks per pod the kubelet's 2 KiB log tail was
torchrun's summary alone ("exitcode: 1", "error_file: <N/A>"): neither the exception nor whether the
rank only lost a peer. The operator's classification (controller/policy/podfailure.py) reads the root cause
from that line; a rank killed by a signal comes before the ranks that lost it, and a pod whose agent
could not rejoin a rendezvous a peer closed stays a victim.
"""

from __future__ import annotations

import json

import pytest
from test_inplace_restart import _kubelet_tail

from conftest import base_spec
from llmtrain import pod_contract, render
from llmtrain.controller.adapters import reliability
from llmtrain.controller.policy import podfailure
from llmtrain_trainer.launch import TERMINATION_MESSAGE_BYTES, root_cause_message
from llmtrain_trainer.torchrun import agent_record, failure_record

RC = pod_contract.ROOT_CAUSE


def _pod(message: str, exit_code: int, node: str = "ip-10-0-0-7", name: str = "j-a1-worker-0") -> dict:
    return {
        "metadata": {
            "name": name,
            "labels": {render.JOB_LABEL: "j", render.ATTEMPT_LABEL: "1"},
            "ownerReferences": [
                {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "j-a1", "uid": "u1", "controller": True}
            ],
        },
        "spec": {"nodeName": node},
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {"state": {"terminated": {"exitCode": exit_code, "reason": "Error", "message": message}}}
            ],
        },
    }


def _recorded(path, exc: Exception) -> str:
    """The error file torch's own ErrorHandler (what @record uses) writes at `path` for `exc`,
    raised and caught as @record catches it."""
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

    class At(ErrorHandler):
        def _get_error_file_path(self) -> str:
            return str(path)

    try:
        raise exc
    except type(exc) as e:
        At().record_exception(e)
    return str(path)


def _written(path, data: dict) -> str:
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.slow  # a multi-process run: more than 5 s
@pytest.mark.trainer
def test_a_rank_that_raises_is_named_in_torchrun_s_summary_and_the_termination_message(launch, tmp_path):
    """Fails without @record: torchrun's root cause is "error_file: <N/A>", the launcher has no
    exception to name, and the pod's reason is a bare "exit 1"."""
    term = tmp_path / "termination-log"
    missing = tmp_path / "no-such-corpus"
    w = launch(base_spec(**{"data.uri": str(missing)}), 2, env={"LLMTRAIN_TERMINATION_LOG": str(term)})
    rc = w.wait(120)
    assert rc == 1, w.stderr()
    log = w.stderr_path.read_text()
    assert "Root Cause (first observed failure):" in log, log[-3000:]
    root = log.split("Root Cause (first observed failure):", 1)[1]
    assert "FileNotFoundError" in root and str(missing) in root, root  # torchrun's summary, from the record
    # what the kubelet makes the termination message: the file, when written, else the log's tail
    written = term.read_text() if term.exists() else ""
    message = written or _kubelet_tail(log)
    first = message.splitlines()[0]
    expected = f"FileNotFoundError: [Errno 2] No such file or directory: '{missing}/index.json'"
    assert first.startswith(f"{RC} rank ") and first.endswith(f"): {expected}"), message
    assert message.rstrip().splitlines()[-1] == expected, message  # the traceback's end
    assert len(message.encode()) <= TERMINATION_MESSAGE_BYTES
    failure = podfailure.failure_of(_pod(message, rc))
    assert failure is not None and failure["reason"] == "exit 1: FileNotFoundError"
    assert failure["message"].startswith(first[:200])  # what status.badNodes and the event keep
    assert podfailure.culprits([failure]) == [failure]
    assert not reliability.node_fault({"reason": failure["reason"]})  # the job's own bug, not the node's


def test_the_signal_is_the_root_cause_and_a_closed_rendezvous_a_victim(tmp_path):
    """Two pods of one attempt. Pod A: local rank 1 SIGKILLed, local rank 0 lost it and recorded a
    gloo error in the same second or before (torchrun stamps a signal when it notices it), so
    torchrun's own choice (smallest timestamp, then rank) is the victim. Pod B's torchrun,
    restarting in place, found the rendezvous A's had closed: RendezvousClosedError. Only A's node
    is to blame; by torchrun's choice A would read as a victim too and both nodes be blamed."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
    from torch.distributed.elastic.rendezvous.api import RendezvousClosedError

    lost = _recorded(tmp_path / "r0.json", RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer"))
    victim = ProcessFailure(local_rank=0, pid=101, exitcode=1, error_file=lost)
    killed = ProcessFailure(local_rank=1, pid=102, exitcode=-9, error_file=str(tmp_path / "none.json"))
    assert victim.timestamp <= killed.timestamp
    stopped = ProcessFailure(local_rank=2, pid=103, exitcode=-15, error_file=str(tmp_path / "none.json"))
    records = [failure_record(2, victim), failure_record(3, killed), failure_record(4, stopped)]
    a = root_cause_message(_written(tmp_path / "a.json", {"failures": records}))
    assert a is not None, a
    assert a.splitlines()[:3] == [
        f"{RC} rank 3 (local 1): SIGKILL (signal 9)",
        "also rank 2 (local 0): RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer",
        "also rank 4 (local 2): SIGTERM (signal 15)",
    ], a
    # a rank torchrun's teardown stopped (SIGTERM) is a bystander: the rank that raised comes first
    raised = root_cause_message(_written(tmp_path / "r.json", {"failures": [records[2], records[0]]}))
    assert raised is not None and raised.startswith(f"{RC} rank 2 (local 0): RuntimeError"), raised
    try:
        raise RendezvousClosedError
    except RendezvousClosedError as err:
        b = root_cause_message(_written(tmp_path / "b.json", {"agent": agent_record(err)}))
    assert b is not None and b.splitlines()[0] == f"{RC} RendezvousClosedError:", b
    fa = podfailure.failure_of(_pod(a, 1, node="node-a"))
    fb = podfailure.failure_of(_pod(b, 1, node="node-b", name="j-a1-worker-1"))
    assert fa is not None and fb is not None
    assert fa["reason"] == "exit 1: SIGKILL" and fb["reason"] == "exit 1: RendezvousClosedError"
    assert podfailure.culprits([fb, fa]) == [fa]
    # a pod whose ranks all only lost a peer is a victim too
    only_lost = root_cause_message(_written(tmp_path / "c.json", {"failures": records[:1]}))
    fc = podfailure.failure_of(_pod(only_lost or "", 1, node="node-c"))
    assert fc is not None and podfailure.culprits([fc, fa]) == [fa]


def test_the_termination_message_is_bounded_whatever_the_record_holds(tmp_path):
    """The record is the tenant's text: a huge message or traceback is cut to Kubernetes' 4 KiB with
    the root-cause line kept first; anything but the launcher's shape gives no message (the log's
    tail instead)."""
    huge = {"rank": 0, "localRank": 0, "exitCode": 1, "signal": None, "time": 1}
    huge.update(message="é" * 20_000 + "\nsecond line", traceback="Traceback\n" + "x\n" * 5000 + "é" * 20_000 + "\nend")
    many = [{**huge, "rank": r, "localRank": r, "time": 2, "message": "é" * 300, "traceback": ""} for r in range(1, 40)]
    message = root_cause_message(_written(tmp_path / "huge.json", {"failures": [huge, *many]}))
    assert message is not None and len(message.encode()) <= TERMINATION_MESSAGE_BYTES
    lines = message.splitlines()
    assert lines[0].startswith(f"{RC} rank 0 (local 0): éé") and len(lines[0]) < 600
    assert lines[1].startswith("also rank 1 (local 1): éé") and len(lines[1]) < 230
    shown = [line for line in lines if line.startswith("also rank ")]
    assert f"{pod_contract.ALSO_FAILED}s: {39 - len(shown)} more" in lines
    assert message.endswith("end")  # the traceback's last line
    path = tmp_path / "junk.json"
    for junk in (
        b"not json",
        b"[1, 2]",
        b'{"failures": 3}',
        b'{"failures": [{"rank": "0"}]}',
        b'{"agent": {"message": " "}}',
        b"\xff\xfe",
    ):
        path.write_bytes(junk)
        assert root_cause_message(str(path)) is None, junk
    big = {**huge, "traceback": "y" * (2 << 20)}
    assert root_cause_message(_written(path, {"failures": [big]})) is None  # over 1 MiB: cut, not JSON
    assert root_cause_message(str(tmp_path / "absent.json")) is None
    # a rank that exited without a recorded exception: its exit code
    bare = {**huge, "message": "", "traceback": ""}
    assert root_cause_message(_written(path, {"failures": [bare]})) == f"{RC} rank 0 (local 0): exit 1"


def test_only_an_identifier_after_the_exit_code_comes_from_the_root_cause_line():
    """A tenant's line cannot make a reason that means a node fault (reliability.node_fault reads
    NODE_GONE reasons) nor a long one; text after the first line is not the root cause."""
    for text, reason in [
        (f"{RC} rank 0 (local 0): ValueError: boom", "exit 1: ValueError"),
        (f"{RC} DeletionByPodGC (exit 1)", "exit 1: DeletionByPodGC"),
        (f"{RC} " + "A" * 300, "exit 1"),
        (f"{RC} 1nvalid", "exit 1"),
        (f"{RC} Ünicode", "exit 1"),
        (f"log line\n{RC} ValueError: only at the start", "exit 1"),
    ]:
        assert podfailure.classify(1, "Error", text) == reason, text
        assert not reliability.node_fault({"reason": podfailure.classify(1, "Error", text)})
    own = {"node": "a", "message": f"{RC} rank 1 (local 1): ValueError: boom\nalso rank 0 (local 0): Connection reset"}
    lost = {"node": "b", "message": "gloo: Connection reset by peer"}
    assert podfailure.culprits([lost, own]) == [own]
