"""The trainer's final summary (llmtrain/final_summary.py): the termination message a worker pod
leaves on a clean exit, which the operator writes into status.progress when the job succeeds.
It is the tenant's text, so it is taken exactly as the trainer writes it or not at all."""

from __future__ import annotations

import time

import pytest

from llmtrain.controller.policy.child_status import pod_summary
from llmtrain.controller.policy.ending import summary_of
from llmtrain.controller.policy.progress import _PROGRESS_METRICS
from llmtrain.final_summary import HEADER, MAX_BYTES, SERIES, format_summary, from_pod, parse_summary
from llmtrain.status import ProgressStatus

# the demo's 40-step job at its end, as the trainer's series hold it
END = {
    "llmtrain_trainer_step": 40.0,
    "llmtrain_trainer_loss": 6.123456789,
    "llmtrain_trainer_tokens_per_second": 2471.3,
    "llmtrain_trainer_mfu": 0.1085,
    "llmtrain_trainer_heartbeat_timestamp_seconds": 1772366400.123456,
    "llmtrain_trainer_attempt_steps": 40.0,
    "llmtrain_trainer_attempt_step_seconds": 1.5e-05,
}
GOOD = format_summary(END)


def test_what_the_trainer_writes_reads_back_exactly():
    assert GOOD.startswith(HEADER + "\n") and len(GOOD.encode()) <= MAX_BYTES
    assert parse_summary(GOOD) == END
    # every series the trainer may write is one the operator's scrape knows: it lands in Progress
    assert set(SERIES) <= set(_PROGRESS_METRICS)
    every = format_summary(dict.fromkeys(SERIES, 1772366400.123456))
    assert len(every.encode()) <= MAX_BYTES and parse_summary(every) == dict.fromkeys(SERIES, 1772366400.123456)


def test_values_the_trainer_must_not_pass_on_are_left_out():
    written = format_summary({**END, "llmtrain_trainer_loss": float("nan"), "llmtrain_trainer_mfu": None, "x": 1.0})
    assert parse_summary(written) == {
        k: v for k, v in END.items() if k not in ("llmtrain_trainer_loss", "llmtrain_trainer_mfu")
    }


def _with(line: str) -> str:
    return GOOD + line + "\n"


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(None, id="no message"),
        pytest.param("", id="empty"),
        pytest.param(GOOD.replace(HEADER, "llmtrain final summary v2"), id="another version"),
        pytest.param("torchrun failed; root cause: rank 0 (local 0): ValueError: boom", id="a root cause"),
        pytest.param(HEADER + "\n", id="no step"),
        pytest.param(_with("llmtrain_trainer_step 41.0"), id="a repeated series"),
        pytest.param(_with("llmtrain_trainer_nonfinite_loss_steps 3.0"), id="a series not in a summary"),
        pytest.param(_with("llmtrain_operator_jobs 1.0"), id="not the trainer's"),
        pytest.param(_with('llmtrain_trainer_resume_step{rank="0"} 0.0'), id="labels"),
        pytest.param(_with("llmtrain_trainer_resume_step -1.0"), id="negative"),
        pytest.param(_with("llmtrain_trainer_resume_step +1.0"), id="a sign"),
        pytest.param(_with("llmtrain_trainer_resume_step nan"), id="nan"),
        pytest.param(_with("llmtrain_trainer_resume_step inf"), id="inf"),
        pytest.param(_with("llmtrain_trainer_resume_step 1e400"), id="overflows to inf"),
        pytest.param(_with("llmtrain_trainer_resume_step 1e12"), id="over the bound"),
        pytest.param(_with("llmtrain_trainer_resume_step 0x10"), id="hex"),
        pytest.param(_with("llmtrain_trainer_resume_step 1_000"), id="underscores"),
        pytest.param(_with("llmtrain_trainer_resume_step \u0664\u0660"), id="non-ASCII digits"),
        pytest.param(_with("llmtrain_trainer_resume_step  1.0"), id="two spaces"),
        pytest.param(_with("llmtrain_trainer_resume_step 1.0 1772366400"), id="a timestamp after the value"),
        pytest.param(GOOD.replace("\n", "\r\n"), id="CRLF"),
        pytest.param(GOOD + "\n", id="an empty line"),
        pytest.param(GOOD + "# comment\n", id="a comment"),
        pytest.param(GOOD.rstrip("\n") + " " * MAX_BYTES, id="over MAX_BYTES"),
        pytest.param(HEADER + "\nllmtrain_trainer_step 1.0\n" + "é" * (MAX_BYTES // 2), id="over MAX_BYTES in UTF-8"),
        pytest.param(HEADER + "\n" + "llmtrain_trainer_step 1.0\n" * (len(SERIES) + 1), id="too many lines"),
    ],
)
def test_anything_but_a_summary_yields_nothing(text):
    assert parse_summary(text) is None


def test_parsing_is_linear_in_the_bounded_message():
    """A line of 2 KiB of digits, or of a name, costs the operator microseconds, not a backtrack."""
    worst = [HEADER + "\nllmtrain_trainer_step " + "9" * MAX_BYTES, HEADER + "\nllmtrain_trainer_" + "a" * MAX_BYTES]
    started = time.perf_counter()
    for text in worst * 100:
        assert parse_summary(text[:MAX_BYTES]) is None
    assert time.perf_counter() - started < 1.0


def test_the_largest_values_a_summary_may_hold_still_make_a_valid_status():
    """At the bound, every time is a date and every count an int64: the write that ends the job
    cannot be refused by the API server for what a tenant put in its summary."""
    from llmtrain.controller.policy.ending import summary_of as _summary_of

    top = parse_summary(format_summary(dict.fromkeys(SERIES, 1e11)))
    progress = _summary_of([{"name": "p", "index": "0", "final": top}])
    status = progress.as_status()
    assert status["step"] == 10**11 and status["lastCheckpointTime"].startswith("5138-")
    ProgressStatus.model_validate(status)


def _pod(exit_code: int | None, message: str | None, name: str = "j-a1-worker-0", index: str = "0") -> dict:
    state = {"running": {}} if exit_code is None else {"terminated": {"exitCode": exit_code, "message": message}}
    return {
        "metadata": {"name": name, "labels": {"training.kubeflow.org/replica-index": index}},
        "status": {
            "phase": {None: "Running", 0: "Succeeded"}.get(exit_code, "Failed"),
            "containerStatuses": [{"name": "pytorch", "state": state}],
        },
    }


def test_only_a_container_that_exited_0_is_read():
    assert from_pod(_pod(0, GOOD)) == END
    assert from_pod(_pod(1, GOOD)) is None  # a failed container's message is its root cause's business
    assert from_pod(_pod(None, None)) is None
    assert from_pod(_pod(0, "the log's tail (FallbackToLogsOnError)")) is None
    assert pod_summary(_pod(0, GOOD))["final"] == END and pod_summary(_pod(1, GOOD))["final"] is None


def test_the_attempt_s_summary_is_its_lowest_replica_s():
    late = format_summary({**END, "llmtrain_trainer_step": 39.0})
    pods = [pod_summary(_pod(0, late, "j-a1-worker-10", "10")), pod_summary(_pod(0, GOOD, "j-a1-worker-2", "2"))]
    pods.append(pod_summary(_pod(None, None, "j-a1-worker-0", "0")))  # still running: no summary yet
    progress = summary_of(pods)
    assert (progress.step, progress.loss, progress.mfu) == (40.0, 6.123456789, 0.1085)
    assert summary_of([pod_summary(_pod(None, None))]) is None
