"""`llmtrain local` end to end: a local etcd, torchrun workers, Ctrl-C → checkpoint, re-run → resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import yaml

from conftest import REPO, base_spec, free_port_block

pytestmark = [pytest.mark.trainer, pytest.mark.slow]


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        pids.append(int(d))
            except OSError:
                pass
    return pids


def test_local_sigterm_checkpoints_and_rerun_resumes(tmp_path, corpus):
    """SIGTERM (`kill`, a container stop) behaves as Ctrl-C does: the workers checkpoint and stop,
    `llmtrain local` exits 0 and leaves no torchrun behind."""
    spec = base_spec(
        **{
            "data.uri": f"file://{corpus}",
            "rendezvous.backend": "etcd-v2",
            "training.maxSteps": 40,
            "checkpoint.uri": f"file://{tmp_path}/ckpt",
            "checkpoint.intervalSteps": 1,
            "checkpoint.keep": 1,
        }
    )
    job = tmp_path / "job.yaml"
    job.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "llmtrain.dev/v1alpha1",
                "kind": "LLMTrainingJob",
                "metadata": {"name": "local-test"},
                "spec": spec,
            }
        )
    )
    cmd = [
        sys.executable,
        "-m",
        "llmtrain.cli",
        "local",
        str(job),
        "--workdir",
        str(tmp_path / "work"),
        "--metrics-port",
        str(free_port_block(2)),
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=open(tmp_path / "stderr", "w"), text=True, env=env, cwd=REPO
    )
    try:
        out = []
        for line in proc.stdout:
            out.append(line)
            if line.startswith("checkpoint step 2 "):
                proc.send_signal(signal.SIGTERM)
                break
        out += proc.stdout.readlines()
        assert proc.wait(120) == 0, "".join(out) + (tmp_path / "stderr").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = "".join(out)
    assert _processes_mentioning(str(tmp_path / "work" / "spec.json")) == []  # no orphaned torchrun/workers
    assert "rendezvous etcd-v2 at 127.0.0.1:" in text and "master_addr=" in text
    assert "stopping:" in text
    stopped_at = int(text.split("steps            0 → ")[1].split()[0])
    assert 2 <= stopped_at < 40
    assert f"step-{stopped_at:010d}" in text  # the stop wrote a checkpoint

    rerun = subprocess.run(
        cmd + ["--max-steps", str(stopped_at + 2)], capture_output=True, text=True, env=env, cwd=REPO, timeout=180
    )
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert f"resumed from checkpoint at step {stopped_at}" in rerun.stdout
    assert f"steps            {stopped_at} → {stopped_at + 2} of {stopped_at + 2}" in rerun.stdout
    # the clean end leaves what a pod's termination message would say (llmtrain/final_summary.py),
    # and the summary prints its MFU as the job's status shows it
    from llmtrain.final_summary import parse_summary
    from llmtrain.status import percent

    final = parse_summary((tmp_path / "work" / "final-summary").read_text())
    assert final is not None and final["llmtrain_trainer_step"] == stopped_at + 2
    assert f"MFU (mean)       {percent(final['llmtrain_trainer_mfu'])}\n" in rerun.stdout, rerun.stdout


def test_local_prints_the_workers_error(tmp_path):
    """Defect: a failing worker showed only "exit code 1"; now the error itself is printed."""
    spec = base_spec(**{"data.uri": f"file://{tmp_path}/no-such-data"})
    job = tmp_path / "job.yaml"
    job.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "llmtrain.dev/v1alpha1",
                "kind": "LLMTrainingJob",
                "metadata": {"name": "broken"},
                "spec": spec,
            }
        )
    )
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmtrain.cli",
            "local",
            str(job),
            "--workdir",
            str(tmp_path / "w"),
            "--metrics-port",
            str(free_port_block(2)),
            # the error is the same every time: restarting in place would only repeat it
            "--in-place-restarts",
            "0",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=180,
    )
    assert r.returncode != 0
    assert "error (rank 0): FileNotFoundError:" in r.stdout, r.stdout + r.stderr
    assert "no-such-data/index.json" in r.stdout
