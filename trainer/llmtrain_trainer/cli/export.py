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

from ..checkpoint.stores import open_store, step_name
from ..models.hf import hf_config
from ..models.llama import Llama
from ..storage import LocalStorage, Storage, open_storage

DTYPES = {"bf16": (torch.bfloat16, "bfloat16"), "fp16": (torch.float16, "float16"), "fp32": (torch.float32, "float32")}


def _data_index(uri: str) -> tuple[dict | None, Storage | None]:
    if uri == "synthetic":
        return None, None
    from ..data.loader import INDEX

    storage = open_storage(uri)
    try:
        return json.loads(storage.read_text(INDEX)), storage
    except (OSError, ValueError, KeyError):  # StorageError is an OSError: no index to read
        return None, None


def tokenizer_path(data_uri: str, storage, name) -> str:
    """Where the tokenizer `index.json` names lies: a file of the dataset directory itself, as
    `llmtrain prepare` writes it (the tokenizer's file name beside the shards). The index is input
    from whoever wrote the dataset, and the export goes into a directory meant for publishing, so a
    name that leaves the directory (`../`, an absolute path, a symlink to elsewhere) is refused.
    Local: the resolved path; S3: the object name under the dataset prefix."""
    where = f"{data_uri.rstrip('/')}/index.json"
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise ValueError(
            f"{where}: tokenizer {name!r} is not a file name in the dataset directory (llmtrain "
            'prepare writes the tokenizer\'s file name, e.g. "tokenizer.json", beside the shards); '
            "not exported"
        )
    if not isinstance(storage, LocalStorage):
        return name
    root = os.path.realpath(storage.root)
    path = os.path.realpath(os.path.join(root, name))
    if os.path.dirname(path) != root or not os.path.isfile(path):
        raise ValueError(
            f"{where}: tokenizer {name!r} resolves to {path}, which is not a file in the dataset "
            f"directory {root} (a symlink out of it?); not exported"
        )
    return path


def load_weights(checkpoint_uri: str, dims, step: int | None = None) -> tuple[int, dict[str, torch.Tensor]]:
    """(step, {HF name: whole fp32 tensor}) from the newest complete checkpoint, or `step`.

    Read like a resume (checkpoint/safety.py): a checkpoint holding anything but DCP metadata, plain
    values and tensors raises UnsafeCheckpoint (a ValueError: the CLI prints it), having run nothing."""
    from torch.distributed.checkpoint.api import CheckpointException

    from ..checkpoint.checkpointer import _short, load_checked

    store = open_store(checkpoint_uri)
    steps = store.list_complete()
    if not steps:
        raise FileNotFoundError(f"no complete checkpoint at {checkpoint_uri}")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise FileNotFoundError(f"{checkpoint_uri}: no complete {step_name(step)} (have {', '.join(map(str, steps))})")
    with torch.device("meta"):
        model = Llama(dims)
    weights = {name: torch.empty(p.shape, dtype=torch.float32) for name, p in model.named_parameters()}
    state = {"model": weights}
    try:
        with warnings.catch_warnings():  # "no process group: loading in a single process" is the intent
            warnings.simplefilter("ignore", UserWarning)
            load_checked(state, store.reader(step, 0), no_dist=True)
    except CheckpointException as err:  # a BaseException: the CLI would print DCP's traceback
        raise ValueError(f"{checkpoint_uri.rstrip('/')}/{step_name(step)} does not load: {_short(err)}") from None
    finally:
        store.finish_load(0)
    return step, weights


def export(
    spec: LLMTrainingJobSpec,
    output: str,
    *,
    checkpoint_uri: str | None = None,
    step: int | None = None,
    dtype: str = "bf16",
    max_shard_gb: float = 5.0,
) -> dict:
    from safetensors.torch import save_file

    uri = checkpoint_uri or spec.checkpoint.uri
    if not uri:
        raise ValueError("no checkpoint: the spec has no checkpoint.uri; pass --checkpoint-uri")
    dims = resolve_dims(spec.model)
    # The data index first: a tokenizer it names outside the dataset stops the export before any
    # file is written.
    index, storage = _data_index(spec.data.uri)
    tokenizer = index.get("tokenizer") if index else None
    if tokenizer in (None, "byte"):
        tokenizer = None
    source = tokenizer_path(spec.data.uri, storage, tokenizer) if tokenizer is not None else None
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
    for name, shard in zip(files, shards, strict=True):
        save_file(shard, os.path.join(output, name), metadata=meta)
    if len(shards) > 1:
        weight_map = {
            "metadata": {"total_size": sum(t.numel() * t.element_size() for s in shards for t in s.values())},
            "weight_map": {k: f for f, s in zip(files, shards, strict=True) for k in s},
        }
        with open(os.path.join(output, "model.safetensors.index.json"), "w") as f:
            json.dump(weight_map, f, indent=2)

    eos = index.get("eos_id") if index else None
    cfg = hf_config(dims, torch_dtype=dtype_name, eos_token_id=eos)
    with open(os.path.join(output, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(output, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": eos} if eos is not None else {}, f, indent=2)
    if source is not None:
        dest = os.path.join(output, "tokenizer.json")
        if isinstance(storage, LocalStorage):
            shutil.copyfile(source, dest)  # the resolved path tokenizer_path checked
        else:
            assert storage is not None  # a tokenizer name comes from the index it holds
            storage.download(source, dest)
    return {
        "step": step,
        "checkpoint": meta["llmtrain_checkpoint"],
        "files": files,
        "dtype": dtype_name,
        "tokenizer": tokenizer,
        "parameters": sum(t.numel() for t in weights.values()),
    }
