"""A Llama-architecture decoder (Llama 2 / Llama 3 family).

Pre-norm transformer: x → x + Attn(RMSNorm(x)) → x + SwiGLU(RMSNorm(x)), then a final RMSNorm and an
untied output projection. The parameter count is exactly `llmtrain.flops.num_params(dims)`; the tests
check that, so the FLOP and MFU figures describe the model that actually trains.

Module and parameter names are the Hugging Face `LlamaForCausalLM` names (`model.embed_tokens`,
`model.layers.N.self_attn.q_proj`, ..., `lm_head`) so a safetensors checkpoint maps onto this model by
name, with no renaming table to keep in sync (see `pretrained.py`). The rotary embedding follows the
same "rotate half" convention as those checkpoints: HF's conversion script permutes the rows of
`q_proj`/`k_proj` so that rotating the two halves of each head equals the original interleaved-pair
rotation, and by using the same convention here the weights load unchanged.

Maths, with d = hidden size, H heads of size q = d/H, K key/value heads (GQA: H/K query heads share
one K/V head), f = MLP width:

    RMSNorm(x)   = x / sqrt(mean(x²) + ε) · g                   (no mean subtraction, no bias)
    RoPE         position p, pair i:  θ_i = base^(-2i/q);  (x₁, x₂) ↦ (x₁cos pθ_i − x₂sin pθ_i,
                                                                   x₂cos pθ_i + x₁sin pθ_i)
                 where x₁ is the first half of the head and x₂ the second (rotate-half layout)
    Attention    softmax(Q·Kᵀ/√q + causal mask)·V per head, via `scaled_dot_product_attention`
                 (flash / memory-efficient kernels where available) with `enable_gqa` so K/V heads
                 are broadcast without materialising H copies
    SwiGLU(x)    = W2 · (silu(W1·x) ⊙ W3·x)                     (W1 = gate_proj, W3 = up_proj, W2 = down_proj)

The model is meant to be built on the meta device (no memory), sharded, and only then materialised
(`init_weights` fills whatever shard each process holds — see `init.py`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own convention
from torch import nn

from llmtrain.catalog import ModelDims


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32: the mean of squares of bf16 activations loses too many bits.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight


def llama3_scaled_frequencies(inv_freq: torch.Tensor, scaling) -> torch.Tensor:
    """Llama 3.1 RoPE scaling: with L = original context, wavelength λ = 2π/f,

        λ < L/high_freq_factor                (high frequencies)   f unchanged
        λ > L/low_freq_factor                 (low frequencies)    f / factor
        otherwise, s = (L/λ − low) / (high − low) ∈ [0, 1]:      (1 − s)·f/factor + s·f

    so the local (short-wavelength) structure the model learned at L is kept and the long
    wavelengths are stretched by `factor` to cover the longer context.
    """
    lo, hi = scaling.low_freq_factor, scaling.high_freq_factor
    L = scaling.original_max_position_embeddings  # noqa: N806 - the L of the docstring and the paper
    wavelen = 2 * math.pi / inv_freq
    s = ((L / wavelen - lo) / (hi - lo)).clamp(0.0, 1.0)
    return torch.where(
        wavelen < L / hi,
        inv_freq,
        torch.where(wavelen > L / lo, inv_freq / scaling.factor, (1 - s) * inv_freq / scaling.factor + s * inv_freq),
    )


def rope_cos_sin(
    head_dim: int, seq_len: int, theta: float, device=None, scaling=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables of shape (seq_len, head_dim), rotate-half layout (each angle appears twice)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    if scaling is not None:
        if scaling.rope_type != "llama3":
            raise ValueError(f"unsupported rope_scaling type {scaling.rope_type!r} (supported: llama3)")
        inv_freq = llama3_scaled_frequencies(inv_freq, scaling)
    t = torch.arange(seq_len, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (batch, heads, seq, head_dim); cos/sin: (seq, head_dim)."""
    return (x * cos + _rotate_half(x) * sin).type_as(x)


