"""`llmtrain export JOB.yaml -o DIR`: a training checkpoint → a Hugging Face model directory.

Writes `model.safetensors` (or `model-0000k-of-0000n.safetensors` + `model.safetensors.index.json`
above `--max-shard-gb`), `config.json` (`hf.hf_config`: the spec's dimensions, RoPE scaling,
`torch_dtype`, eos/bos when the data index names them), `generation_config.json`, and the
tokenizer file `llmtrain prepare` stored beside the data when there is one — a directory that
`transformers.AutoModelForCausalLM.from_pretrained`, vLLM and the Hub take as is.

The checkpoint is read with DCP in a single process (no process group): DCP reassembles the FSDP
shards, written by any number of ranks, into whole tensors. Only the model weights are read, not
the optimizer state (two thirds of the checkpoint). Parameter names are already the HF names.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings

import torch

from llmtrain.spec import LLMTrainingJobSpec, resolve_dims

from .checkpoint import open_store, step_name
from .hf import hf_config
from .model import Llama

DTYPES = {"bf16": (torch.bfloat16, "bfloat16"), "fp16": (torch.float16, "float16"),
          "fp32": (torch.float32, "float32")}


def _data_index(uri: str) -> tuple[dict | None, object | None]:
    if uri == "synthetic":
        return None, None
    from .data import INDEX, open_storage

    storage = open_storage(uri)
    try:
        return json.loads(storage.read_text(INDEX)), storage
    except (OSError, ValueError, KeyError):
        return None, None
    except Exception as err:  # botocore's ClientError: treat as "no index"
        if type(err).__name__ == "ClientError":
            return None, None
        raise


def load_weights(checkpoint_uri: str, dims, step: int | None = None) -> tuple[int, dict[str, torch.Tensor]]:
    """(step, {HF name: whole fp32 tensor}) from the newest complete checkpoint, or `step`."""
    import torch.distributed.checkpoint as dcp

    store = open_store(checkpoint_uri)
    steps = store.list_complete()
    if not steps:
        raise FileNotFoundError(f"no complete checkpoint at {checkpoint_uri}")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise FileNotFoundError(f"{checkpoint_uri}: no complete {step_name(step)} (have "
                                f"{', '.join(map(str, steps))})")
    with torch.device("meta"):
        model = Llama(dims)
    weights = {name: torch.empty(p.shape, dtype=torch.float32) for name, p in model.named_parameters()}
    state = {"model": weights}
    try:
        with warnings.catch_warnings():  # "no process group: loading in a single process" is the intent
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(state, storage_reader=store.reader(step, 0), no_dist=True)
    finally:
        store.finish_load(0)
    return step, weights


def export(spec: LLMTrainingJobSpec, output: str, *, checkpoint_uri: str | None = None, step: int | None = None,
           dtype: str = "bf16", max_shard_gb: float = 5.0) -> dict:
    from safetensors.torch import save_file

    uri = checkpoint_uri or spec.checkpoint.uri
    if not uri:
        raise ValueError("no checkpoint: the spec has no checkpoint.uri; pass --checkpoint-uri")
    dims = resolve_dims(spec.model)
    step, weights = load_weights(uri, dims, step)
    torch_dtype, dtype_name = DTYPES[dtype]
    os.makedirs(output, exist_ok=True)

    # Shards of at most max_shard_gb, in parameter order (HF's layout for large models).
    limit = int(max_shard_gb * 1e9)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in weights.items():
        t = t.to(torch_dtype).contiguous()
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    meta = {"format": "pt", "llmtrain_checkpoint": f"{uri.rstrip('/')}/{step_name(step)}"}
    if len(shards) == 1:
        files = ["model.safetensors"]
    else:
        files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for name, shard in zip(files, shards):
        save_file(shard, os.path.join(output, name), metadata=meta)
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for s in shards for t in s.values())},
                 "weight_map": {k: f for f, s in zip(files, shards) for k in s}}
        with open(os.path.join(output, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)

    index, storage = _data_index(spec.data.uri)
    eos = index.get("eos_id") if index else None
    cfg = hf_config(dims, torch_dtype=dtype_name, eos_token_id=eos)
    with open(os.path.join(output, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(output, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": eos} if eos is not None else {}, f, indent=2)
    tokenizer = None
    if index and index.get("tokenizer") not in (None, "byte"):
        from .data import check_name

        tokenizer = check_name(index["tokenizer"], f"{spec.data.uri}: index.json tokenizer")
        dest = os.path.join(output, "tokenizer.json")
        if hasattr(storage, "root"):
            shutil.copyfile(os.path.join(storage.root, tokenizer), dest)
        else:
            with open(dest, "w") as f:
                f.write(storage.read_text(tokenizer))
    return {"step": step, "checkpoint": meta["llmtrain_checkpoint"], "files": files, "dtype": dtype_name,
            "tokenizer": tokenizer, "parameters": sum(t.numel() for t in weights.values())}
