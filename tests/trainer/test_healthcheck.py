"""The preflight health check: verdict logic on its own, then real torchrun/gloo runs on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from llmtrain_devcluster.process import free_port
from llmtrain_trainer.distributed.healthcheck import RankResult, judge, link_schedule, main


def ranks(links: list[float], **problems: str) -> list[RankResult]:
    return [
        RankResult(
            rank=i,
            node=i,
            host=f"node-{i}",
            devices_ok=True,
            compute_ok=True,
            memory_ok=True,
            link_gbps=gbps,
            problems=[problems[f"r{i}"]] if f"r{i}" in problems else [],
        )
        for i, gbps in enumerate(links)
    ]


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_link_schedule_times_every_link_once_and_no_rank_twice_per_phase(n):
    phases = link_schedule(n)
    links = [lk for p in phases for lk in p]
    expected = {(0, 1)} if n == 2 else {(i, (i + 1) % n) for i in range(n)}
    assert set(links) == expected and len(links) == len(expected)
    for phase in phases:
        members = [r for lk in phase for r in lk]
        assert len(members) == len(set(members))


def test_slow_rank_is_the_one_with_both_links_slow():
    # Rank 2 is slow: links (1,2) [measured by rank 1] and (2,3) [by rank 2] are slow.
    verdict = judge(ranks([10.0, 1.0, 1.0, 10.0, 10.0]), busbw=5.0, expected_busbw=None, min_fraction=0.5)
    assert verdict["healthy"] is False
    assert list(verdict["suspectRanks"]) == ["2"]
    assert verdict["suspectNodes"] == [{"node": 2, "host": "node-2", "problem": verdict["suspectRanks"]["2"][0]}]


@pytest.mark.parametrize("n", [3, 4, 5, 8])
def test_a_rank_at_40_percent_of_the_others_is_slow_at_every_world_size(n):
    """Its own two links are left out of its yardstick. With the median over every link, a slow rank
    at 3 ranks was measured against its own speed (never below half of it), and at 4 against the
    mean of one of its links and a healthy one (so 40% passed as healthy)."""
    links = [1.0] * n
    links[0] = links[1] = 0.4  # rank 1: links (0, 1) and (1, 2)
    verdict = judge(ranks(links), busbw=5.0, expected_busbw=None, min_fraction=0.5)
    assert verdict["healthy"] is False and list(verdict["suspectRanks"]) == ["1"], verdict
    links[0] = links[1] = 0.6  # above half: not slow
    assert judge(ranks(links), busbw=5.0, expected_busbw=None, min_fraction=0.5)["healthy"] is True


def test_uniform_links_are_healthy_and_two_ranks_have_no_relative_verdict():
    assert judge(ranks([9.0, 10.0, 11.0]), 5.0, None, 0.5)["healthy"] is True
    assert judge(ranks([0.1, 10.0]), 5.0, None, 0.5)["healthy"] is True


def test_device_problem_and_low_bus_bandwidth_are_unhealthy():
    v = judge(ranks([10.0, 10.0, 10.0], r1="2 GPU(s) visible, 8 expected"), 5.0, None, 0.5)
    assert v["suspectRanks"] == {"1": ["2 GPU(s) visible, 8 expected"]}
    # p5: 3200 Gbit/s of EFA = 400 GB/s; 150 GB/s is below half of it.
    v = judge(ranks([10.0, 10.0, 10.0]), busbw=150.0, expected_busbw=400.0, min_fraction=0.5)
    assert v["degraded"] is True and v["healthy"] is False and v["suspectRanks"] == {}


def healthcheck(nproc: int, tmp_path, fault: str | None = None) -> tuple[int, dict]:
    report = tmp_path / f"report-{uuid.uuid4().hex[:6]}.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("LLMTRAIN_HEALTHCHECK_FAULT", None)
    if fault:
        env["LLMTRAIN_HEALTHCHECK_FAULT"] = fault
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        f"--rdzv-id=hc-{uuid.uuid4().hex[:8]}",
        "--max-restarts=0",
        "-m",
        "llmtrain_trainer",
        "healthcheck",
        "--size-mib",
        "2",
        "--iters",
        "4",
        "--memory-mib",
        "16",
        "--report",
        str(report),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert report.exists(), f"no report (rc {proc.returncode}); stderr:\n{proc.stderr[-4000:]}"
    verdict = json.loads(report.read_text())
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == verdict  # the same line on stdout
    return proc.returncode, verdict


@pytest.mark.slow  # a multi-process run: more than 5 s
@pytest.mark.trainer
def test_healthy_ranks_pass_with_a_measured_bus_bandwidth(tmp_path):
    rc, v = healthcheck(3, tmp_path)
    assert rc == 0 and v["healthy"] is True, v
    assert v["worldSize"] == 3 and v["busBandwidthGBps"] > 0
    assert all(gbps > 0 for gbps in v["linkGBps"].values())


@pytest.mark.slow  # a multi-process run: more than 5 s
@pytest.mark.trainer
def test_a_slow_rank_is_named_and_the_run_exits_unhealthy(tmp_path):
    # Rank 1's transfers take 20x as long: both of its links are slow, its neighbours' other links not.
    rc, v = healthcheck(4, tmp_path, fault="slow=1:20")
    assert rc != 0 and v["healthy"] is False, v  # workers exit EXIT_UNHEALTHY; torchrun then exits 1
    assert list(v["suspectRanks"]) == ["1"], v


@pytest.mark.slow  # a multi-process run: more than 5 s
@pytest.mark.trainer
def test_a_failed_device_check_is_named(tmp_path):
    rc, v = healthcheck(2, tmp_path, fault="gpu=1")
    assert rc != 0 and v["healthy"] is False
    assert v["suspectRanks"] == {"1": ["device check failed (injected fault)"]}


def test_bad_threshold_is_refused_with_the_accepted_range(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--min-fraction", "1.5"])
    assert exc.value.code == 2
    assert "--min-fraction must be in (0, 1], got 1.5" in capsys.readouterr().err


# --- the preflight round of llmtrain_trainer.launch (LLMTRAIN_PREFLIGHT=1) ------------------------


def test_preflight_args_reuse_torchrun_with_an_own_rendezvous_and_the_healthcheck():
    from llmtrain_trainer.launch import preflight_args

    args = [
        "--nnodes=2:2",
        "--nproc-per-node=8",
        "--rdzv-backend=etcd-v2",
        "--rdzv-endpoint=etcd:2379",
        "--rdzv-id=ns-job-abcd1234-a3",
        "--max-restarts=3",
        "-m",
        "llmtrain_trainer",
        "--spec",
        "x.json",
    ]
    assert preflight_args(args, "/tmp/r.json", ["--iters", "3"]) == [
        "--nnodes=2:2",
        "--nproc-per-node=8",
        "--rdzv-backend=etcd-v2",
        "--rdzv-endpoint=etcd:2379",
        "--rdzv-id=ns-job-abcd1234-a3-preflight",
        "--max-restarts=0",
        "-m",
        "llmtrain_trainer",
        "healthcheck",
        "--report",
        "/tmp/r.json",
        "--iters",
        "3",
    ]
    assert preflight_args(["--rdzv-id", "x", "-m", "m"], "r")[:1] == ["--rdzv-id=x-preflight"]
    # the check never restarts in place (spec.resilience.inPlaceRestarts is the training's)
    assert preflight_args(["--max-restarts", "2", "-m", "m"], "r")[:1] == ["--max-restarts=0"]
    with pytest.raises(ValueError, match="no -m MODULE"):
        preflight_args(["--nnodes=1"], "r")


def test_preflight_exit_code_has_one_definition_that_both_sides_import():
    """The launcher (trainer image) and the operator take the code from llmtrain.pod_contract, the
    pod contract both packages import: no second literal to drift from the first."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    defined_in = []
    for path in sorted(
        [*(root / "operator" / "llmtrain").rglob("*.py"), *(root / "trainer" / "llmtrain_trainer").rglob("*.py")]
    ):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            if any(isinstance(t, ast.Name) and t.id == "PREFLIGHT_EXIT_CODE" for t in targets):
                defined_in.append(str(path.relative_to(root)))
    assert defined_in == ["operator/llmtrain/pod_contract.py"]
    from llmtrain.controller.policy import podfailure
    from llmtrain.pod_contract import PREFLIGHT_EXIT_CODE

    assert podfailure.PREFLIGHT_EXIT_CODE is PREFLIGHT_EXIT_CODE


