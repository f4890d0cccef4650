"""The worker's inputs: the job spec (wire JSON/YAML), the job identity and the worker's environment
(`WorkerEnv`: the one place a worker reads torchrun's and the operator's variables)."""

from __future__ import annotations

import json
import math
import os
import socket
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field

import yaml

from llmtrain.defaults import resolve
from llmtrain.pod_contract import (
    ATTEMPT_ENV,
    JOB_NAME_ENV,
    JOB_NAMESPACE_ENV,
    METRICS_PORT,
    METRICS_PORT_ENV,
    NODE_NAME_ENV,
    RESUME_BEFORE_STEP_ENV,
    SNAPSHOT_DIR_ENV,
    SNAPSHOT_PATH,
    SPEC_ENV,
    STAGING_ENV,
)
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
    text = os.environ.get(SPEC_ENV)
    if not text:
        raise SystemExit(f"no job spec: pass --spec FILE or set {SPEC_ENV}")
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
            os.environ.get(JOB_NAME_ENV, "local"),
            os.environ.get(JOB_NAMESPACE_ENV, "default"),
            int(os.environ.get(ATTEMPT_ENV, "0")),
        )


def _int_env(env: Mapping[str, str], name: str, default: int) -> int:
    """`env[name]` as a non-negative integer; unset or empty: `default`; anything else is an error
    naming the variable (it comes from torchrun, the operator or the user's shell)."""
    raw = env.get(name) or ""
    if not raw.strip():
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"environment variable {name}={raw!r}: expected a non-negative integer")
    return value


def staging_dir(env: Mapping[str, str] | None = None) -> str:
    """Node-local scratch for checkpoint shards on their way to or from S3 and for the in-place
    restart ledger: $LLMTRAIN_CHECKPOINT_STAGING (the pod's emptyDir), else <tmp>/llmtrain-ckpt."""
    env = os.environ if env is None else env
    return env.get(STAGING_ENV) or os.path.join(tempfile.gettempdir(), "llmtrain-ckpt")


@dataclass(frozen=True)
class WorkerEnv:
    """What a training worker takes from its environment, read once, here (`from_environ`); the
    trainer's components get these values, never `os.environ`.

    torchrun sets LOCAL_RANK, LOCAL_WORLD_SIZE, TORCHELASTIC_RESTART_COUNT and TORCHELASTIC_RUN_ID;
    the operator renders the LLMTRAIN_* ones into the pod, by the names of llmtrain/pod_contract.py."""

    local_rank: int = 0  # LOCAL_RANK
    local_world_size: int | None = None  # LOCAL_WORLD_SIZE; None: the world (one node)
    restart_count: int = 0  # TORCHELASTIC_RESTART_COUNT: in-place restarts torchrun counted
    run_id: str = ""  # TORCHELASTIC_RUN_ID: the rendezvous run (the in-place ledger's key)
    resume_before_step: int = 0  # LLMTRAIN_RESUME_BEFORE_STEP: a loss-spike rollback (0: none)
    metrics_port: int = METRICS_PORT  # LLMTRAIN_METRICS_PORT: /metrics of local rank r on this + r
    staging: str | None = None  # LLMTRAIN_CHECKPOINT_STAGING (None: unset)
    snapshot_dir: str = SNAPSHOT_PATH  # LLMTRAIN_SNAPSHOT_DIR: spec.checkpoint.memory's snapshots
    cache_dir: str | None = None  # LLMTRAIN_CACHE_DIR: where S3 pretrained weights are downloaded
    master_addr: str = ""  # MASTER_ADDR (this host's name when unset), for the rank-0 banner
    master_port: str = ""  # MASTER_PORT
    # LLMTRAIN_FINAL_SUMMARY: where local rank 0 writes the final summary, which the launcher makes
    # the termination message (None: not under the launcher or `llmtrain local`, nothing written)
    final_summary: str | None = None
    # intervalMinutes auto: LLMTRAIN_CHECKPOINT_MTBF_SECONDS / _BLOCKING_SECONDS as the operator
    # rendered them (parsed by checkpoint.checkpointer.auto_interval, which says what is accepted)
    checkpoint_auto: Mapping[str, str] = field(default_factory=dict)
    node_name: str | None = None  # LLMTRAIN_NODE_NAME: the pod's node (downward API), for the straggler scores
    # LLMTRAIN_TEST_SLOW_RANK: the test-only slow hook (metrics/stragglers.py: honoured only with its
    # test module installed, which no package or image has)
    test_slow_rank: str | None = None

    @classmethod
    def from_environ(cls, env: Mapping[str, str] | None = None) -> WorkerEnv:
        from llmtrain.cadence import BLOCKING_ENV, MTBF_ENV

        from .metrics.stragglers import TESTHOOK_ENV
        from .torchrun import FINAL_SUMMARY_ENV

        env = os.environ if env is None else env
        local_world = _int_env(env, "LOCAL_WORLD_SIZE", 0)
        return cls(
            local_rank=_int_env(env, "LOCAL_RANK", 0),
            local_world_size=local_world or None,
            restart_count=_int_env(env, "TORCHELASTIC_RESTART_COUNT", 0),
            run_id=env.get("TORCHELASTIC_RUN_ID") or "",
            resume_before_step=_int_env(env, RESUME_BEFORE_STEP_ENV, 0),
            metrics_port=_int_env(env, METRICS_PORT_ENV, METRICS_PORT),
            staging=env.get(STAGING_ENV) or None,
            snapshot_dir=env.get(SNAPSHOT_DIR_ENV) or SNAPSHOT_PATH,
            cache_dir=env.get("LLMTRAIN_CACHE_DIR") or None,
            master_addr=env.get("MASTER_ADDR", socket.gethostname()),
            master_port=env.get("MASTER_PORT", ""),
            final_summary=env.get(FINAL_SUMMARY_ENV) or None,
            checkpoint_auto={k: env[k] for k in (MTBF_ENV, BLOCKING_ENV) if k in env},
            node_name=env.get(NODE_NAME_ENV) or None,
            test_slow_rank=env.get(TESTHOOK_ENV) or None,
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
