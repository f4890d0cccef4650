"""The optimizer builder (optimizer.py): fused AdamW where the parameters allow it, and the same
trajectory as the `foreach` AdamW the trainer used before."""

from __future__ import annotations

import pytest
import torch

from conftest import base_spec
from llmtrain.defaults import resolve
from llmtrain.spec import LLMTrainingJobSpec

pytestmark = pytest.mark.trainer


def _spec() -> LLMTrainingJobSpec:
    return resolve(LLMTrainingJobSpec.model_validate(base_spec()))


def test_the_trainer_optimizer_is_fused_on_the_devices_that_have_the_kernels():
    from trainer_reference import reference_model

    from llmtrain_trainer.train import build_optimizer

    opt = build_optimizer(reference_model(_spec()), _spec())
    assert {g["fused"] for g in opt.param_groups} == {True}, "fp32 parameters on the CPU: fused AdamW"
    assert not any(g["foreach"] for g in opt.param_groups)
    # A device type without fused kernels in the pinned torch: foreach.
    with torch.device("meta"):
        meta = torch.nn.Linear(4, 4)
    opt = build_optimizer(meta, _spec())
    assert {g["foreach"] for g in opt.param_groups} == {True} and not any(g["fused"] for g in opt.param_groups)


def test_fused_adamw_follows_the_foreach_trajectory():
    """Ten steps of the tiny model on one batch (so that the loss falls), weight decay and clipping
    included: the losses and the final weights of fused AdamW are foreach's within fp32 rounding."""
    from trainer_reference import eager_cross_entropy, reference_model

    from llmtrain_trainer.job_config import OptimizerConfig
    from llmtrain_trainer.optimizer import clip_grad_norm
    from llmtrain_trainer.train import build_optimizer

    spec = _spec()
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 256, (4, 33), generator=gen)] * 10
    runs = {}
    for impl in ("foreach", "fused"):
        model = reference_model(spec)
        opt = build_optimizer(model, spec, implementation=impl)
        losses = []
        for b in batches:
            loss = eager_cross_entropy(model(b[:, :-1]), b[:, 1:])
            loss.backward()
            clip_grad_norm(list(model.parameters()), OptimizerConfig.from_spec(spec))
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        runs[impl] = (losses, {n: p.detach().clone() for n, p in model.named_parameters()})
    (l_foreach, w_foreach), (l_fused, w_fused) = runs["foreach"], runs["fused"]
    assert l_foreach[-1] < l_foreach[0] - 0.5, l_foreach  # it trains, so the comparison means something
    assert l_fused == pytest.approx(l_foreach, rel=1e-5)
    # Weights within 1e-5 absolute (they are ~0.02, moved by lr 0.02 per step): Adam divides by √v,
    # so the last-bit differences of the two kernels grow where v is tiny (embedding rows of tokens
    # absent from the batch); 4e-6 measured.
    for name, w in w_foreach.items():
        torch.testing.assert_close(w_fused[name], w, rtol=1e-4, atol=1e-5)
