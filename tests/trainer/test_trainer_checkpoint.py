"""Checkpoint failure handling: failed saves, corrupt checkpoints, unwritable locations, fencing.

The in-process tests run the real `Checkpointer` and DCP over a one-process gloo group; the
multi-process ones run torchrun workers as the other trainer tests do.
"""

from __future__ import annotations

import os

import pytest
import torch

from conftest import STEPS, base_spec

pytestmark = pytest.mark.trainer


def _state(value: float) -> dict:
    return {"model": {"w": torch.full((64,), value)}, "train": {"step": int(value)}}


def test_failed_background_save_is_reported_and_the_next_save_retries(tmp_path, one_process_group):
    """Defect: DCP raises CheckpointException (a BaseException) for a failed save, which escaped the
    `except Exception` at the next save and killed training."""
    from llmtrain_trainer.checkpoint.checkpointer import Checkpointer
    from llmtrain_trainer.job_config import CheckpointConfig
    from llmtrain_trainer.metrics.prometheus import TrainerMetrics

    events: list[dict] = []
    metrics = TrainerMetrics(job="j", rank=0)
    ckpt = Checkpointer(
        CheckpointConfig(str(tmp_path / "ckpt"), keep=3, interval_minutes=60, interval_steps=0, timeout_minutes=1),
        metrics=metrics,
        emit=events.append,
    )
    real_writer = ckpt.store.writer
    calls = []

    def flaky_writer(step, rank, on_commit):
        w = real_writer(step, rank, on_commit)
        calls.append(step)
        if len(calls) == 1:  # the first save's storage fails, like a full disk

            def write_data(plan, planner):
                raise OSError(28, "No space left on device")

            w.write_data = write_data
        return w

    ckpt.store.writer = flaky_writer
    ckpt.save(1, _state(1.0))
    ckpt.save(2, _state(2.0))  # waits for the failed one first: must not raise
    ckpt.wait()
    assert calls == [1, 2]
    failed = [e for e in events if e["event"] == "checkpoint_failed"]
    assert len(failed) == 1 and failed[0]["step"] == 1 and "No space left" in failed[0]["error"]
    assert [e["step"] for e in events if e["event"] == "checkpoint"] == [2]
    assert ckpt.last_committed == 2 and ckpt.latest() == 2
    value = metrics.registry.get_sample_value(
        "llmtrain_trainer_checkpoint_failures_total", {"llmtrain_job": "j", "rank": "0"}
    )
    assert value == 1
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["step-0000000002"]  # no partial left behind
    ckpt.close()


@pytest.mark.slow
def test_full_disk_fails_each_save_but_training_runs_to_the_end(corpus, launch, tmp_path):
    """Every save fails with EFBIG (file-size limit smaller than a shard): each failure is an event,
    training still completes every step, and the exit code says the final checkpoint is missing."""
    spec = base_spec(**{"data.uri": corpus, "checkpoint.uri": str(tmp_path / "ckpt"), "checkpoint.intervalSteps": 2})
    w = launch(spec, file_size_limit=32 << 10)
    rc = w.wait(180)
    assert [e["step"] for e in w.of("step")] == list(range(1, STEPS + 1)), w.stderr()
    failed = w.of("checkpoint_failed")
    assert [e["step"] for e in failed] == [2, 4, 6, 8], w.stderr()
    assert all("File too large" in e["error"] for e in failed)
    assert not w.of("checkpoint")
    end = w.of("end")[0]
    assert end["reason"] == "finished" and end["last_checkpoint"] is None
    assert rc != 0  # the trained state of the final step was not saved


def _corrupt(step_dir, how: str) -> None:
    if how == "truncated-shard":
        shard = step_dir / "__0_0.distcp"
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 3])
    elif how == "empty-metadata":
        (step_dir / ".metadata").write_bytes(b"")
    else:
        (step_dir / ".metadata").write_bytes(os.urandom(300))


@pytest.mark.parametrize("how", ["truncated-shard", "empty-metadata", "garbage-metadata"])
def test_corrupt_newest_checkpoint_falls_back_to_the_newest_that_loads(tmp_path, one_process_group, how):
    """Defect: a corrupt newest checkpoint blocked every resume although an older good one existed."""
    from llmtrain_trainer.checkpoint.checkpointer import Checkpointer
    from llmtrain_trainer.job_config import CheckpointConfig

    def make(events):
        return Checkpointer(
            CheckpointConfig(str(tmp_path / "ckpt"), keep=3, interval_minutes=60, interval_steps=0, timeout_minutes=1),
            emit=events.append,
        )

    ckpt = make([])
    for step in (1, 2, 3):
        ckpt.save(step, _state(float(step)), blocking=True)
    ckpt.close()
    _corrupt(tmp_path / "ckpt" / "step-0000000003", how)

    events: list[dict] = []
    ckpt = make(events)
    found = ckpt.resume(lambda: _state(0.0))
    assert found is not None
    step, state = found
    assert step == 2 and torch.equal(state["model"]["w"], torch.full((64,), 2.0))
    assert ckpt.last_committed == 2
    skipped = [e for e in events if e["event"] == "checkpoint_skipped"]
    assert len(skipped) == 1 and skipped[0]["step"] == 3 and skipped[0]["uri"].endswith("step-0000000003")
    ckpt.close()


