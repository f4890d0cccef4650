"""Loss-spike rollback on the real trainer (2 processes, gloo): LLMTRAIN_RESUME_BEFORE_STEP=S makes
an attempt resume from the newest complete checkpoint before step S, with the checkpoints from S on
moved to quarantine/ and kept there (retention never sees them)."""

from __future__ import annotations

import pytest
import torch
from test_trainer_distributed import assert_matches_reference
from trainer_reference import reference_losses

from conftest import STEPS, base_spec

pytestmark = pytest.mark.trainer


@pytest.mark.slow
def test_resume_before_step_rolls_back_and_quarantines_the_later_checkpoints(corpus, launch, tmp_path):
    ckpt = tmp_path / "ckpt"
    # Constant LR: a resumed run follows the same trajectory as one uninterrupted run.
    spec = base_spec(
        **{
            "data.uri": corpus,
            "checkpoint.uri": str(ckpt),
            "checkpoint.intervalSteps": 2,
            "checkpoint.keep": STEPS,
            "training.lrSchedule": "constant",
            "training.warmupSteps": 0,
            "training.learningRate": 0.005,
        }
    )
    first = launch(spec, name="first")
    assert first.wait(180) == 0, first.stderr()
    assert sorted(p.name for p in ckpt.glob("step-*")) == [f"step-{s:010d}" for s in (2, 4, 6, 8)]
    spiked = {p.name: (p / ".metadata").read_bytes() for p in ckpt.glob("step-*")}

    # The operator saw a spike at step 5: the next attempt resumes before it. keep 2 on the second
    # run: retention then prunes the top level, and must leave the quarantined checkpoints alone.
    second_spec = base_spec(
        **{
            "data.uri": corpus,
            "checkpoint.uri": str(ckpt),
            "checkpoint.intervalSteps": 2,
            "checkpoint.keep": 2,
            "training.lrSchedule": "constant",
            "training.warmupSteps": 0,
            "training.learningRate": 0.005,
        }
    )
    second = launch(second_spec, name="second", env={"LLMTRAIN_RESUME_BEFORE_STEP": "5", "LLMTRAIN_ATTEMPT": "2"})
    assert second.wait(180) == 0, second.stderr()
    rollback = second.of("rollback")
    assert rollback and rollback[0]["before_step"] == 5
    assert sorted(rollback[0]["quarantined"]) == [str(ckpt / "quarantine" / f"step-{s:010d}") for s in (6, 8)]
    assert second.of("resume")[0]["step"] == 4  # the newest checkpoint before step 5
    # No lost or repeated step relative to that checkpoint, and the same trajectory as one run.
    assert sorted(second.losses()) == list(range(5, STEPS + 1))
    assert_matches_reference(second.losses(), reference_losses(spec))
    # The spiking checkpoints are still there, byte for byte, for inspection...
    for s in (6, 8):
        kept = ckpt / "quarantine" / f"step-{s:010d}"
        assert (kept / ".metadata").read_bytes() == spiked[f"step-{s:010d}"]
        assert sorted(p.name for p in kept.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    # ...and the new attempt wrote those step numbers afresh; retention pruned only the top level.
    assert sorted(p.name for p in ckpt.glob("step-*")) == [f"step-{s:010d}" for s in (6, 8)]


def _state(value: float) -> dict:
    return {"model": {"w": torch.full((16,), value)}, "train": {"step": int(value)}}


@pytest.mark.parametrize("where", ["local", "s3"])
def test_quarantine_sets_aside_every_checkpoint_from_the_step_on_and_retention_ignores_it(
    where, tmp_path, one_process_group, request
):
    from llmtrain_trainer.checkpoint.checkpointer import Checkpointer
    from llmtrain_trainer.job_config import CheckpointConfig

    if where == "s3":
        import boto3

        request.getfixturevalue("s3")
        boto3.client("s3").create_bucket(Bucket="roll")
        uri = "s3://roll/run/"
    else:
        uri = str(tmp_path / "ckpt")

    def make(attempt: int, keep: int) -> Checkpointer:
        return Checkpointer(CheckpointConfig(uri, keep=keep, timeout_minutes=1, attempt=attempt))

    first = make(1, keep=5)
    for step in (2, 4, 6):
        first.save(step, _state(float(step)), blocking=True)
    first.close()
    second = make(2, keep=1)
    moved = second.quarantine_from(4)
    assert [m.rstrip("/").rsplit("/", 1)[-1] for m in moved] == ["step-0000000004", "step-0000000006"]
    assert all("/quarantine/" in m for m in moved)
    step, state = second.resume(lambda: _state(0.0))
    assert step == 2 and torch.equal(state["model"]["w"], torch.full((16,), 2.0))
    # The new attempt writes step 4 again; keep 1 prunes step 2 but never the quarantined ones.
    second.save(4, _state(44.0), blocking=True)
    assert second.complete_steps() == [4]
    again = second.quarantine_from(4)  # a second rollback over the same step: a new name, nothing lost
    assert again[0].rstrip("/").endswith("quarantine/step-0000000004.2")
    if where == "s3":
        import boto3

        keys = [
            o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket="roll", Prefix="run/quarantine/")["Contents"]
        ]
        for name in ("step-0000000004/a1/", "step-0000000006/a1/", "step-0000000004.2/a2/"):
            assert f"run/quarantine/{name}_COMPLETE" in keys and f"run/quarantine/{name}.metadata" in keys
    else:
        q = tmp_path / "ckpt" / "quarantine"
        assert sorted(p.name for p in q.iterdir()) == ["step-0000000004", "step-0000000004.2", "step-0000000006"]
        assert all((q / n / ".metadata").exists() for n in ("step-0000000004", "step-0000000006"))
    second.close()


@pytest.mark.slow
def test_a_diverging_run_never_checkpoints_a_nan_state(corpus, launch, tmp_path):
    """fp16 at learning rate 1 without clipping overflows on CPU: the loss turns NaN after a few
    steps and stays NaN (the weights are NaN from then on). Which step is first varies from run to
    run (step 7 and step 9 were both seen: CPU reductions are not bit-reproducible under load), so
    the test reads it from the run. The checkpoints every 2 steps stop before it, and there is no
    final one, so the newest checkpoint is always one a NaN rollback can use."""
    ckpt = tmp_path / "ckpt"
    max_steps = 16
    spec = base_spec(
        **{
            "data.uri": corpus,
            "checkpoint.uri": str(ckpt),
            "checkpoint.intervalSteps": 2,
            "checkpoint.keep": 20,
            "training.maxSteps": max_steps,
            "training.learningRate": 1.0,
            "training.gradClip": 0,
            "training.warmupSteps": 0,
            "training.lrSchedule": "constant",
            "fsdp.mixedPrecision": "fp16",
        }
    )
    w = launch(spec, name="diverge")
    assert w.wait(240) == 0, w.stderr()
    losses = w.losses()
    nan_steps = [s for s, loss in losses.items() if loss != loss]
    assert nan_steps, f"the run did not diverge, so it shows nothing: {losses}"
    first_nan = min(nan_steps)
    assert first_nan > 2 and all(losses[s] != losses[s] for s in range(first_nan, max_steps + 1)), losses
    good = list(range(2, first_nan, 2))
    assert sorted(p.name for p in ckpt.glob("step-*")) == [f"step-{s:010d}" for s in good], losses
    assert w.of("end")[0]["last_checkpoint"] == good[-1]
    assert f"the loss of the final step {max_steps} is not finite: no final checkpoint" in w.stderr()
