"""The trainer's parts in this process, without torchrun: the real `Trainer` over a one-process gloo
group, built from the tiny job spec and a `WorkerEnv` given here (no environment variables).

- step: its losses are the plain single-process loop's (trainer_reference.py); a stop agreed
  between micro-batches gives the partial step up and hands its batch back;
- resume: a second trainer on the same checkpoint location starts at the step, data position and
  weights the first one stopped with, and trains on along the reference trajectory; a loss-spike
  rollback sets the newer checkpoints aside and resumes from before them;
- the worker's environment: read in one place, bad values named.
"""

from __future__ import annotations

import json
import math
import signal

import pytest
import torch

from conftest import STEPS, base_spec
from llmtrain_devcluster.process import free_port

pytestmark = pytest.mark.trainer

RTOL = 2e-4  # as tests/trainer/test_trainer_distributed.py: fp32, only the reduction order differs


def _trainer(spec: dict, tmp_path, events: list, *, stop=None, env=None, on_event=None, **cfg_over):
    import dataclasses

    from llmtrain_trainer.config import JobIdentity, WorkerEnv, parse_spec
    from llmtrain_trainer.job_config import JobConfig
    from llmtrain_trainer.stopping import StopFlag
    from llmtrain_trainer.train import Trainer

    def emit(event: dict) -> None:
        events.append(event)
        if on_event:
            on_event(event)

    env = env or WorkerEnv(metrics_port=free_port(), staging=str(tmp_path / "staging"))
    cfg = dataclasses.replace(
        JobConfig.from_spec(parse_spec(json.dumps(spec)), JobIdentity("t", "ns", 0), env), **cfg_over
    )
    return Trainer(cfg, device=torch.device("cpu"), stop=stop or StopFlag(install=False), emit=emit)


def _of(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e.get("event") == kind]


def _weights(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().full_tensor().clone() for n, p in trainer.model.named_parameters()}


def test_steps_follow_the_plain_loop(corpus, reference, one_process_group, tmp_path):
    events: list[dict] = []
    t = _trainer(base_spec(**{"data.uri": corpus}), tmp_path, events)
    assert t.accum == 4  # 8 sequences per step, micro-batches of 2, one rank
    assert t.resume() == 0 and _of(events, "resume") == []  # no checkpoint location: a fresh start
    t.metrics.loop_started(0)
    try:
        for k in (1, 2, 3):
            r = t.step()
            assert r.completed and r.step == k and not r.stop and not r.save
            assert r.loss == pytest.approx(reference[k], rel=RTOL), (k, r.loss, reference[k])
            assert all(g["lr"] == r.lr for g in t.optimizer.param_groups) and r.seconds >= r.data_wait >= 0
            t.log(r)
    finally:
        t.loader.close()
        t.metrics.close()
        t.checkpointer.close()
    lines = _of(events, "step")
    assert [e["step"] for e in lines] == [1, 2, 3]
    assert [e["sample_start"] for e in lines] == [0, 8, 16] and {e["samples"] for e in lines} == {8}
    assert t.loader.step == 3
    assert t.metrics.prom.registry.get_sample_value("llmtrain_trainer_step", {"llmtrain_job": "t", "rank": "0"}) == 3


def test_a_stop_between_micro_batches_drops_the_partial_step(corpus, one_process_group, tmp_path):
    from llmtrain_trainer.stopping import StopFlag

    events: list[dict] = []
    stop = StopFlag(install=False)
    t = _trainer(base_spec(**{"data.uri": corpus}), tmp_path, events, stop=stop)
    t.resume()
    t.metrics.loop_started(0)
    try:
        t.log(t.step())
        before = _weights(t)
        stop.signal = signal.SIGTERM  # what the handler does
        r = t.step()
        assert (r.completed, r.stop, r.dropped, r.step) == (False, True, 1, 1)
        assert t.step_no == 1 and t.loader.step == 1  # the batch is read again by whoever resumes
        assert all(p.grad is None for p in t.model.parameters())  # nothing of the partial step is kept
        after = _weights(t)
        assert all(torch.equal(before[n], after[n]) for n in before)
        t.stop(r)
    finally:
        t.loader.close()
        t.metrics.close()
        t.checkpointer.close()
    assert _of(events, "stop") == [
        {"event": "stop", "step": 1, "reason": "signal", "signal": "SIGTERM", "dropped_micro_batches": 1, "of": 4}
    ]


