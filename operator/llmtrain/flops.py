"""Parameter and FLOP counts for a Llama-architecture decoder, and MFU.

Parameters (untied input embedding and output projection, as in Llama 2/3), with d = hidden size,
L = layers, f = MLP intermediate size, V = vocabulary, q = head dim, k = KV heads:

    per block   attention  d·d (Wq) + 2·d·(k·q) (Wk, Wv) + d·d (Wo)
                SwiGLU MLP 3·d·f (W1, W3 gate/up, W2 down)
                2 RMSNorm  2·d
    total       V·d (embedding) + L·block + d (final norm) + V·d (output)

For llama2-7b this gives 6,738,415,616, the published 6.74B; it is the independent check in tests.

FLOPs per token for one training step (forward + backward), following PaLM appendix B and
torchtitan:

    6·N + 12·L·H·q·T

N is the parameter count without the input embedding (a lookup, not a matmul; the output
projection is a real matmul and stays in). Each matmul weight costs 2 FLOPs per token forward
(multiply + add) and 4 backward (gradients w.r.t. input and weight): 6·N. Attention scores and
their weighted sum are matmuls whose cost grows with the sequence length T: per layer and token
2·H·q·T forward for Q·Kᵀ and the same for A·V, i.e. 4·H·q·T forward, 12·H·q·T forward + backward.
This counts the full T×T score matrix even under a causal mask (the convention the reference MFU
figures use), so MFU from it is comparable with torchtitan's and PaLM's.

MFU = achieved FLOP/s ÷ peak FLOP/s = (tokens/s per device · FLOPs per token) ÷ peak per device,
peak from the instance catalog (dense BF16 on GPUs).
"""

from __future__ import annotations

from .catalog import ModelDims


def num_params(dims: ModelDims) -> int:
    d, f, L, V = dims.hidden_size, dims.intermediate_size, dims.num_layers, dims.vocab_size
    kv = dims.num_kv_heads * dims.head_dim
    block = 2 * d * d + 2 * d * kv + 3 * d * f + 2 * d
    return V * d + L * block + d + V * d


def embedding_params(dims: ModelDims) -> int:
    return dims.vocab_size * dims.hidden_size


def block_params(dims: ModelDims) -> int:
    """Parameters of one transformer block (what FSDP gathers at a time)."""
    return (num_params(dims) - 2 * embedding_params(dims) - dims.hidden_size) // dims.num_layers


def flops_per_token(dims: ModelDims, seq_len: int) -> int:
    n_matmul = num_params(dims) - embedding_params(dims)
    attention = 12 * dims.num_layers * dims.num_heads * dims.head_dim * seq_len
    return 6 * n_matmul + attention


def mfu(tokens_per_second_per_device: float, flops_per_tok: float, peak_flops_per_device: float) -> float:
    return tokens_per_second_per_device * flops_per_tok / peak_flops_per_device
