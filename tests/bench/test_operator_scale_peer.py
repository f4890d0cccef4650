"""bench/operator_scale.py --peer (bench/trainer_peer.py): llmtrain against Kubeflow Trainer v2.

The TrainJob's runtime runs exactly the pod llmtrain renders (always checked). The smoke run
(``--peer --quick``: one phase of each kind, 3 jobs on 4 simulated p5 nodes, about a minute) needs
the Trainer controller (and the chain's JobSet), so it is marked ``peer``: ``make test-peer`` builds it
and runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "bench")]


def test_the_trainjob_runtime_runs_the_pod_llmtrain_renders():
    from chainbench import job_spec
    from llmtrain.backends.pytorchjob import render_pytorchjob
    from llmtrain.render import JOB_LABEL
    from llmtrain.validation import parse_spec
    from trainer_peer import torch_runtime, trainjob

    ptj = render_pytorchjob(parse_spec(job_spec(nodes=1)), "job-1", "ns", 1, None, "etcd.bench.svc:2379")
    worker = ptj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    rt = torch_runtime(ptj)
    (rj,) = rt["spec"]["template"]["spec"]["replicatedJobs"]
    pod = rj["template"]["spec"]["template"]["spec"]
    (ours,) = worker["containers"]
    (theirs,) = pod["containers"]
    assert theirs["name"] == "node"  # what Trainer's torch plugin looks for
    for field in ("image", "command", "args", "resources", "env", "ports"):
        assert theirs.get(field) == ours.get(field), field
    for field in ("nodeSelector", "tolerations", "securityContext", "volumes", "terminationGracePeriodSeconds"):
        assert pod.get(field) == worker.get(field), field
    assert pod["restartPolicy"] == "Never" and rt["spec"]["mlPolicy"]["numNodes"] == 1
    # The training label (not the attempt's, which the operator's pod watches need too): kwok keeps
    # these pods Running as it keeps llmtrain's, instead of completing them at once.
    assert rj["template"]["spec"]["template"]["metadata"]["labels"] == {JOB_LABEL: "job-1"}
    assert trainjob("j")["spec"]["runtimeRef"]["name"] == rt["metadata"]["name"]


@pytest.mark.peer
@pytest.mark.slow
def test_peer_quick_smoke(own_clusters):
    from llmtrain_devcluster.trainer_v2 import peer_tools_dir

    peer_tools_dir()  # built by `make test-peer`; missing is an error, never a skip
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "operator_scale.py"), "--peer", "--quick"],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    assert [p["kind"] for p in out["phases"]] == ["llmtrain", "trainer"]
    for p in out["phases"]:
        assert p["reached_running"] == 3 and p["lost"] == 0 and p["duplicated"] == 0, p
        assert p["cpu_ms_per_job"]["kube-apiserver"] > 0
    s = out["summary"]
    assert s["jobs/s to the last first child"]["ratio"] > 0
    # The second row of each path: the training-operator v1 after llmtrain, JobSet after Trainer.
    assert all(v and v[0] > 0 for v in s["second_stage"].values()), s["second_stage"]
    assert s["peak_rss_mib"]["trainer-controller-manager"] > 0 and s["peak_rss_mib"]["llmtrain-operator"] > 0
