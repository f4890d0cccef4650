"""checkpoint.intervalMinutes auto in the trainer: the real `Checkpointer` over a one-process gloo
group, its interval following the blocking cost of its saves (llmtrain/cadence.py's Young/Daly);
the expected intervals are computed by hand."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch

from conftest import base_spec

pytestmark = pytest.mark.trainer

M = 400 * 3600.0  # a job MTBF of 400 h


def _state(value: float) -> dict:
    return {"model": {"w": torch.full((64,), value)}, "train": {"step": int(value)}}


def _gauge(metrics, name: str) -> float:
    return metrics.registry.get_sample_value(name, {"llmtrain_job": "j", "rank": "0"})


def test_the_checkpointers_interval_follows_the_measured_blocking_cost(tmp_path, one_process_group):
    from llmtrain.cadence import AutoInterval
    from llmtrain_trainer.checkpoint.checkpointer import Checkpointer
    from llmtrain_trainer.job_config import CheckpointConfig
    from llmtrain_trainer.metrics.prometheus import TrainerMetrics

    metrics, events = TrainerMetrics(job="j", rank=0), []
    ckpt = Checkpointer(
        CheckpointConfig(
            str(tmp_path / "ckpt"), keep=2, interval_minutes=0, timeout_minutes=1, auto=AutoInterval(M, 0.5)
        ),
        metrics=metrics,
        emit=events.append,
    )
    # from the estimate: √(2 · 0.5 · 1,440,000) = 1,200 s
    assert ckpt.interval_s == pytest.approx(1200)
    assert _gauge(metrics, "llmtrain_trainer_checkpoint_interval_seconds") == pytest.approx(1200)
    assert _gauge(metrics, "llmtrain_trainer_checkpoint_blocking_measured_saves") == 0
    assert _gauge(metrics, "llmtrain_trainer_checkpoint_mtbf_seconds") == M

    # a real save, timed as the training loop times it
    t0 = time.perf_counter()
    ckpt.save(1, _state(1.0))
    blocking = time.perf_counter() - t0
    ckpt.saved(blocking)
    assert _gauge(metrics, "llmtrain_trainer_checkpoint_blocking_estimate_seconds") == pytest.approx(blocking)
    assert ckpt.interval_s == pytest.approx(max(300.0, math.sqrt(2 * blocking * M)))

    ckpt.auto.measured_saves = 0  # start the smoothing over, with known costs
    ckpt.saved(30)  # √(2 · 30 · 1,440,000) = 9,295.2 s
    assert ckpt.interval_s == pytest.approx(9295.16, abs=0.01)
    ckpt.saved(50)  # EWMA ½: 30 → 40; √(2 · 40 · 1,440,000) = 10,733.1 s
    assert ckpt.interval_s == pytest.approx(10733.13, abs=0.01)
    assert _gauge(metrics, "llmtrain_trainer_checkpoint_interval_seconds") == pytest.approx(10733.13, abs=0.01)
    assert _gauge(metrics, "llmtrain_trainer_checkpoint_blocking_measured_saves") == 2
    assert [round(e["seconds"]) for e in events if e["event"] == "checkpoint_interval"][-2:] == [9295, 10733]

    # due() uses it
    ckpt._last_save = time.monotonic() - 10_000
    assert not ckpt.due(7)
    ckpt._last_save = time.monotonic() - 10_800
    assert ckpt.due(7)
    ckpt.close()


def test_a_numeric_interval_ignores_the_blocking_cost(tmp_path, one_process_group):
    from llmtrain_trainer.checkpoint.checkpointer import Checkpointer
    from llmtrain_trainer.job_config import CheckpointConfig

    ckpt = Checkpointer(CheckpointConfig(str(tmp_path / "c"), keep=1, interval_minutes=60, timeout_minutes=1))
    ckpt.saved(30)
    assert ckpt.interval_s == 3600
    ckpt.close()


def test_auto_inputs_come_from_the_operator_or_the_prior():
    from llmtrain import cadence
    from llmtrain.planner import checkpoint_blocking_estimate, plan_job
    from llmtrain_trainer.checkpoint.checkpointer import auto_interval
    from llmtrain_trainer.config import parse_spec

    spec = parse_spec(json.dumps(base_spec(checkpoint={"uri": "file:///tmp/x", "intervalMinutes": "auto"})))
    given = auto_interval(spec, {cadence.MTBF_ENV: "1440000", cadence.BLOCKING_ENV: "30"})
    assert (given.mtbf_seconds, given.blocking_seconds) == (1440000, 30)
    # a local run: the Llama 3 prior for one cpu node (50,677 h) and the planner's estimate
    local = auto_interval(spec, {cadence.MTBF_ENV: "nan", cadence.BLOCKING_ENV: "-1"})
    assert local.mtbf_seconds == pytest.approx(54 * 24 * 16384 / 419 * 3600)
    assert local.blocking_seconds == checkpoint_blocking_estimate(plan_job(spec))
    assert auto_interval(parse_spec(json.dumps(base_spec())), {}) is None  # 60 minutes: no auto


def test_an_in_place_restart_carries_the_measured_blocking_cost(tmp_path):
    """The next worker process of the same attempt starts from the mean its predecessors measured
    (the attempt's ledger), not from the estimate again."""
    from llmtrain_trainer.checkpoint.checkpointer import auto_interval
    from llmtrain_trainer.config import parse_spec
    from llmtrain_trainer.metrics.restarts import AttemptLedger, ledger_path

    path = ledger_path(str(tmp_path), 0)
    first = AttemptLedger(path, "run-a", 1)
    first.loop_started(0.0, 0)
    first.saved(20.0, 30.0)
    first.saved(40.0, 80.0)
    carried = AttemptLedger(path, "run-a", 1).state
    assert (carried.checkpoint_blocking_seconds, carried.saves) == (60.0, 2)
    spec = parse_spec(json.dumps(base_spec(checkpoint={"uri": "file:///tmp/x", "intervalMinutes": "auto"})))
    auto = auto_interval(
        spec,
        {"LLMTRAIN_CHECKPOINT_MTBF_SECONDS": str(M), "LLMTRAIN_CHECKPOINT_BLOCKING_SECONDS": "1"},
        (carried.checkpoint_blocking_seconds, carried.saves),
    )
    assert (auto.blocking_seconds, auto.measured_saves) == (30.0, 2)
    assert auto.seconds == pytest.approx(9295.16, abs=0.01)  # √(2 · 30 · 1,440,000)
