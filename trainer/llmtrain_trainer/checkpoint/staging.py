"""Where an asynchronous save copies this rank's state before the background thread writes it.

Training waits only for this copy (the save's blocking part). DCP's default, through the stores'
FileSystemWriter, makes a fresh pageable host copy on every save, with blocking device→host copies:
the memory is allocated (and faulted in) again each time, and a copy from the GPU into pageable
memory goes through a bounce buffer. As torchtitan's `async_with_pinned_mem`, the trainer keeps one
DCP `DefaultStager` for the whole run, which copies into host buffers allocated at the first save
and reused by every later one (each save waits for the previous one to finish writing first):

- CUDA: the buffers are pinned (page-locked) and the copies non-blocking, all issued and then
  synchronised once, at the DMA engines' speed;
- CPU (the tests, CPU-only runs): pinning needs CUDA, and there is no device copy to overlap, so the
  same stager copies into reused pageable buffers with plain copies. The tests run this path; the
  pinned one runs only on a GPU.

Staging itself stays synchronous (`use_async_staging=False`): training resumes only once the copy is
complete, so the next optimizer step can never change a tensor that is still being copied.
"""

from __future__ import annotations

from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions


def staging_options(cuda: bool) -> StagingOptions:
    """Pinned buffers and non-blocking copies on CUDA; reused pageable buffers elsewhere."""
    return StagingOptions(
        use_pinned_memory=cuda,
        use_shared_memory=False,  # the writer is a thread of this process, not another process
        use_async_staging=False,
        use_non_blocking_copy=cuda,
    )


def open_stager(cuda: bool) -> DefaultStager:
    """The run's stager (close it after the last save)."""
    return DefaultStager(staging_options(cuda))
