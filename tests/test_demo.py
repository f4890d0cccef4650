"""`make demo`, the README's first command, end to end: its own dev cluster (a separate state dir,
free ports), the chart, the operator with the release's RBAC, a real CPU training run whose
progress reaches the job's status. Torn down afterwards."""

import shutil
import subprocess

import pytest

STATE = ".dev-cluster-demo-test"

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.trainer]


def test_make_demo_runs_the_whole_path():
    env_args = [f"DEV_CLUSTER_STATE={STATE}"]
    try:
        run = subprocess.run(["make", "--no-print-directory", "demo", *env_args],
                             capture_output=True, text=True, timeout=600)
        out = run.stdout + run.stderr
        assert run.returncode == 0, out[-4000:]
        assert "rdzvId: demo-tiny-cpu-" in out  # the rendered PyTorchJob was shown
        final = out.split("final status")[1]
        row = next(line for line in final.splitlines() if line.startswith("tiny-cpu"))
        cols = row.split()
        assert cols[1] == "Succeeded" and int(cols[5]) > 0  # phase, and a step scraped from the trainer
        assert "exit code        0" in out  # llmtrain local's summary
    finally:
        down = subprocess.run(["make", "--no-print-directory", "dev-cluster-down", *env_args],
                              capture_output=True, text=True, timeout=120)
        assert down.returncode == 0, down.stderr
        shutil.rmtree(STATE, ignore_errors=True)