def test_no_loadable_checkpoint_is_an_error_naming_each(tmp_path, one_process_group):
    """Never silently start over (and overwrite) when checkpoints exist but none loads."""
    from llmtrain_trainer.checkpoint.checkpointer import Checkpointer
    from llmtrain_trainer.job_config import CheckpointConfig

    ckpt = Checkpointer(
        CheckpointConfig(str(tmp_path / "ckpt"), keep=3, interval_minutes=60, interval_steps=0, timeout_minutes=1)
    )
    for step in (1, 2):
        ckpt.save(step, _state(float(step)), blocking=True)
        _corrupt(tmp_path / "ckpt" / f"step-{step:010d}", "empty-metadata")
    with pytest.raises(RuntimeError, match="no checkpoint loads") as err:
        ckpt.resume(lambda: _state(0.0))
    assert "step-0000000001" in str(err.value) and "step-0000000002" in str(err.value)
    ckpt.close()


@pytest.mark.slow
def test_truncated_newest_shard_resumes_two_ranks_from_the_older_checkpoint(corpus, launch, tmp_path):
    """Only rank 1 reads the truncated shard; both ranks agree to fall back (DCP's load is collective)."""
    from test_trainer_distributed import assert_matches_reference
    from trainer_reference import reference_losses

    # Constant LR: a first run of 4 steps follows the same trajectory as the full run.
    spec = base_spec(
        **{
            "data.uri": corpus,
            "checkpoint.uri": str(tmp_path / "ckpt"),
            "checkpoint.intervalSteps": 2,
            "checkpoint.keep": 3,
            "training.lrSchedule": "constant",
            "training.warmupSteps": 0,
            "training.learningRate": 0.005,
        }
    )
    first = launch(dict(spec, training={**spec["training"], "maxSteps": 4}), name="first")
    assert first.wait(180) == 0, first.stderr()
    shard = tmp_path / "ckpt" / "step-0000000004" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])
    second = launch(spec, name="second")
    assert second.wait(180) == 0, second.stderr()
    skipped = second.of("checkpoint_skipped")
    assert [e["step"] for e in skipped] == [4] and "step-0000000004" in skipped[0]["uri"]
    assert second.of("resume")[0]["step"] == 2
    assert sorted(second.losses()) == list(range(3, STEPS + 1))
    assert_matches_reference(second.losses(), reference_losses(spec))
    assert "step-0000000004 does not load, skipped" in second.stderr()  # the warning names it


def test_unwritable_local_checkpoint_location_fails_at_start_up(tmp_path, one_process_group):
    """Defect: found only at the first save, an hour in by default."""
    from llmtrain_trainer.checkpoint.checkpointer import Checkpointer
    from llmtrain_trainer.job_config import CheckpointConfig

    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(RuntimeError, match=r"checkpoint.uri .*file/ckpt.* is not writable") as err:
        Checkpointer(CheckpointConfig(str(tmp_path / "file" / "ckpt"), keep=1, timeout_minutes=1))
    assert "Not a directory" in str(err.value)


def test_unwritable_s3_checkpoint_location_fails_at_start_up(s3, one_process_group):
    import boto3

    from llmtrain_trainer.checkpoint.checkpointer import Checkpointer
    from llmtrain_trainer.job_config import CheckpointConfig

    with pytest.raises(RuntimeError, match=r"checkpoint.uri s3://no-such-bucket/run/ is not writable") as err:
        Checkpointer(CheckpointConfig("s3://no-such-bucket/run/", keep=1, timeout_minutes=1))
    assert "NoSuchBucket" in str(err.value)
    c = boto3.client("s3")
    c.create_bucket(Bucket="writable")
    Checkpointer(CheckpointConfig("s3://writable/run/", keep=1, timeout_minutes=1)).close()
    assert "Contents" not in c.list_objects_v2(Bucket="writable")  # the probe object is removed again


