"""Initial weights from Hugging Face-format safetensors, loaded straight into the FSDP shards.

Parameter names are the HF `LlamaForCausalLM` names (see `llama.py`), so the mapping is the identity.
Each process reads, for every parameter, only the rows of its own shard: safetensors' `get_slice`
memory-maps the file and `slice[row0:row0+n]` touches just those bytes. No process ever holds a whole
parameter, let alone the whole model.

Sources: a `.safetensors` file, a directory of them (a sharded HF checkpoint, with or without
`model.safetensors.index.json`), `file://` of either, or an `s3://` prefix/object, which local rank 0
of each node downloads once into a node-local cache (the other local ranks wait at a barrier).
Models with tied embeddings (no `lm_head.weight`) take the output projection from `embed_tokens`.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import tempfile

import torch
import torch.distributed as dist
from torch import nn

from .init import canonical_name, local_rows

log = logging.getLogger(__name__)


def _download_s3(uri: str, local_rank: int, cache_dir: str | None) -> str:
    """The node-local copy of the weights at `uri` (local rank 0 downloads, the node's others wait)."""
    from ..storage.s3 import S3Storage, split_uri

    bucket, prefix = split_uri(uri)
    key_or_prefix = uri[5 + len(bucket) + 1 :]
    cache = os.path.join(cache_dir or tempfile.gettempdir(), "llmtrain-pretrained", bucket, key_or_prefix.strip("/"))
    if local_rank == 0:
        st = S3Storage(f"s3://{bucket}/")
        if key_or_prefix.endswith(".safetensors"):
            os.makedirs(os.path.dirname(cache), exist_ok=True)
            st.download(key_or_prefix, cache)
        else:
            os.makedirs(cache, exist_ok=True)
            for e in st.list(prefix):
                if e.name.endswith((".safetensors", "/config.json")):
                    st.download(e.name, os.path.join(cache, os.path.basename(e.name)))
    if dist.is_initialized():
        dist.barrier()
    return cache


def safetensors_files(uri: str, local_rank: int = 0, cache_dir: str | None = None) -> list[str]:
    from ..config import local_path

    path = _download_s3(uri, local_rank, cache_dir) if uri.startswith("s3://") else local_path(uri)
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    else:
        files = [path]
    if not files or not all(os.path.isfile(f) for f in files):
        raise FileNotFoundError(f"no .safetensors files at {uri}")
    return files


def check_config(files: list[str], uri: str, dims) -> dict | None:
    """The checkpoint's config.json (beside the safetensors), compared with the spec: a mismatch in
    anything that changes the logits (dimensions, rope_theta, RoPE scaling, rms_norm_eps) is an
    error, not a silently wrong model. None when there is no config.json (only shapes are checked)."""
    from .hf import config_mismatches

    path = os.path.join(os.path.dirname(files[0]), "config.json")
    if not os.path.isfile(path):
        log.warning(
            "%s: no config.json beside the weights: only tensor shapes can be checked, not "
            "rope_theta, RoPE scaling or rms_norm_eps",
            uri,
        )
        return None
    with open(path) as f:
        cfg = json.load(f)
    problems = config_mismatches(cfg, dims)
    if problems:
        raise ValueError(
            f"model.pretrainedUri {uri}: its config.json does not match spec.model:\n  " + "\n  ".join(problems)
        )
    return cfg


@torch.no_grad()
def load_pretrained(model: nn.Module, uri: str, *, local_rank: int = 0, cache_dir: str | None = None) -> int:
    """Copy each parameter's local shard from the safetensors at `uri`; returns parameters loaded.
    S3 weights are downloaded once per node, by local rank 0, under `cache_dir` (None: the temp dir)."""
    from safetensors import safe_open

    files = safetensors_files(uri, local_rank, cache_dir)
    check_config(files, uri, model.dims)
    handles = [safe_open(f, framework="pt") for f in files]
    where = {k: h for h in handles for k in h.keys()}
    loaded = 0
    for name, p in model.named_parameters():
        key = canonical_name(name)
        if key not in where and key == "lm_head.weight":
            key = "model.embed_tokens.weight"  # tied embeddings
        if key not in where:
            raise KeyError(f"{uri}: no tensor {key!r} (have e.g. {sorted(where)[:5]})")
        sl = where[key].get_slice(key)
        shape = tuple(sl.get_shape())
        if shape != tuple(p.shape):
            raise ValueError(f"{key}: checkpoint shape {shape} != model shape {tuple(p.shape)}")
        local, row0, n = local_rows(p)
        if local.numel():
            local.copy_(sl[row0 : row0 + n].to(local.dtype))
        loaded += 1
    return loaded
