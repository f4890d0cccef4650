"""The worker's inputs: the job spec (wire JSON/YAML) and the job identity, from args and env."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import yaml

from llmtrain.defaults import resolve
from llmtrain.spec import LLMTrainingJobSpec, TrainingSpec


def parse_spec(text: str) -> LLMTrainingJobSpec:
    """A spec as JSON or YAML: either the spec object itself or a whole LLMTrainingJob document."""
    doc = yaml.safe_load(text)  # JSON is YAML
    if isinstance(doc, dict) and "spec" in doc and "kind" in doc:
        doc = doc["spec"]
    return resolve(LLMTrainingJobSpec.model_validate(doc))


def load_spec(path: str | None) -> LLMTrainingJobSpec:
    if path:
        with open(path) as f:
            return parse_spec(f.read())
    text = os.environ.get("LLMTRAIN_SPEC")
    if not text:
        raise SystemExit("no job spec: pass --spec FILE or set LLMTRAIN_SPEC")
    return parse_spec(text)


def load_job_file(path: str) -> tuple[dict, LLMTrainingJobSpec]:
    """(document, spec) of an LLMTrainingJob YAML file, via `llmtrain.validation.load_job` (which
    explains every problem) when available."""
    try:
        from llmtrain.validation import load_job
    except ImportError:
        load_job = None  # type: ignore[assignment]  # an operator package without it: see below
    if load_job is not None:
        job = load_job(path)
        return job.document, job.spec
    with open(path) as f:
        doc = yaml.safe_load(f)
    return doc, resolve(LLMTrainingJobSpec.model_validate(doc["spec"]))


@dataclass(frozen=True)
class JobIdentity:
    name: str
    namespace: str
    attempt: int

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def from_env(cls) -> JobIdentity:
        return cls(
            os.environ.get("LLMTRAIN_JOB_NAME", "local"),
            os.environ.get("LLMTRAIN_JOB_NAMESPACE", "default"),
            int(os.environ.get("LLMTRAIN_ATTEMPT", "0")),
        )


def global_batch_seqs(spec: LLMTrainingJobSpec) -> int:
    """Sequences per optimizer step: globalBatchTokens / seqLen (at least one)."""
    assert spec.training.global_batch_tokens is not None and spec.data.seq_len is not None, "unresolved spec"
    return max(1, spec.training.global_batch_tokens // spec.data.seq_len)


def lr_at(step: int, t: TrainingSpec) -> float:
    """Learning rate for optimizer step `step` (1-based).

    Linear warmup from lr/warmup to lr over `warmupSteps`, then decay to `minLearningRate` at
    `maxSteps` (default learningRate/10): cosine  min + (max−min)·½(1 + cos πp), linear  max − (max−min)·p, or constant,
    with p = (step − warmup) / (maxSteps − warmup) ∈ [0, 1].
    """
    if t.warmup_steps and step <= t.warmup_steps:
        return t.learning_rate * step / t.warmup_steps
    if t.lr_schedule == "constant":
        return t.learning_rate
    assert t.warmup_steps is not None, "unresolved spec: training.warmupSteps"
    p = min(1.0, (step - t.warmup_steps) / max(1, t.max_steps - t.warmup_steps))
    floor = t.learning_rate / 10 if t.min_learning_rate is None else t.min_learning_rate
    lo, hi = min(floor, t.learning_rate), t.learning_rate
    if t.lr_schedule == "linear":
        return hi - (hi - lo) * p
    return lo + (hi - lo) * 0.5 * (1 + math.cos(math.pi * p))


def local_path(uri: str) -> str:
    """Filesystem path of `file:///abs`, `file://rel/ative` (relative to the working directory) or a
    plain path."""
    return uri[len("file://") :] if uri.startswith("file://") else uri


def dumps(obj) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=False, default=str)
