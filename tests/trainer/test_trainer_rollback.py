"""Loss-spike rollback on the real trainer (2 processes, gloo): LLMTRAIN_RESUME_BEFORE_STEP=S makes
an attempt resume from the newest complete checkpoint before step S, with the checkpoints from S on
moved to quarantine/ and kept there (retention never sees them)."""

from __future__ import annotations

import pytest
from conftest import STEPS, base_spec
from test_trainer_distributed import assert_matches_reference
from trainer_reference import reference_losses

pytestmark = [pytest.mark.trainer, pytest.mark.slow]


def test_resume_before_step_rolls_back_and_quarantines_the_later_checkpoints(corpus, launch, tmp_path):
    ckpt = tmp_path / "ckpt"
    # Constant LR: a resumed run follows the same trajectory as one uninterrupted run.
    spec = base_spec(**{"data.uri": corpus, "checkpoint.uri": str(ckpt), "checkpoint.intervalSteps": 2,
                        "checkpoint.keep": STEPS, "training.lrSchedule": "constant",
                        "training.warmupSteps": 0, "training.learningRate": 0.005})
    first = launch(spec, name="first")
    assert first.wait(180) == 0, first.stderr()
    assert sorted(p.name for p in ckpt.glob("step-*")) == [f"step-{s:010d}" for s in (2, 4, 6, 8)]
    spiked = {p.name: (p / ".metadata").read_bytes() for p in ckpt.glob("step-*")}

    # The operator saw a spike at step 5: the next attempt resumes before it. keep 2 on the second
    # run: retention then prunes the top level, and must leave the quarantined checkpoints alone.
    second_spec = base_spec(**{"data.uri": corpus, "checkpoint.uri": str(ckpt), "checkpoint.intervalSteps": 2, "checkpoint.keep": 2,
                               "training.lrSchedule": "constant", "training.warmupSteps": 0,
                               "training.learningRate": 0.005})
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
