"""bench/operator_scale.py --peer (bench/trainer_peer.py): llmtrain on its two backends (JobSet,
PyTorchJob) against Kubeflow Trainer v2.

The TrainJob's runtime runs exactly the pod llmtrain renders, the phase order favours no path and
a bad ``--paths`` is refused naming the flag (always checked). The smoke run (``--peer --quick``:
one phase of each path, 3 jobs on 4 simulated p5 nodes, under a minute) needs the Trainer
controller (and the chain's JobSet), so it is marked ``peer``: ``make test-peer`` builds it and
runs it."""

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


def test_phase_order_alternates_so_every_path_sits_at_the_same_mean_position():
    from trainer_peer import phase_order

    paths = ["a", "b", "c"]
    assert phase_order(paths, 1) == ["a", "b", "c"]
    assert phase_order(paths, 2) == ["a", "b", "c", "c", "b", "a"]
    for repeat in (2, 4, 6):
        order = phase_order(paths, repeat)
        assert sorted(order) == sorted(paths * repeat)
        mean = {p: sum(i for i, q in enumerate(order) if q == p) / repeat for p in paths}
        assert len(set(mean.values())) == 1, (repeat, mean)
    # the rotation changes which path leads once the mirrored pair is done
    assert phase_order(paths, 3)[6] == "b"


def test_a_bad_paths_flag_is_refused_naming_it_and_what_is_accepted():
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "operator_scale.py"), "--peer", "--nodes", "4", "--paths", "jobset"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 2
    assert "--paths 'jobset': 'jobset' is not a path" in proc.stderr
    assert "llmtrain-jobset, llmtrain-pytorchjob, llmtrain-job, trainer" in proc.stderr


def test_the_targets_compare_llmtrain_on_jobset_with_the_right_path_and_direction():
    from trainer_peer import targets

    summary = {
        "create→all Running p99 (s)": {"llmtrain-jobset": 10.0, "trainer": 12.0},
        "jobs/s to the last all-Running": {"llmtrain-jobset": 3.0, "trainer": 4.0},
        "llmtrain operator CPU per job above idle (ms)": {"llmtrain-jobset": 31.0, "llmtrain-pytorchjob": 30.0},
    }
    got = {t["figure"]: t for t in targets(summary)}
    assert got["create→all Running p99 (s)"]["verdict"] == "PASS"  # lower latency than Trainer v2
    assert got["jobs/s to the last all-Running"]["verdict"] == "FAIL"  # fewer jobs/s than Trainer v2
    cpu = got["llmtrain operator CPU per job above idle (ms)"]
    assert cpu["verdict"] == "FAIL" and cpu["llmtrain-pytorchjob"] == 30.0  # against PyTorchJob, not Trainer
    # a run without Trainer v2 has no verdict against it
    assert [t["figure"] for t in targets({k: {"llmtrain-jobset": 1.0} for k in summary})] == []


def test_objects_made_are_counted_per_bucket_from_the_first_child():
    from trainer_peer import made_per_bucket

    made = {
        "child": ["2026-12-04T07:00:02Z", "2026-12-04T07:00:00Z", "2026-12-04T07:00:04Z"],
        "jobs": ["2026-12-04T07:00:01Z", "2026-12-04T07:00:27Z", "2026-12-04T07:00:29Z", "2026-12-04T07:00:30Z"],
        "pods": [],
    }
    # 07:00:00 is second 0: 0-4 in bucket 0, 25-29 in 25, 30 in 30; a kind with none has no bucket
    assert made_per_bucket(made, 5) == {
        "child": {"0": 3},
        "jobs": {"0": 1, "25": 2, "30": 1},
        "pods": {},
    }
    assert made_per_bucket({"child": []}, 5) == {}


def test_control_plane_nice_reaches_every_thread_of_the_process():
    # Linux nice values are per thread: renicing only the pid would leave a Go process's other
    # threads (where its work runs) as they were.
    import time

    from trainer_peer import renice

    threads = "import threading, time; [threading.Thread(target=time.sleep, args=(60,)).start() for _ in range(3)]"
    proc = subprocess.Popen([sys.executable, "-c", threads + "; time.sleep(60)"])
    try:
        tasks = Path(f"/proc/{proc.pid}/task")
        deadline = time.monotonic() + 30
        while len(list(tasks.iterdir())) < 4:  # the main thread and its three
            assert time.monotonic() < deadline, "threads never started"
            time.sleep(0.01)
        changed = renice({"p": proc.pid}, 3)
        nices = [int((t / "stat").read_text().rsplit(")", 1)[1].split()[16]) for t in tasks.iterdir()]
        assert changed["p"] == len(nices) >= 4 and set(nices) == {3}
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.peer
@pytest.mark.slow
def test_peer_quick_smoke(own_clusters):
    from llmtrain_devcluster.trainer_v2 import peer_tools_dir

    peer_tools_dir()  # built by `make test-peer`; missing is an error, never a skip
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "operator_scale.py"), "--peer", "--quick"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    assert [p["kind"] for p in out["phases"]] == ["llmtrain-jobset", "llmtrain-pytorchjob", "llmtrain-job", "trainer"]
    for p in out["phases"]:
        assert p["reached_running"] == 3 and p["lost"] == 0 and p["duplicated"] == 0, p
        # kwok leaves every path's training pods Running (JobSet's are Job-owned): like for like
        assert p["pods_ended"] == 0, p
        assert p["cpu_ms_per_job"]["kube-apiserver"] > 0
        # the CPU window ran on past the last pod Running (the Running statuses written after the
        # pods run fall in it), until the writes stopped or for at most --settle (20 s here)
        assert p["phase_s"] + 5 <= p["cpu_window_s"] < p["phase_s"] + 25, p
    s = out["summary"]
    assert s["jobs/s to the last first child"]["llmtrain-jobset / trainer"] > 0
    assert s["jobs/s to the last first child"]["llmtrain-jobset / llmtrain-pytorchjob"] > 0
    assert s["jobs/s to the last first child"]["llmtrain-job / llmtrain-jobset"] > 0
    # Each path's own chain of stages, every stage seen for every job: the JobSet paths pass
    # through batch Jobs, the PyTorchJob and job paths straight to pods (the training-operator v1,
    # the Job controller).
    for kind, hops in (
        ("llmtrain-jobset", 5),
        ("trainer", 5),
        ("llmtrain-pytorchjob", 4),
        ("llmtrain-job", 4),
    ):
        stages = s["stages_s"][kind]
        assert len(stages) == hops and all(v["p50"] >= 0 for v in stages.values()), (kind, stages)
        assert (hops == 4) != ("child_created→jobs_created" in stages), stages
    # The operator's CPU is the llmtrain paths' (and only theirs)
    cpu = s["llmtrain operator CPU per job above idle (ms)"]
    assert set(cpu) >= {"llmtrain-jobset", "llmtrain-pytorchjob", "llmtrain-job"} and "trainer" not in cpu, cpu
    assert [t["verdict"] in ("PASS", "FAIL") for t in s["targets"]] == [True] * 3, s["targets"]
    assert s["peak_rss_mib"]["trainer"]["trainer-controller-manager"] > 0
    assert s["peak_rss_mib"]["llmtrain-jobset"]["llmtrain-operator"] > 0