def _end(events: list[dict]) -> dict:
    """The one end line, its steady throughput checked against the step lines and taken out: the
    steps after this process's first, their tokens over their time."""
    (end,) = _of(events, "end")
    steady = _of(events, "step")[1:]
    assert end.pop("tokens_per_second") == pytest.approx(
        sum(e["tokens"] for e in steady) / sum(e["wall_seconds"] for e in steady), rel=1e-4
    )
    assert end.pop("mfu") > 0
    return end


@pytest.fixture
def stopped_at_4(corpus, one_process_group, tmp_path):
    """(spec, events): a trainer with a checkpoint location, saving every 2 steps, asked to stop
    (as by SIGTERM) while its step 3 line goes out. Step 3 neither saves nor ends training, so its
    line goes out once step 4 has run (no per-step host sync: one step later); step 4 saves; the
    trainer gives up step 5 after one micro-batch and stops with step 4 as its final checkpoint."""
    from llmtrain_trainer.stopping import StopFlag

    spec = base_spec(**{"data.uri": corpus, "checkpoint.uri": f"file://{tmp_path}/ckpt", "checkpoint.intervalSteps": 2})
    events: list[dict] = []
    stop = StopFlag(install=False)

    def on_event(e: dict) -> None:
        if e.get("event") == "step" and e["step"] == 3:
            stop.signal = signal.SIGTERM

    first = _trainer(spec, tmp_path, events, stop=stop, on_event=on_event)
    assert first.resume() == 0
    assert first.train() == 0
    assert _end(events) == {"event": "end", "reason": "signal", "step": 4, "last_checkpoint": 4}
    assert _of(events, "stop")[0]["dropped_micro_batches"] == 1
    assert [e["step"] for e in _of(events, "checkpoint")] == [2, 4]
    assert [e["step"] for e in _of(events, "step")] == [1, 2, 3, 4]
    return spec, _weights(first)


def test_a_second_trainer_resumes_where_the_first_stopped(stopped_at_4, reference, tmp_path):
    spec, weights = stopped_at_4
    events: list[dict] = []
    second = _trainer(spec, tmp_path, events)
    assert second.resume() == 4
    assert second.loader.step == 4
    resumed = _weights(second)
    assert all(torch.equal(weights[n], resumed[n]) for n in weights)
    assert _of(events, "resume")[0] | {"seconds": 0} == {
        "event": "resume",
        "step": 4,
        "tier": "durable",
        "from_world_size": 1,
        "world_size": 1,
        "seconds": 0,
    }
    assert second.train() == 0
    losses = {e["step"]: e["loss"] for e in _of(events, "step")}
    assert sorted(losses) == list(range(5, STEPS + 1))
    for step, loss in losses.items():  # as if never stopped
        assert loss == pytest.approx(reference[step], rel=RTOL), (step, losses, reference)
    assert _end(events) == {"event": "end", "reason": "finished", "step": STEPS, "last_checkpoint": STEPS}


def test_a_rollback_resumes_from_before_the_step_it_names(stopped_at_4, tmp_path):
    from llmtrain_trainer.config import WorkerEnv

    spec, _ = stopped_at_4
    events: list[dict] = []
    env = WorkerEnv(metrics_port=free_port(), staging=str(tmp_path / "staging"), resume_before_step=3)
    t = _trainer(spec, tmp_path, events, env=env)
    try:
        assert t.resume() == 2
    finally:
        t.loader.close()
        t.checkpointer.close()
    (rollback,) = _of(events, "rollback")
    assert rollback["before_step"] == 3 and [q.rsplit("/", 1)[-1] for q in rollback["quarantined"]] == [
        "step-0000000004"
    ]
    assert (tmp_path / "ckpt" / "quarantine" / "step-0000000004").is_dir()
    gauge = t.metrics.prom.registry.get_sample_value
    assert gauge("llmtrain_trainer_resumed_before_step", {"llmtrain_job": "t", "rank": "0"}) == 3


