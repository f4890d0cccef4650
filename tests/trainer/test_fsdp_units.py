"""FSDP units (distributed/parallel.py `parallelize`): torchtitan's boundaries — the embeddings
alone, each block, [final norm, lm_head] together, and a root that holds no parameters."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.trainer


def _gathered(model: torch.nn.Module) -> set[str]:
    """Names of the parameters held whole right now (FSDP2 swaps in plain tensors for DTensors)."""
    from torch.distributed.tensor import DTensor

    return {n for n, p in model.named_parameters() if not isinstance(p, DTensor)}


def test_embeddings_alone_and_norm_with_lm_head_are_their_own_units(one_process_group):
    """Defect (issue 32): the embeddings, the final norm and lm_head were left in the root unit,
    gathered together at the step's start with nothing to overlap and reduced after all of backward."""
    from types import SimpleNamespace

    from torch.distributed.fsdp import FSDPModule

    from llmtrain.catalog import model_preset
    from llmtrain_trainer.distributed.parallel import build_mesh, parallelize
    from llmtrain_trainer.models.llama import Llama

    fsdp = SimpleNamespace(
        sharding_strategy="FULL_SHARD",
        mixed_precision="fp32",
        cpu_offload=False,
        activation_checkpointing="none",
        compile=False,
        float8=False,
    )
    with torch.device("meta"):
        model = Llama(model_preset("tiny"))
    parallelize(model, build_mesh("FULL_SHARD", "cpu", 1, 1), fsdp, torch.device("cpu"))
    model.to_empty(device="cpu")
    embed, norm, head = model.model.embed_tokens, model.model.norm, model.lm_head
    assert all(isinstance(m, FSDPModule) for m in (embed, norm, head, *model.model.layers))
    assert _gathered(model) == set()
    model.unshard()  # the root's own unit: no parameters left in it
    assert _gathered(model) == set()
    embed.unshard()
    assert _gathered(model) == {"model.embed_tokens.weight"}
    embed.reshard()
    head.unshard()  # one unit with the final norm
    assert _gathered(model) == {"model.norm.weight", "lm_head.weight"}
    head.reshard()
    assert _gathered(model) == set()
