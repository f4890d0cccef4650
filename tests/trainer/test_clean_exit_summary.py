"""A pod that exits 0 leaves the trainer's final summary as its termination message
(llmtrain/final_summary.py): the operator writes it into the job's status when the job succeeds,
instead of its last scrape of /metrics, which is up to one progress interval old by then."""

from __future__ import annotations

import pytest

from conftest import STEPS, base_spec, run_to_end
from llmtrain.controller.policy.child_status import pod_summary
from llmtrain.controller.policy.ending import summary_of
from llmtrain.final_summary import parse_summary
from llmtrain_devcluster.standins import exited

pytestmark = pytest.mark.trainer


def test_a_clean_exit_leaves_the_final_figures_as_the_termination_message(launch, tmp_path):
    """Before: a pod that exited 0 left no termination message at all."""
    term = tmp_path / "termination-log"
    spec = base_spec(**{"checkpoint.uri": f"file://{tmp_path}/ckpt"})
    w = run_to_end(launch(spec, 2, env={"LLMTRAIN_TERMINATION_LOG": str(term)}))
    values = parse_summary(term.read_text())
    assert values is not None, term.read_text()
    steps, (end,) = w.of("step"), w.of("end")
    last = steps[-1]
    assert values["llmtrain_trainer_step"] == last["step"] == STEPS
    assert values["llmtrain_trainer_loss"] == pytest.approx(last["loss"], abs=1e-6)
    # tokens/s: the steps after the first (warm-up), their tokens over their time, from rank 0's step lines
    steady = steps[1:]
    tokens_per_second = sum(e["tokens"] for e in steady) / sum(e["step_seconds"] for e in steady)
    assert values["llmtrain_trainer_tokens_per_second"] == pytest.approx(tokens_per_second, rel=1e-4)
    # MFU is tokens/s times a constant (FLOPs per token over the devices' peak), as in every step line
    ratio = values["llmtrain_trainer_mfu"] / values["llmtrain_trainer_tokens_per_second"]
    assert ratio == pytest.approx(last["mfu"] / last["tokens_per_second"], rel=1e-5)
    # the same figures as rank 0's end line (which `llmtrain local`'s summary prints)
    assert (end["tokens_per_second"], end["mfu"]) == pytest.approx(
        (values["llmtrain_trainer_tokens_per_second"], values["llmtrain_trainer_mfu"]), rel=1e-4
    )
    # the attempt's goodput counters: every step, the last one's end, the final checkpoint
    assert values["llmtrain_trainer_attempt_steps"] == STEPS and values["llmtrain_trainer_resume_step"] == 0
    assert values["llmtrain_trainer_heartbeat_timestamp_seconds"] == pytest.approx(last["time"], abs=1e-5)
    assert values["llmtrain_trainer_attempt_step_seconds"] == pytest.approx(
        sum(e["step_seconds"] for e in steps), abs=1e-4
    )
    assert values["llmtrain_trainer_last_checkpoint_step"] == STEPS

    # what the operator makes of it once a kubelet reports the container's exit
    pod = {"metadata": {"name": "j-a1-worker-0"}, **exited(0, term.read_text())}
    progress = summary_of([pod_summary(pod)]).as_status()
    assert (progress["step"], progress["lastCheckpointStep"], progress["attemptSteps"]) == (STEPS, STEPS, STEPS)