def test_garbage_is_collected_every_n_steps_on_every_rank_and_never_automatically(corpus, one_process_group, tmp_path):
    """Defect (issue 32): Python's automatic GC ran whenever allocation counts crossed its thresholds,
    at a different point of a step on each rank, and every collective made the other ranks wait for
    it. While training it is off; every rank collects generation 1 at the start and before every Nth
    step (the same steps on every rank: the step number decides), and it is on again afterwards."""
    import gc

    collections: list[tuple[int, int]] = []  # (completed steps, generation) at each collection
    enabled_at_step: list[bool] = []
    t = _trainer(
        base_spec(**{"data.uri": corpus}),
        tmp_path,
        [],
        on_event=lambda e: e.get("event") == "step" and enabled_at_step.append(gc.isenabled()),
        gc_every_steps=3,
    )
    t.resume()

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            collections.append((t.step_no, info["generation"]))

    assert gc.isenabled()
    gc.callbacks.append(on_gc)
    try:
        assert t.train() == 0
    finally:
        gc.callbacks.remove(on_gc)
    assert enabled_at_step == [False] * STEPS
    assert collections == [(0, 1), (2, 1), (5, 1)]  # at the start, before steps 3 and 6
    assert gc.isenabled()


def test_throughput_and_mfu_count_the_checkpoints_blocking(corpus, one_process_group, tmp_path):
    """Defect (issue 32): the step timer stopped before the checkpoint's blocking part, so tokens/s
    and MFU left out what a save costs training. Throughput is now over the wall time between step
    ends: over the run it adds up to the steps' time plus every save's blocking time (and the
    logging between steps), and tokens/s per device is exported beside the job's."""
    events: list[dict] = []
    spec = base_spec(**{"data.uri": corpus, "checkpoint.uri": f"file://{tmp_path}/ckpt", "checkpoint.intervalSteps": 2})
    t = _trainer(spec, tmp_path, events)
    t.resume()
    assert t.train() == 0
    steps = _of(events, "step")
    assert [e["step"] for e in steps] == list(range(1, STEPS + 1))
    assert [e["step"] for e in _of(events, "checkpoint")] == [2, 4, 6, STEPS]  # 3 periodic + the final one
    blocking = t.metrics.prom.registry.get_sample_value(
        "llmtrain_trainer_checkpoint_blocking_seconds_total", {"llmtrain_job": "t", "rank": "0"}
    )
    assert blocking > 0
    # Steps 3, 5, 7 follow a periodic save: their wall time holds its blocking part.
    after_save = sum(e["wall_seconds"] - e["step_seconds"] for e in steps if e["step"] in (3, 5, 7))
    assert after_save >= blocking - 1e-5, (after_save, blocking)  # the lines round to microseconds
    for e in steps:
        assert e["wall_seconds"] >= e["step_seconds"]
        assert e["tokens_per_second"] == pytest.approx(e["tokens"] / e["wall_seconds"], rel=1e-3)
        assert e["tokens_per_second_per_device"] == pytest.approx(e["tokens_per_second"], rel=1e-3)  # one rank
    last = steps[-1]
    got = t.metrics.prom.registry.get_sample_value(
        "llmtrain_trainer_tokens_per_second_per_device", {"llmtrain_job": "t", "rank": "0"}
    )
    assert got == pytest.approx(last["tokens_per_second_per_device"], rel=1e-3)


