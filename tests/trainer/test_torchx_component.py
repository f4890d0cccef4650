"""The torchx component (issue 10): an LLMTrainingJob file → torchx AppDef → the same trainer.
The unit part compares the AppDef with what the operator renders; the run part launches a real
2-process CPU job with `torchx run -s local_cwd` and checks it trained and checkpointed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llmtrain_devcluster.process import free_port

ROOT = Path(__file__).resolve().parents[2]
COMPONENT = ROOT / "trainer" / "llmtrain_trainer" / "cli" / "torchx_component.py"


def test_appdef_matches_what_the_operator_renders():
    from llmtrain.backends.pytorchjob import render_pytorchjob
    from llmtrain.validation import load_job
    from llmtrain_trainer.cli.torchx_component import llmtrain

    example = ROOT / "examples" / "llama2-7b-p5.yaml"
    app = llmtrain(str(example))
    (role,) = app.roles
    job = load_job(example)
    assert role.num_replicas == job.spec.cluster.nodes == 2
    assert role.resource.gpu == 8 and role.resource.devices["vpc.amazonaws.com/efa"] == 32
    assert role.image == job.spec.cluster.image
    assert "llmtrain_trainer" in " ".join(role.args) and "--nproc_per_node 8" in " ".join(role.args)
    pod_env = {
        e["name"]: e.get("value")
        for e in render_pytorchjob(job.spec, job.name, job.namespace, default_etcd_endpoint="e:2379")["spec"][
            "pytorchReplicaSpecs"
        ]["Worker"]["template"]["spec"]["containers"][0]["env"]
        if "value" in e
    }
    for key in ("LLMTRAIN_SPEC", "FI_PROVIDER", "LLMTRAIN_JOB_NAME", "TORCH_NCCL_ASYNC_ERROR_HANDLING"):
        assert role.env[key] == pod_env[key], key
    assert role.max_retries == 0


@pytest.mark.trainer
@pytest.mark.slow
def test_torchx_local_cwd_runs_the_trainer(tmp_path):
    ckpt = tmp_path / "ckpt"
    job = {
        "apiVersion": "llmtrain.dev/v1alpha1",
        "kind": "LLMTrainingJob",
        "metadata": {"name": "torchx-tiny"},
        "spec": {
            "model": {"preset": "tiny"},
            "data": {"seqLen": 64},
            "cluster": {"instanceType": "cpu", "processesPerNode": 2},
            "fsdp": {"mixedPrecision": "fp32", "activationCheckpointing": "none"},
            "training": {"maxSteps": 3},
            "checkpoint": {"uri": f"file://{ckpt}/", "intervalSteps": 3, "keep": 1},
            "rendezvous": {"backend": "c10d"},
        },
    }
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job))
    # The component's command is `torchrun ... -m llmtrain_trainer`: torchrun of this environment.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m torch.distributed.run "$@"\n')
    (bin_dir / "torchrun").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchx.cli.main",
            "run",
            "-s",
            "local_cwd",
            "--wait",
            "--log",
            f"{COMPONENT}:llmtrain",
            "--job_file",
            str(job_file),
            "--metrics_port",
            str(free_port()),
            "--rdzv_port",
            str(free_port()),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    assert "SUCCEEDED" in out, out[-3000:]
    steps = [
        json.loads(line[line.index("{") :])
        for line in out.splitlines()
        if '"step"' in line and "{" in line and line.rstrip().endswith("}")
    ]
    assert steps and max(s["step"] for s in steps) == 3, out[-3000:]
    assert any(ckpt.iterdir()), "no checkpoint written"
