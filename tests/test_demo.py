"""`make demo`, the README's first command, end to end: its own dev cluster (a separate state dir,
free ports; chain mode: scheduler, kwok nodes, training-operator, JobSet), the chart, the operator
with the release's RBAC, two p5 jobs in one Kueue queue with quota for one, one per backend (Running
and Queued, then the second Running once the first finished, and both Succeeded), a real CPU
training run whose
progress reaches the job's status, and whose end (the trainer's final summary) is what the job
shows once Succeeded. Torn down afterwards."""

import re
import shutil
import subprocess

import pytest

STATE = ".dev-cluster-demo-test"

pytestmark = [pytest.mark.slow, pytest.mark.trainer]


def _columns(table: str, name: str) -> dict[str, str]:
    """The row of `name` in kubectl's table, header → value ("" where kubectl left it empty), each
    value read where its header starts."""
    lines = table.splitlines()
    header = next(line for line in lines if line.startswith("NAME "))
    row = next(line for line in lines if line.startswith(name + " "))
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    return {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)}


def test_make_demo_runs_the_whole_path(own_clusters):
    env_args = [f"DEV_CLUSTER_STATE={STATE}"]
    try:
        run = subprocess.run(
            ["make", "--no-print-directory", "demo", *env_args], capture_output=True, text=True, timeout=600
        )
        out = run.stdout + run.stderr
        assert run.returncode == 0, out[-4000:]
        assert "rdzvId: demo...tiny-cpu-" in out  # the rendered PyTorchJob was shown
        # Kueue, quota for one 2-node p5 job: the first job's two pods were scheduled onto the two
        # simulated p5.48xlarge nodes, Running, while the second waited Queued in Kueue's words...
        p5_rows = [line.split() for line in out.splitlines() if line.startswith("llama2-7b-p5-a1-worker-")][:2]
        assert len(p5_rows) == 2, out[-4000:]
        assert all(r[1] == "Running" and r[2].startswith("kwok-p5-48xlarge-") for r in p5_rows), p5_rows
        assert len({r[2] for r in p5_rows}) == 2, p5_rows
        queued = [line.split() for line in out.splitlines() if line.startswith("llama2-7b-p5-next ")]
        assert queued and queued[0][1] == "Pending" and "Queued" in queued[0], queued
        assert "insufficient unused quota" in out, out[-4000:]
        # ...and ran once the first finished: its pods on the same two nodes, the first's Succeeded
        second = [line.split() for line in out.splitlines() if line.startswith("llama2-7b-p5-next-a1-worker-")]
        assert len(second) == 2 and all(r[1] == "Running" for r in second), second
        assert {r[2] for r in second} == {r[2] for r in p5_rows}, (second, p5_rows)
        assert queued[-1][1] == "Running", queued
        # one job per backend, each to Succeeded: the first's attempt a PyTorchJob, the second's a JobSet
        rows = [r for r in (line.split() for line in out.splitlines()) if r[:1] in (["pytorchjob"], ["jobset"])]
        assert ["pytorchjob", "llama2-7b-p5", "llama2-7b-p5-a1", "Succeeded"] in rows, rows
        assert ["jobset", "llama2-7b-p5-next", "llama2-7b-p5-next-a1", "Succeeded"] in rows, rows
        final = out.split("final status")[1]
        row = _columns(final, "tiny-cpu")
        # Succeeded at the trainer's last step (examples/tiny-cpu.yaml: maxSteps 40), not the last
        # scrape's; MFU as llmtrain local's summary prints it (a percentage); no ETA left
        assert row["PHASE"] == "Succeeded" and row["STEP"] == "40", row
        assert "exit code        0" in out  # llmtrain local's summary
        mean_mfu = next(line for line in out.splitlines() if line.startswith("MFU (mean)")).split()[-1]
        assert row["MFU"] == mean_mfu and mean_mfu.endswith("%"), (row, mean_mfu)
        assert row["GOODPUT"].endswith("%") and row["ETA"] == "", row
    finally:
        down = subprocess.run(
            ["make", "--no-print-directory", "dev-cluster-down", *env_args], capture_output=True, text=True, timeout=120
        )
        assert down.returncode == 0, down.stderr
        shutil.rmtree(STATE, ignore_errors=True)
