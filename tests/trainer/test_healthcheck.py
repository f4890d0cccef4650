"""The preflight health check: verdict logic on its own, then real torchrun/gloo runs on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest
from llmtrain_devcluster.process import free_port

from llmtrain_trainer.healthcheck import RankResult, judge, link_schedule, main


def ranks(links: list[float], **problems: str) -> list[RankResult]:
    return [RankResult(rank=i, node=i, host=f"node-{i}", devices_ok=True, compute_ok=True, memory_ok=True,
                       link_gbps=gbps, problems=[problems[f"r{i}"]] if f"r{i}" in problems else [])
            for i, gbps in enumerate(links)]


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
    assert verdict["suspectNodes"] == [{"node": 2, "host": "node-2"}]


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
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
           f"--rdzv-endpoint=127.0.0.1:{free_port()}", f"--rdzv-id=hc-{uuid.uuid4().hex[:8]}",
           "--max-restarts=0", "-m", "llmtrain_trainer", "healthcheck", "--size-mib", "2", "--iters", "4",
           "--memory-mib", "16", "--report", str(report)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert report.exists(), f"no report (rc {proc.returncode}); stderr:\n{proc.stderr[-4000:]}"
    verdict = json.loads(report.read_text())
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == verdict  # the same line on stdout
    return proc.returncode, verdict


@pytest.mark.trainer
def test_healthy_ranks_pass_with_a_measured_bus_bandwidth(tmp_path):
    rc, v = healthcheck(3, tmp_path)
    assert rc == 0 and v["healthy"] is True, v
    assert v["worldSize"] == 3 and v["busBandwidthGBps"] > 0
    assert all(gbps > 0 for gbps in v["linkGBps"].values())


@pytest.mark.trainer
def test_a_slow_rank_is_named_and_the_run_exits_unhealthy(tmp_path):
    # Rank 1's transfers take 20x as long: both of its links are slow, its neighbours' other links not.
    rc, v = healthcheck(4, tmp_path, fault="slow=1:20")
    assert rc != 0 and v["healthy"] is False, v  # workers exit EXIT_UNHEALTHY; torchrun then exits 1
    assert list(v["suspectRanks"]) == ["1"], v


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