def test_termination_message_fits_the_kubelet_limit_and_keeps_the_suspects():
    from llmtrain_trainer.distributed.healthcheck import termination_message

    verdict = judge(ranks([10.0] * 200 + [1.0, 1.0] + [10.0] * 54), 5.0, None, 0.5)
    verdict["suspectRanks"].update({str(i): ["x" * 100] for i in range(60)})  # a very sick gang
    text = termination_message(verdict)
    assert len(text.encode()) <= 4096
    short = json.loads(text)
    assert short["event"] == "healthcheck" and short["healthy"] is False and "linkGBps" not in short
    assert {"node": 201, "host": "node-201", "problem": verdict["suspectNodes"][-1]["problem"]} in short["suspectNodes"]


def launch(tmp_path, nproc: int, fault: str | None, spec: str):
    """`python -m llmtrain_trainer.launch` as the pod runs it, preflight on, on CPU with gloo."""
    term = tmp_path / "termination-log"
    term.write_text("")
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        LLMTRAIN_PREFLIGHT="1",
        LLMTRAIN_TERMINATION_LOG=str(term),
        LLMTRAIN_NODE_NAME="kwok-p5-48xlarge-7",
        LLMTRAIN_PREFLIGHT_ARGS="--size-mib 2 --iters 4 --memory-mib 16",
    )
    env.pop("LLMTRAIN_HEALTHCHECK_FAULT", None)
    env.pop("LLMTRAIN_SPEC", None)
    if fault:
        env["LLMTRAIN_HEALTHCHECK_FAULT"] = fault
    cmd = [
        sys.executable,
        "-m",
        "llmtrain_trainer.launch",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        f"--rdzv-id=job-{uuid.uuid4().hex[:8]}-a1",
        "--max-restarts=0",
        "-m",
        "llmtrain_trainer",
        "--spec",
        spec,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    return proc, term.read_text()


@pytest.mark.trainer
@pytest.mark.slow
def test_launch_preflight_with_a_slow_rank_exits_distinctly_and_never_trains(tmp_path):
    from llmtrain.controller.policy.preflight import preflight_verdict, suspect_failures
    from llmtrain.pod_contract import PREFLIGHT_EXIT_CODE

    missing = tmp_path / "never-read-spec.yaml"  # training would fail on it (exit 1), not exit 86
    proc, term = launch(tmp_path, 4, "slow=1:20", str(missing))
    assert proc.returncode == PREFLIGHT_EXIT_CODE, proc.stderr[-3000:]
    assert "preflight health check failed, not training" in proc.stderr
    assert "never-read-spec" not in proc.stderr  # the trainer never started
    verdict = json.loads(term)
    assert verdict["healthy"] is False and list(verdict["suspectRanks"]) == ["1"], verdict
    assert verdict["busBandwidthGBps"] > 0
    assert verdict["suspectNodes"][0]["nodeName"] == "kwok-p5-48xlarge-7"
    # ... and the operator reads exactly this message as a failed preflight naming that node
    seen = [{"pod": "p", "node": "kwok-p5-48xlarge-7", "exitCode": proc.returncode, "message": term}]
    assert [f["node"] for f in suspect_failures(preflight_verdict(seen), seen, {"kwok-p5-48xlarge-7"})] == [
        "kwok-p5-48xlarge-7"
    ]


@pytest.mark.trainer
@pytest.mark.slow
def test_launch_preflight_that_passes_goes_on_to_train(tmp_path):
    from llmtrain.pod_contract import ROOT_CAUSE

    missing = tmp_path / "the-training-spec.yaml"
    proc, term = launch(tmp_path, 2, None, str(missing))
    assert "preflight health check passed" in proc.stderr, proc.stderr[-3000:]
    # training started after it: the trainer itself read --spec (and, as it is missing, failed)
    assert proc.returncode == 1 and "the-training-spec" in proc.stderr
    # a passing check leaves no verdict behind as the pod's termination message: the message is
    # the training's root cause (llmtrain_trainer.launch)
    assert term.startswith(f"{ROOT_CAUSE} rank ") and "the-training-spec" in term.splitlines()[0], term
    assert '"healthcheck"' not in term
