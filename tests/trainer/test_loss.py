"""The training loss (models/llama.py `cross_entropy`): chunked so that the fp32 logits and their
gradient never exist whole, with the values and gradients of the eager fp32 loss it replaced."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from trainer_reference import eager_cross_entropy

pytestmark = pytest.mark.trainer


def _logits(dtype: torch.dtype, b: int = 3, t: int = 50, v: int = 1000) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(b, t, v, generator=gen) * 3).to(dtype).requires_grad_()
    return x, torch.randint(0, v, (b, t), generator=gen)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_chunked_loss_equals_the_eager_fp32_loss_and_its_gradient(dtype):
    """150 rows in chunks of 16 (the last one ragged), scaled as gradient accumulation scales it."""
    from llmtrain_trainer.models.llama import cross_entropy

    x, t = _logits(dtype)
    want = eager_cross_entropy(x, t)
    (want / 3).backward()
    want_grad, x.grad = x.grad, None
    got = cross_entropy(x, t, chunk_bytes=16 * 1000 * 4)
    (got / 3).backward()
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
    assert x.grad is not None and x.grad.dtype == dtype
    # fp32: summation order only. 16-bit: both gradients are computed in fp32 and rounded once, so
    # they differ by at most one unit in the last place where the fp32 values straddle a rounding edge.
    # (fp16's smallest subnormal is 2^-24: a difference of one there is one unit in the last place.)
    tol = {"rtol": 1e-5, "atol": 1e-9} if dtype == torch.float32 else {"rtol": 2**-7, "atol": 2**-24}
    torch.testing.assert_close(x.grad, want_grad, **tol)


class _LargestFloat32(TorchDispatchMode):
    """The element count of the largest fp32 tensor any op returns while active."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for o in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(o, torch.Tensor) and o.dtype == torch.float32:
                self.largest = max(self.largest, o.numel())
        return out


@pytest.mark.parametrize("loss", ["eager", "chunked"])
def test_the_fp32_logits_never_exist_whole(loss):
    """Defect (issue 32): the eager loss cast the whole bf16 logits to fp32 — with a 128k vocabulary
    and 64k tokens per micro-batch, 33 GB, plus its log-softmax and gradient of the same size. The
    chunked loss holds one chunk of rows in fp32 at a time, in forward and in backward."""
    from llmtrain_trainer.models.llama import cross_entropy

    x, t = _logits(torch.bfloat16)
    chunk_rows = 16
    fn = eager_cross_entropy if loss == "eager" else lambda a, b: cross_entropy(a, b, chunk_bytes=chunk_rows * 1000 * 4)
    with _LargestFloat32() as seen:
        fn(x, t).backward()
    assert x.grad is not None
    if loss == "eager":  # the measurement sees the old cost, so its silence below means something
        assert seen.largest == x.numel()
    else:
        assert seen.largest <= chunk_rows * x.shape[-1], seen.largest


def test_an_fp16_loss_scale_is_applied_before_the_gradient_is_rounded():
    """fp16 training scales the loss (GradScaler: 65536) because the gradient of a mean over many
    tokens, ~1e-4/N per logit, is below fp16's normal range: the scale must multiply the fp32
    gradient before it is rounded to fp16, or the small entries are lost (found by
    test_trainer_rollback's fp16 run while the first chunked version rounded first)."""
    from llmtrain_trainer.models.llama import cross_entropy

    x, t = _logits(torch.float16, b=4, t=256, v=1000)  # 1024 tokens: unscaled entries ~1e-6
    eager = eager_cross_entropy(x, t)
    (eager * 65536.0).backward()
    want, x.grad = x.grad, None
    (cross_entropy(x, t, chunk_bytes=64 * 1000 * 4) * 65536.0).backward()
    assert x.grad is not None
    assert torch.count_nonzero(want) > 0.9 * want.numel()  # the scale did its job for the eager loss
    assert torch.count_nonzero(x.grad) >= torch.count_nonzero(want) - 10
    torch.testing.assert_close(x.grad, want, rtol=2**-9, atol=2**-24)  # one subnormal unit at most
