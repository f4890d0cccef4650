"""`llmtrain local` restarts a failed worker process in place as the pods do: torchrun's
`--max-restarts` is the spec's `resilience.inPlaceRestarts` (it was always 0), with the pods' TCPStore
per rendezvous round and a staging directory for the attempt's ledger. Cheap: the command is built,
not run (tests/trainer/test_trainer_local.py runs `llmtrain local` end to end)."""

from __future__ import annotations

import io

import pytest
import yaml

from conftest import base_spec

pytestmark = pytest.mark.trainer


def _job_file(tmp_path, **over) -> str:
    job = tmp_path / "job.yaml"
    doc = {"apiVersion": "llmtrain.dev/v1alpha1", "kind": "LLMTrainingJob", "metadata": {"name": "j"}}
    job.write_text(yaml.safe_dump({**doc, "spec": base_spec(**over)}))
    return str(job)


def _launched(tmp_path, monkeypatch, file: str, **kw) -> tuple[list[str], dict]:
    """The torchrun command and environment `run_local` starts (its supervisor is not run)."""
    from llmtrain_trainer.cli import local

    seen: dict = {}

    def supervise(cmd, env, work, max_steps, quiet):
        seen.update(cmd=cmd, env=env)
        return 0

    monkeypatch.setattr(local, "_supervise", supervise)
    assert local.run_local(file, workdir=str(tmp_path / "work"), quiet=True, **kw) == 0
    return seen["cmd"], seen["env"]


def _max_restarts(args: list[str]) -> list[str]:
    return [a for a in args if a.startswith("--max-restarts")]


def test_local_torchrun_restarts_in_place_as_the_spec_says(tmp_path, monkeypatch):
    from llmtrain.backends.pytorchjob import render_pytorchjob
    from llmtrain.spec import DEFAULT_IN_PLACE_RESTARTS, LLMTrainingJobSpec

    cmd, env = _launched(tmp_path, monkeypatch, _job_file(tmp_path))
    assert _max_restarts(cmd) == [f"--max-restarts={DEFAULT_IN_PLACE_RESTARTS}"]
    # the pods' torchrun for the same spec says the same
    ptj = render_pytorchjob(LLMTrainingJobSpec.model_validate(base_spec()), "j")
    (container,) = ptj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    assert _max_restarts(container["args"]) == _max_restarts(cmd)
    # what an in-place restart needs on this machine as on a pod: a TCPStore per rendezvous round
    # (llmtrain_trainer.launch) and a staging directory that outlives the worker processes
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert env["LLMTRAIN_CHECKPOINT_STAGING"] == str(tmp_path / "work" / "staging")

    cmd, _ = _launched(tmp_path, monkeypatch, _job_file(tmp_path, **{"resilience.inPlaceRestarts": 2}))
    assert _max_restarts(cmd) == ["--max-restarts=2"]
    cmd, _ = _launched(tmp_path, monkeypatch, _job_file(tmp_path), in_place_restarts=0)
    assert _max_restarts(cmd) == ["--max-restarts=0"]


def test_local_in_place_restarts_option_is_bounded_like_the_spec(capsys, tmp_path):
    from llmtrain.cli import main
    from llmtrain.spec import MAX_IN_PLACE_RESTARTS

    with pytest.raises(SystemExit) as exit_:
        main(["local", _job_file(tmp_path), "--in-place-restarts", str(MAX_IN_PLACE_RESTARTS + 1)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--in-place-restarts" in err and "inPlaceRestarts" in err and f"0..{MAX_IN_PLACE_RESTARTS}" in err


def test_local_progress_reports_each_in_place_restart(capsys):
    from llmtrain_trainer.cli.local import _Progress

    p = _Progress(10, quiet=False)
    log = io.StringIO()
    for e in ('{"event": "config", "in_place_restarts": 0}', '{"event": "config", "in_place_restarts": 1}'):
        p.line(e, log)
    out = capsys.readouterr().out
    assert out.count("restarted in place") == 1 and "(1 so far)" in out
    assert "in-place restarts 1" in p.summary(1.0, 0)
    assert "in-place restarts" not in _Progress(10, quiet=True).summary(1.0, 0)