def test_s3_fencing_a_late_writer_of_an_old_attempt_cannot_commit_a_broken_checkpoint(s3, one_process_group):
    """Attempt 0 is still uploading step 4 (its pods are in their grace period) when attempt 1
    starts and removes uncommitted objects. Attempt 0's rank 0 then writes the metadata and the
    marker: before fencing that produced a checkpoint that looked complete over deleted shards."""
    import threading

    import boto3

    from llmtrain_trainer.checkpoint.checkpointer import Checkpointer
    from llmtrain_trainer.job_config import CheckpointConfig

    boto3.client("s3").create_bucket(Bucket="fence")
    uri = "s3://fence/run/"

    def make(attempt):
        return Checkpointer(CheckpointConfig(uri, keep=5, timeout_minutes=1, attempt=attempt))

    old = make(0)
    old.save(2, _state(2.0), blocking=True)
    uploaded, release = threading.Event(), threading.Event()
    real_writer = old.store.writer

    def slow_writer(step, rank, on_commit):
        w = real_writer(step, rank, on_commit)
        finish = w.finish

        def late_finish(metadata, results):  # shards are uploaded; the commit is late
            uploaded.set()
            assert release.wait(60)
            finish(metadata, results)

        w.finish = late_finish
        return w

    old.store.writer = slow_writer
    late = threading.Thread(target=old.save, args=(4, _state(4.0)), kwargs={"blocking": True})
    late.start()
    assert uploaded.wait(60)
    new = make(1)  # start-up of the next attempt: removes what is not committed, i.e. the old shards
    release.set()
    late.join(60)
    assert not late.is_alive()

    assert new.complete_steps() == [2]  # the late commit over deleted shards is not a checkpoint
    step, state = new.resume(lambda: _state(0.0))
    assert step == 2 and torch.equal(state["model"]["w"], torch.full((64,), 2.0))

    # The new attempt's own step 4 is what counts from then on, whatever the old attempt left.
    new.save(4, _state(44.0), blocking=True)
    assert new.complete_steps() == [2, 4] and new.store.owner[4] == 1
    step, state = make(2).resume(lambda: _state(0.0))
    assert step == 4 and torch.equal(state["model"]["w"], torch.full((64,), 44.0))
    old.close(), new.close()


@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda groups: torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), foreach=True),  # the trainer's
        # weight_decay 0: Adam's L2 decay adds wd * param to the zero gradient, so torch's reference
        # step would leave non-zero moments (which the load then overwrites) — not a clean reference.
        lambda groups: torch.optim.Adam([dict(g, weight_decay=0.0) for g in groups], lr=1e-3, amsgrad=True),
    ],
    ids=["adamw-foreach", "adam-amsgrad"],
)
def test_resume_creates_the_optimizer_state_without_an_optimizer_step(one_process_group, make_optimizer):
    """Defect (issue 12, checkpoint load bandwidth): before DCP can load in place, the optimizer state
    must exist; torch's get_state_dict created it with a full zero-gradient optimizer step on FSDP2's
    DTensors, ~2 of the 2.8 s of a 0.28 GB resume. init_optimizer_state must create exactly what
    that step creates (same keys, dtypes, shapes, placements, values) without running a step."""
    from torch.distributed.checkpoint.state_dict import _init_optim_state
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from llmtrain_trainer.checkpoint.checkpointer import init_optimizer_state

    def build():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 8))
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
        decay = [p for p in model.parameters() if p.ndim >= 2]
        rest = [p for p in model.parameters() if p.ndim < 2]
        return model, make_optimizer([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}])

    _, expected_opt = build()
    _init_optim_state(expected_opt)  # torch's reference: one step on zero gradients with lr 0
    model, opt = build()
    before = [p.detach().full_tensor().clone() for p in model.parameters()]
    steps = []
    opt.register_step_pre_hook(lambda *a: steps.append(1))
    init_optimizer_state(opt)
    assert steps == [], "init_optimizer_state ran an optimizer step"
    assert all(torch.equal(b, p.detach().full_tensor()) for b, p in zip(before, model.parameters()))
    expected = expected_opt.state_dict()["state"]
    got = opt.state_dict()["state"]
    assert sorted(got) == sorted(expected) and len(got) == len(list(model.parameters()))
    for idx, want in expected.items():
        assert sorted(got[idx]) == sorted(want), idx
        for key, w in want.items():
            g = got[idx][key]
            assert (type(g), g.dtype, g.device, g.shape) == (type(w), w.dtype, w.device, w.shape), (idx, key)
            if hasattr(w, "placements"):
                assert g.placements == w.placements, (idx, key)
                g, w = g.full_tensor(), w.full_tensor()
            if key == "step":  # torch's zero step counted itself; the load overwrites it either way
                assert (g.item(), w.item()) == (0.0, 1.0)
                continue
            assert torch.equal(g, w), (idx, key)
