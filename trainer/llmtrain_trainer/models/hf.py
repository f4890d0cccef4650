"""Hugging Face `config.json` ↔ the spec's model dimensions (one mapping, used both ways).

`pretrained.py` compares a checkpoint's config.json with the spec and refuses what differs (a
Llama 3.1 checkpoint with `rope_scaling` loaded as plain Llama 3 gives wrong logits silently, and a
wrong `rope_theta` or `rms_norm_eps` would too); `cli/export.py` writes the config.json of an exported
model. Both the legacy keys (`rope_theta`, `rope_scaling`, as in the released Llama 3.x configs) and
transformers 5's `rope_parameters` are read; the legacy keys are written, which every transformers
version and vLLM read.
"""

from __future__ import annotations

import math

from llmtrain.catalog import ModelDims, RopeScaling

LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def hf_config(
    dims: ModelDims,
    *,
    torch_dtype: str = "float32",
    tie_word_embeddings: bool = False,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
) -> dict:
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": dims.hidden_size,
        "intermediate_size": dims.intermediate_size,
        "num_hidden_layers": dims.num_layers,
        "num_attention_heads": dims.num_heads,
        "num_key_value_heads": dims.num_kv_heads,
        "head_dim": dims.head_dim,
        "vocab_size": dims.vocab_size,
        "max_position_embeddings": dims.max_seq_len,
        "rope_theta": dims.rope_theta,
        "rms_norm_eps": dims.norm_eps,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": tie_word_embeddings,
        "torch_dtype": torch_dtype,
        "rope_scaling": None
        if dims.rope_scaling is None
        else {"rope_type": dims.rope_scaling.rope_type, **{k: getattr(dims.rope_scaling, k) for k in LLAMA3_KEYS}},
    }
    if bos_token_id is not None:
        cfg["bos_token_id"] = bos_token_id
    if eos_token_id is not None:
        cfg["eos_token_id"] = eos_token_id
    return cfg


def _rope(cfg: dict) -> tuple[float, RopeScaling | None, str]:
    """(rope_theta, llama3 scaling or None, rope type) from either config style."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default")) if params else "default"
    if kind == "llama3":
        return theta, RopeScaling(**{k: params[k] for k in LLAMA3_KEYS}), kind
    return theta, None, kind


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)


def config_mismatches(cfg: dict, dims: ModelDims) -> list[str]:
    """Every difference between a Hugging Face config.json and the spec's dimensions, as
    "field: checkpoint X, spec Y" lines (empty: the checkpoint fits this model exactly)."""
    out: list[str] = []
    arch = cfg.get("model_type", "llama")
    if arch != "llama":
        out.append(f"model_type: checkpoint {arch!r}, this trainer builds 'llama' (LlamaForCausalLM)")
    heads = cfg.get("num_attention_heads")
    pairs = [
        ("hidden_size", cfg.get("hidden_size"), dims.hidden_size, "model.dims.hiddenSize"),
        ("intermediate_size", cfg.get("intermediate_size"), dims.intermediate_size, "model.dims.intermediateSize"),
        ("num_hidden_layers", cfg.get("num_hidden_layers"), dims.num_layers, "model.dims.numLayers"),
        ("num_attention_heads", heads, dims.num_heads, "model.dims.numHeads"),
        ("num_key_value_heads", cfg.get("num_key_value_heads", heads), dims.num_kv_heads, "model.dims.numKvHeads"),
        ("vocab_size", cfg.get("vocab_size"), dims.vocab_size, "model.dims.vocabSize"),
    ]
    if cfg.get("head_dim") is not None:
        pairs.append(("head_dim", cfg["head_dim"], dims.head_dim, "hiddenSize / numHeads"))
    for key, theirs, ours, field in pairs:
        if theirs != ours:
            out.append(f"{key}: checkpoint {theirs}, spec {ours} ({field})")
    eps = float(cfg.get("rms_norm_eps", 1e-6))
    if not _close(eps, dims.norm_eps):
        out.append(f"rms_norm_eps: checkpoint {eps:g}, spec {dims.norm_eps:g} (model.dims.normEps)")
    theta, scaling, kind = _rope(cfg)
    if not _close(theta, dims.rope_theta):
        out.append(f"rope_theta: checkpoint {theta:g}, spec {dims.rope_theta:g} (model.dims.ropeTheta)")
    if kind not in ("default", "llama3"):
        out.append(f"rope scaling type {kind!r} is not supported (supported: none, llama3)")
    elif scaling != dims.rope_scaling:
        want = (
            "none"
            if scaling is None
            else (
                f"{{ropeType: llama3, factor: {scaling.factor:g}, "
                f"lowFreqFactor: {scaling.low_freq_factor:g}, highFreqFactor: "
                f"{scaling.high_freq_factor:g}, originalMaxPositionEmbeddings: "
                f"{scaling.original_max_position_embeddings}}}"
            )
        )
        out.append(
            f"rope_scaling: checkpoint {want}, spec {dims.rope_scaling or 'none'} "
            "(model.dims.ropeScaling, or a llama3.1-* preset)"
        )
    for key, ok in (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False)):
        if key in cfg and cfg[key] != ok:
            out.append(f"{key}: checkpoint {cfg[key]!r}, this trainer's Llama has {ok!r}")
    return out
