"""Training defaults derived from what the user set, never fixed numbers that can contradict it.

A fixed default can make a valid spec invalid (`warmupSteps: 100` with `maxSteps: 12`) or unusable
(4 Mi tokens per step for the tiny model on CPU workers: minutes per step). So the two defaults
that depend on the rest of the spec (and the sequence length) are derived when the user leaves them unset:

- ``data.seqLen``: 2048, or the model's context length (``maxSeqLen``) when that is shorter
  (the ``tiny`` preset has 256).
- ``training.warmupSteps``: 10% of ``maxSteps``, at most 100 (the old fixed default, which
  is what a run of 1,000 or more steps still gets). Always below ``maxSteps``.
- ``training.globalBatchTokens``: the usual batch for the model's size on GPUs (GPT-3 table 2.1
  and Llama 2 use about 0.5 Mi tokens below 1 B parameters and 4 Mi for 7 B and up; we take
  0.5 Mi below 1 B, else 4 Mi), rounded to the nearest multiple of one micro-step of every worker
  (seqLen × microBatchSize × workers) so the batch arithmetic always holds. On CPU workers (the
  ``cpu`` instance type: a laptop or CI) it is exactly one micro-step, no gradient accumulation.

- ``resilience.preflight``: on for GPU instance types with 2 or more nodes (where a slow EFA link or
  a bad GPU costs a whole gang and the check's minute is cheap), off on CPU and single nodes.

`resolve(spec)` is an explicit step after validation (`validation.parse_spec`, the trainer's
`config.parse_spec`), not a side effect of building the model: the operator resolves each job
generation once, and the renderer (the trainer's LLMTRAIN_SPEC), `llmtrain validate`/`plan` and the
trainer all see the same resolved values; the CLI shows which fields were derived and why
(`explain`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .catalog import instance_types, model_presets

if TYPE_CHECKING:
    from .spec import LLMTrainingJobSpec

DEFAULT_SEQ_LEN = 2048
MAX_DEFAULT_WARMUP = 100
SMALL_MODEL_PARAMS = 1_000_000_000
SMALL_MODEL_BATCH_TOKENS = 512 * 1024
LARGE_MODEL_BATCH_TOKENS = 4 * 1024 * 1024


def warmup_steps(max_steps: int) -> int:
    return min(MAX_DEFAULT_WARMUP, max_steps // 10)


def _dims(spec: LLMTrainingJobSpec):
    from .catalog import ModelDims

    m = spec.model
    if m.dims is not None:
        return ModelDims(**m.dims.model_dump())
    return model_presets().get(m.preset or "")  # None: an unknown preset is validation's to report


def _num_params(spec: LLMTrainingJobSpec) -> int | None:
    from .flops import num_params

    dims = _dims(spec)
    return num_params(dims) if dims else None


def global_batch_tokens(spec: LLMTrainingJobSpec) -> tuple[int, str]:
    """(tokens, why) for a spec whose globalBatchTokens is unset."""
    inst = instance_types().get(spec.cluster.instance_type)
    workers = spec.cluster.nodes * (inst.workers_per_node(spec.cluster.processes_per_node) if inst else 1)
    micro = spec.data.seq_len * spec.training.micro_batch_size * workers  # type: ignore[operator]  # seqLen resolved first
    step = f"seqLen × microBatchSize × workers = {spec.data.seq_len} × {spec.training.micro_batch_size} × {workers}"
    if inst is None or not inst.is_gpu:
        return micro, f"one micro-step of every worker ({step}) on CPU workers"
    params = _num_params(spec)
    small = params is not None and params < SMALL_MODEL_PARAMS
    target = SMALL_MODEL_BATCH_TOKENS if small else LARGE_MODEL_BATCH_TOKENS
    tokens = max(1, round(target / micro)) * micro
    size = f"{params / 1e9:.2f} B parameters" if params is not None else "model size unknown"
    return tokens, f"about {target // 1024} Ki tokens for {size}, rounded to a multiple of {step}"


# Start-up allowance before the first step: what a worker reads before it can train, at a rate
# that even a congested S3 prefix or a busy FSx volume sustains per node.
LOAD_BYTES_PER_SECOND = 100e6
STATE_BYTES_PER_PARAM = 16  # fp32 weights + two AdamW moments + bf16 copy: a checkpoint's share
PRETRAINED_BYTES_PER_PARAM = 2  # bf16 safetensors, read whole by every node


def first_step_timeout_minutes(spec: LLMTrainingJobSpec) -> tuple[int, str]:
    """(minutes, why) for an unset resilience.firstStepTimeoutMinutes: the hang timeout plus the
    time a node needs to read what it loads before its first step (its shard of the checkpoint, or
    the whole pretrained model) at LOAD_BYTES_PER_SECOND."""
    params = _num_params(spec) or 0
    per_node = max(
        params * STATE_BYTES_PER_PARAM / spec.cluster.nodes,
        params * PRETRAINED_BYTES_PER_PARAM if spec.model.pretrained_uri else 0,
    )
    load = math.ceil(per_node / LOAD_BYTES_PER_SECOND / 60)
    hang = spec.resilience.hang_timeout_minutes
    return hang + load, (
        f"hangTimeoutMinutes ({hang}) + {load} min to read {per_node / 1e9:.1f} GB "
        f"per node at {LOAD_BYTES_PER_SECOND / 1e6:.0f} MB/s"
    )


def preflight(spec: LLMTrainingJobSpec) -> tuple[bool, str]:
    """(on, why) for a spec whose resilience.preflight is unset."""
    inst = instance_types().get(spec.cluster.instance_type)
    if inst is None or not inst.is_gpu:
        return False, "off on CPU workers"
    if spec.cluster.nodes < 2:
        return False, "off for a single node (no inter-node links to test)"
    return True, f"on for a GPU job of {spec.cluster.nodes} nodes"


def resolve(spec: LLMTrainingJobSpec) -> LLMTrainingJobSpec:
    """Fill the unset derived fields of ``spec`` in place (seqLen first: the batch depends on it);
    returns ``spec``."""
    if spec.data.seq_len is None:
        dims = _dims(spec)
        spec.data.seq_len = min(DEFAULT_SEQ_LEN, dims.max_seq_len) if dims else DEFAULT_SEQ_LEN
    t = spec.training
    if t.warmup_steps is None:
        t.warmup_steps = warmup_steps(t.max_steps)
    if t.global_batch_tokens is None:
        t.global_batch_tokens = global_batch_tokens(spec)[0]
    if spec.resilience.first_step_timeout_minutes is None:
        spec.resilience.first_step_timeout_minutes = min(10080, first_step_timeout_minutes(spec)[0])
    if spec.resilience.preflight is None:
        spec.resilience.preflight = preflight(spec)[0]
    return spec


def explain(raw_spec: dict, spec: LLMTrainingJobSpec) -> dict[str, str]:
    """The fields `resolve` filled for the wire spec ``raw_spec`` (resolved as ``spec``): name → why."""
    data, training = raw_spec.get("data") or {}, raw_spec.get("training") or {}
    why = {}
    if "seqLen" not in data:
        why["data.seqLen"] = (
            f"the model's context length, shorter than {DEFAULT_SEQ_LEN}"
            if spec.data.seq_len < DEFAULT_SEQ_LEN  # type: ignore[operator]  # resolved above
            else f"{DEFAULT_SEQ_LEN}"
        )
    if "warmupSteps" not in training:
        why["training.warmupSteps"] = f"10% of maxSteps ({spec.training.max_steps}), at most {MAX_DEFAULT_WARMUP}"
    if "globalBatchTokens" not in training:
        why["training.globalBatchTokens"] = global_batch_tokens(spec)[1]
    if "firstStepTimeoutMinutes" not in (raw_spec.get("resilience") or {}):
        why["resilience.firstStepTimeoutMinutes"] = first_step_timeout_minutes(spec)[1]
    if "preflight" not in (raw_spec.get("resilience") or {}):
        why["resilience.preflight"] = preflight(spec)[1]
    return why
