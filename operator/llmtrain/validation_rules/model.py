"""The model: a preset or dimensions that make sense; the URIs' schemes."""

from __future__ import annotations

from collections.abc import Iterator

from ..catalog import model_presets
from .base import Problem, Subject, rule

DATA_SCHEMES = ("synthetic", "s3://", "file://")
STORAGE_SCHEMES = ("s3://", "file://")


@rule("spec.model")
def preset_or_dims(j: Subject) -> Iterator[Problem]:
    """The model is given by exactly one of `preset` (a catalog model) and `dims` (its dimensions).

    Both would leave it open which one the trainer builds; neither names no model."""
    m = j.spec.model
    if (m.preset is None) == (m.dims is None):
        yield Problem(
            "spec.model",
            "give exactly one of preset and dims",
            f"preset: {' | '.join(model_presets())}, or dims: {{hiddenSize, ...}}",
        )


@rule("spec.model.preset", needs=(preset_or_dims,))
def known_preset(j: Subject) -> Iterator[Problem]:
    """The preset is one of the catalog's models (operator/llmtrain/data/models.yaml).

    The CRD's enum says the same at `kubectl apply`; this repeats it for a CRD installed without
    the schema and for `llmtrain validate`."""
    preset = j.spec.model.preset
    if preset is not None and preset not in model_presets():
        yield Problem("spec.model.preset", f"unknown preset {preset!r}", " | ".join(model_presets()))


@rule("spec.model.dims.numHeads", needs=(preset_or_dims,))
def heads_divide_hidden(j: Subject) -> Iterator[Problem]:
    """numHeads divides hiddenSize.

    Each attention head gets hiddenSize / numHeads of the hidden dimension."""
    d = j.spec.model.dims
    if d is not None and d.hidden_size % d.num_heads:
        yield Problem(
            "spec.model.dims.numHeads",
            f"hiddenSize {d.hidden_size} is not divisible by numHeads {d.num_heads}",
            "a divisor of hiddenSize",
        )


@rule("spec.model.dims.numHeads", needs=(heads_divide_hidden,))
def even_head_dim(j: Subject) -> Iterator[Problem]:
    """The head dimension hiddenSize / numHeads is even.

    Rotary position embeddings rotate the head dimension's values in pairs."""
    d = j.spec.model.dims
    if d is not None and (d.hidden_size // d.num_heads) % 2:
        yield Problem(
            "spec.model.dims.numHeads",
            "the head dimension hiddenSize/numHeads is odd; rotary embeddings rotate pairs",
            "numHeads giving an even head dimension",
        )


@rule("spec.model.dims.numKvHeads", needs=(preset_or_dims,))
def kv_heads_divide_heads(j: Subject) -> Iterator[Problem]:
    """numKvHeads divides numHeads.

    Grouped-query attention shares each key/value head among numHeads / numKvHeads query heads."""
    d = j.spec.model.dims
    if d is not None and d.num_heads % d.num_kv_heads:
        yield Problem(
            "spec.model.dims.numKvHeads",
            f"numHeads {d.num_heads} is not a multiple of numKvHeads {d.num_kv_heads} (grouped-query attention)",
            "a divisor of numHeads",
        )


MODEL_RULES = (preset_or_dims, known_preset, heads_divide_hidden, even_head_dim, kv_heads_divide_heads)


def _uri_problem(field: str, uri: str | None, schemes: tuple[str, ...]) -> list[Problem]:
    """`schemes` holds URI prefixes ("s3://") and bare keywords ("synthetic")."""
    prefixes = [s for s in schemes if s.endswith("://")]
    if uri is None or (uri in schemes and uri not in prefixes):
        return []
    if not any(uri.startswith(s) for s in prefixes):
        return [
            Problem(field, f"unsupported URI {uri!r}", " | ".join(s + "…" if s in prefixes else s for s in schemes))
        ]
    if uri in prefixes:
        return [Problem(field, f"{uri!r} names no bucket or path", f"{' | '.join(schemes)} with a path")]
    return []


@rule("spec.model.pretrainedUri", "spec.data.uri", "spec.checkpoint.uri")
def uri_schemes(j: Subject) -> Iterator[Problem]:
    """Each URI has a scheme the trainer reads and names a bucket or a path: `s3://…` or `file://…`,
    and for the data also `synthetic`.

    The trainer reads weights, tokens and checkpoints from S3 or from a mounted file system
    (FSx for Lustre, a PVC) and nowhere else."""
    s = j.spec
    yield from _uri_problem("spec.model.pretrainedUri", s.model.pretrained_uri, STORAGE_SCHEMES)
    yield from _uri_problem("spec.data.uri", s.data.uri, DATA_SCHEMES)
    yield from _uri_problem("spec.checkpoint.uri", s.checkpoint.uri, STORAGE_SCHEMES)