class Attention(nn.Module):
    def __init__(self, dims: ModelDims):
        super().__init__()
        self.n_heads = dims.num_heads
        self.n_kv_heads = dims.num_kv_heads
        self.head_dim = dims.head_dim
        d, kv = dims.hidden_size, dims.num_kv_heads * dims.head_dim
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, kv, bias=False)
        self.v_proj = nn.Linear(d, kv, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv_heads != self.n_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, dims: ModelDims):
        super().__init__()
        self.gate_proj = nn.Linear(dims.hidden_size, dims.intermediate_size, bias=False)
        self.up_proj = nn.Linear(dims.hidden_size, dims.intermediate_size, bias=False)
        self.down_proj = nn.Linear(dims.intermediate_size, dims.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """One transformer block: the unit FSDP gathers, checkpoints and compiles."""

    def __init__(self, dims: ModelDims):
        super().__init__()
        self.input_layernorm = RMSNorm(dims.hidden_size, dims.norm_eps)
        self.self_attn = Attention(dims)
        self.post_attention_layernorm = RMSNorm(dims.hidden_size, dims.norm_eps)
        self.mlp = MLP(dims)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """The decoder stack (HF: `LlamaModel`)."""

    def __init__(self, dims: ModelDims):
        super().__init__()
        self.embed_tokens = nn.Embedding(dims.vocab_size, dims.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(dims) for _ in range(dims.num_layers))
        self.norm = RMSNorm(dims.hidden_size, dims.norm_eps)


class Llama(nn.Module):
    """Decoder + output projection (HF: `LlamaForCausalLM`). forward(tokens) → logits."""

    def __init__(self, dims: ModelDims):
        super().__init__()
        self.dims = dims
        self.model = LlamaModel(dims)
        self.lm_head = nn.Linear(dims.hidden_size, dims.vocab_size, bias=False)
        # RoPE tables are derived, never trained or checkpointed (persistent=False); they are
        # rebuilt by `init_rope` after the module leaves the meta device.
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)

    def init_rope(self, device: torch.device | str) -> None:
        cos, sin = rope_cos_sin(
            self.dims.head_dim, self.dims.max_seq_len, self.dims.rope_theta, device, self.dims.rope_scaling
        )
        self.rope_cos, self.rope_sin = cos, sin

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        if t > self.rope_cos.shape[0]:
            raise ValueError(f"sequence length {t} exceeds the model's max_seq_len {self.rope_cos.shape[0]}")
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        h = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            h = layer(h, cos, sin)
        return self.lm_head(self.model.norm(h))


def init_std(name: str, dims: ModelDims) -> float | None:
    """Initial standard deviation of a parameter, or None for "ones" (the RMSNorm gains).

    0.02 everywhere (GPT-2/Llama convention), except the two projections that write into the
    residual stream (o_proj, down_proj): 0.02/√(2L), so the variance of the residual stream after L
    blocks (2L additions) stays O(1) instead of growing linearly with depth.
    """
    if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
        return None
    if name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
        return 0.02 / math.sqrt(2 * dims.num_layers)
    return 0.02


# fp32 bytes of logits one chunk of the loss holds: ~1,000 rows at Llama 3's 128,256-token vocabulary.
LOSS_CHUNK_BYTES = 512 << 20


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of (N, V) logits, in fp32 a chunk of rows at a time, forward and backward,
    so that neither the fp32 logits, their fp32 log-softmax nor their fp32 gradient ever exists
    whole. Forward keeps one fp32 log-sum-exp per row; backward recomputes each chunk's softmax from
    it and writes the gradient, already multiplied by the incoming one (1/accumulation steps, an fp16
    loss scale), in the logits' dtype: rounded once, as autograd through `.float()` rounded it. (The
    multiplier must be applied in fp32 before that rounding: fp16's loss scale exists because the
    unscaled gradient, ~1e-4/token, falls into fp16's subnormals.)"""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, rows: int) -> torch.Tensor:
        n = targets.numel()
        lse = torch.empty(n, dtype=torch.float32, device=logits.device)
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        for start in range(0, n, rows):
            x = logits[start : start + rows].float()
            t = targets[start : start + rows, None]
            chunk_lse = torch.logsumexp(x, dim=-1)
            lse[start : start + rows] = chunk_lse
            total += (chunk_lse - x.gather(1, t).squeeze(1)).sum()
        ctx.save_for_backward(logits, targets, lse)
        ctx.rows = rows
        return total / n

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        logits, targets, lse = ctx.saved_tensors
        rows, n = ctx.rows, targets.numel()
        scale = grad_out.float() / n
        grad = torch.empty_like(logits)
        for start in range(0, n, rows):
            # A copy, also when the logits are fp32: the softmax is computed in place.
            x = logits[start : start + rows].to(torch.float32, copy=True)
            t = targets[start : start + rows, None]
            # d(mean loss)/dx = (softmax(x) − onehot(t)) / N, times the incoming gradient
            x.sub_(lse[start : start + rows, None]).exp_()
            x.scatter_add_(1, t, torch.full_like(t, -1, dtype=x.dtype)).mul_(scale)
            grad[start : start + rows] = x
        return grad, None, None


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, chunk_bytes: int = LOSS_CHUNK_BYTES) -> torch.Tensor:
    """Mean next-token cross-entropy over every target, computed in fp32 (bf16 log-softmax over 128k
    classes is lossy) — by chunks of rows (`_ChunkedCrossEntropy`): with a 128k vocabulary the whole
    fp32 logits and their gradient would be several GB. Equal to `F.cross_entropy(logits.float(),
    targets)` and its gradient up to fp32 summation order."""
    flat, t = logits.flatten(0, 1), targets.flatten(0, 1)
    rows = max(1, chunk_bytes // (flat.shape[-1] * 4))
    return _ChunkedCrossEntropy.apply(flat, t, rows)
