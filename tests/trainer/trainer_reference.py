"""The single-process reference: a plain PyTorch training loop, no FSDP, no trainer machinery.

It shares with the trainer only what defines the experiment — the model class, the initial weights,
the data samples, the optimizer hyper-parameters and LR schedule — and computes the step's batch
itself: global samples [s·G, (s+1)·G) in the dataset's order, G micro-batches-worth of mean
cross-entropy averaged over gradient-accumulation steps. Every distributed configuration must
reproduce its losses.

It keeps the trainer's first implementation of the loss and the optimizer — eager fp32
`F.cross_entropy` over the whole logits, AdamW with `foreach` — so that every faster implementation
the trainer adopts since (fused AdamW, the chunked loss) is checked against the old numerics, not
against itself.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own convention

from llmtrain.defaults import resolve
from llmtrain.spec import LLMTrainingJobSpec, resolve_dims
from llmtrain_trainer.config import global_batch_seqs, lr_at
from llmtrain_trainer.data.loader import open_dataset
from llmtrain_trainer.models.init import init_weights
from llmtrain_trainer.models.llama import Llama
from llmtrain_trainer.train import build_optimizer


def reference_model(spec: LLMTrainingJobSpec, seed: int | None = None) -> Llama:
    model = Llama(resolve_dims(spec.model))
    model.init_rope("cpu")
    init_weights(model, spec.training.seed if seed is None else seed)
    return model


def eager_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The trainer's loss before the chunked one: the whole logits cast to fp32, then the mean."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


def global_batch(ds, step: int, g: int) -> torch.Tensor:
    """Samples of (0-based) step `step`, in order."""
    import numpy as np

    parts = [ds.read_segment(*seg) for seg in ds.segments(step * g, g)]
    return torch.from_numpy(np.concatenate(parts))


def reference_losses(wire_spec: dict, steps: int | None = None, model: Llama | None = None) -> dict[int, float]:
    spec = resolve(LLMTrainingJobSpec.model_validate(wire_spec))
    t = spec.training
    torch.manual_seed(t.seed)
    model = model or reference_model(spec)
    opt = build_optimizer(model, spec, implementation="foreach")
    g = global_batch_seqs(spec)
    ds = open_dataset(spec.data.uri, spec.data.seq_len, t.seed, model.dims.vocab_size)
    accum = g // t.micro_batch_size
    losses = {}
    for s in range(steps or t.max_steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(s + 1, t)
        total = 0.0
        for mb in global_batch(ds, s, g).split(t.micro_batch_size):
            loss = eager_cross_entropy(model(mb[:, :-1]), mb[:, 1:]) / accum
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses[s + 1] = total
    return losses