def test_fp16_with_its_gradient_scaler_steps(corpus, one_process_group, tmp_path):
    """Defect (issue 32, found by test_trainer_rollback's fp16 run): fused AdamW failed at the first
    fp16 step — the sharded gradient scaler hands the optimizer a found-inf flag of shape [1], which
    torch 2.15's fused kernel cannot subtract from its 0-d step counts. fp16 keeps foreach AdamW."""
    t = _trainer(base_spec(**{"data.uri": corpus, "fsdp.mixedPrecision": "fp16"}), tmp_path, [])
    assert t.scaler is not None
    assert {g["foreach"] for g in t.optimizer.param_groups} == {True}
    t.resume()
    t.metrics.loop_started(0)
    try:
        losses = [t.step().loss for _ in range(3)]
    finally:
        t.loader.close()
        t.metrics.close()
        t.checkpointer.close()
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0], losses


def test_a_steps_loss_is_read_after_the_next_step_is_queued(corpus, one_process_group, tmp_path):
    """Defect (issue 32): every step ended with its loss and flags read back on the host
    (`.tolist()` of a device tensor), so the host never ran ahead of the device. Now a step's line
    (its loss read) goes out only after the next step has been queued (its batch drawn, its optimizer
    step taken); a step that saves or ends training is logged at once, before its checkpoint."""
    seen: list[tuple[int, int]] = []  # (step of the line, optimizer steps taken when it went out)
    box: list = []
    spec = base_spec(**{"data.uri": corpus, "checkpoint.uri": f"file://{tmp_path}/ckpt", "checkpoint.intervalSteps": 4})
    t = _trainer(
        spec, tmp_path, [], on_event=lambda e: e.get("event") == "step" and seen.append((e["step"], box[0].step_no))
    )
    box.append(t)
    t.resume()
    assert t.train() == 0
    # steps 4 (a save) and 8 (the last) at once; every other one after the next step ran
    assert seen == [(1, 2), (2, 3), (3, 4), (4, 4), (5, 6), (6, 7), (7, 8), (8, 8)]


def test_the_worker_environment_is_read_once_and_bad_values_are_named():
    from llmtrain_trainer.config import WorkerEnv

    env = WorkerEnv.from_environ(
        {
            "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "4",
            "TORCHELASTIC_RESTART_COUNT": "2",
            "TORCHELASTIC_RUN_ID": "run-a",
            "LLMTRAIN_RESUME_BEFORE_STEP": "",
            "LLMTRAIN_METRICS_PORT": "9500",
            "LLMTRAIN_CHECKPOINT_STAGING": "/stage",
            "LLMTRAIN_CHECKPOINT_MTBF_SECONDS": "1440000",
            "MASTER_ADDR": "10.0.0.1",
            "UNRELATED": "x",
        }
    )
    assert env == WorkerEnv(
        local_rank=1,
        local_world_size=4,
        restart_count=2,
        run_id="run-a",
        resume_before_step=0,
        metrics_port=9500,
        staging="/stage",
        master_addr="10.0.0.1",
        checkpoint_auto={"LLMTRAIN_CHECKPOINT_MTBF_SECONDS": "1440000"},
    )
    with pytest.raises(ValueError, match=r"LLMTRAIN_RESUME_BEFORE_STEP='step 4': expected a non-negative integer"):
        WorkerEnv.from_environ({"LLMTRAIN_RESUME_BEFORE_STEP": "step 4"})
    with pytest.raises(ValueError, match=r"LOCAL_RANK='-1'"):
        WorkerEnv.from_environ({"LOCAL_RANK": "-1"})


def test_a_stop_request_once_training_is_over_does_not_kill_the_exiting_worker():
    """After the final checkpoint a worker ignores SIGTERM: one arriving while it exits (its pod
    deleted as its peers end) killed it in CPython's finalization, where a Python handler no longer
    runs, and torchrun restarted the 'failed' worker in place into a rendezvous that was gone."""
    import subprocess
    import sys

    code = (
        "import os, signal\n"
        "from llmtrain_trainer.stopping import StopFlag\n"
        "stop = StopFlag()\n"
        "stop.done()\n"
        "assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "print('exited cleanly', stop.signal)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout.strip()) == (0, "exited cleanly None"), r.stderr
