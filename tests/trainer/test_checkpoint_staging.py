"""Checkpoint staging (checkpoint/staging.py): one stager for the run, its host buffers reused by
every asynchronous save — pinned with non-blocking copies on CUDA, pageable with plain copies on the
CPU. The CPU path runs here; the pinned one needs a GPU (pinning memory needs CUDA)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.trainer


def test_pinned_buffers_and_non_blocking_copies_on_cuda_only():
    from llmtrain_trainer.checkpoint.staging import staging_options

    cuda, cpu = staging_options(cuda=True), staging_options(cuda=False)
    assert (cuda.use_pinned_memory, cuda.use_non_blocking_copy) == (True, True)
    assert (cpu.use_pinned_memory, cpu.use_non_blocking_copy) == (False, False)
    # Synchronous staging on both: the next optimizer step never races the copy.
    assert not cuda.use_async_staging and not cpu.use_async_staging
    assert not cuda.use_shared_memory and not cpu.use_shared_memory


def test_the_stager_copies_into_the_same_host_buffers_every_time():
    from llmtrain_trainer.checkpoint.staging import open_stager

    w = torch.arange(1024, dtype=torch.float32)
    state = {"model": {"w": w}}
    stager = open_stager(cuda=False)
    try:
        first = stager.stage(state)["model"]["w"]
        assert first.data_ptr() != w.data_ptr() and torch.equal(first, w)  # a copy, not the tensor
        w.add_(1.0)  # the optimizer step after the save
        assert not torch.equal(first, w)
        second = stager.stage(state)["model"]["w"]
        assert second.data_ptr() == first.data_ptr()  # reused, not a fresh allocation
        assert torch.equal(second, w)
    finally:
        stager.close()


def test_async_saves_share_one_stager_and_each_checkpoint_holds_its_own_step(tmp_path, one_process_group):
    """Reusing the buffers must not let a later save overwrite an earlier checkpoint's data: each
    save waits for the previous one to be written before staging into the same buffers."""
    from llmtrain_trainer.checkpoint.checkpointer import Checkpointer
    from llmtrain_trainer.job_config import CheckpointConfig

    ckpt = Checkpointer(
        CheckpointConfig(f"file://{tmp_path}/ckpt", keep=3, interval_minutes=60, interval_steps=0, timeout_minutes=1)
    )
    w = torch.zeros(4096)
    try:
        ckpt.save(1, {"model": {"w": w}, "train": {"step": 1}})
        stager = ckpt._stager
        assert stager is not None
        w.fill_(2.0)  # training moves on while step 1 is written
        ckpt.save(2, {"model": {"w": w}, "train": {"step": 2}})
        assert ckpt._stager is stager
        ckpt.wait()
        assert ckpt.complete_steps() == [1, 2]
        for step, value in ((1, 0.0), (2, 2.0)):
            got = {"model": {"w": torch.empty(4096)}, "train": {"step": 0}}
            ckpt.load(step, got)
            assert torch.equal(got["model"]["w"], torch.full((4096,), value)), step
    finally:
        ckpt.close()
    assert ckpt._stager is None


def test_wait_books_the_async_save_before_its_future_callbacks_run(tmp_path, one_process_group, monkeypatch):
    """A future's result is ready before its done-callbacks run (in the saving thread). `wait` must
    still return with the save booked: `stop` reads `last_committed` right after it, and when it saw
    the older step it saved the same step again, blocking (a second `checkpoint` event for step 4 in
    make test, once). Here the callbacks run half a second late, every time."""
    import concurrent.futures
    import threading
    import time

    from llmtrain_trainer.checkpoint import checkpointer as mod
    from llmtrain_trainer.job_config import CheckpointConfig

    callbacks_ran = threading.Event()

    class LateCallbacks(concurrent.futures.Future):
        def _invoke_callbacks(self):
            time.sleep(0.5)  # the delay under test: wait() returns inside it
            super()._invoke_callbacks()
            callbacks_ran.set()

    real_async_save = mod.dcp.async_save

    def async_save(*args, **kwargs):
        real, late = real_async_save(*args, **kwargs), LateCallbacks()
        real.add_done_callback(lambda f: threading.Thread(target=late.set_result, args=(f.result(),)).start())
        return late

    monkeypatch.setattr(mod.dcp, "async_save", async_save)
    events: list[dict] = []
    ckpt = mod.Checkpointer(
        CheckpointConfig(f"file://{tmp_path}/ckpt", keep=3, interval_minutes=60, interval_steps=0, timeout_minutes=1),
        emit=events.append,
    )
    try:
        ckpt.save(4, {"model": {"w": torch.ones(64)}, "train": {"step": 4}})
        ckpt.wait()
        assert ckpt.last_committed == 4
        assert callbacks_ran.wait(30)  # then the late callbacks: they must not book it twice
        assert [e["step"] for e in events if e["event"] == "checkpoint"] == [4]
        assert ckpt.last_committed == 4
    finally:
        ckpt.close()
