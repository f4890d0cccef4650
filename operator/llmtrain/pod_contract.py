"""What the operator and an attempt's pods agree on, besides the spec itself: the names the operator
gives an attempt (its child, its rendezvous id), what it tells the trainer (the environment, the
metrics port, where checkpoint shards are staged and the NCCL flight recorder dumps) and what a pod
tells it back (the preflight's exit code, the root-cause lines of a termination message).

Pure and standard-library only, so that each side reads it without the renderer's Jinja2 and YAML:
the renderer (render.py) writes these into the child object; the operator's pure policy
(controller/policy/) names attempts and reads the pods' answers with them; the trainer reads its
environment by these names, and its launcher (llmtrain_trainer.launch), which runs as long as the
training and stays stdlib-only, writes its exit code and termination message with them. The labels
on the children (render.JOB_LABEL, render.ATTEMPT_LABEL) stay with the renderer: only the
operator's adapters, which select pods by them, read them back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from . import cadence
from .rendezvous_keys import tenant_prefix

if TYPE_CHECKING:  # only read from the objects passed in: importing them pulls pydantic and the catalog's YAML
    from .catalog import InstanceType
    from .spec import LLMTrainingJobSpec

# Local rank r serves /metrics on METRICS_PORT + r; the operator scrapes rank 0's.
METRICS_PORT = 9410
# Where each rank stages its checkpoint shard before the S3 upload, and where flight recorder dumps
# go without a shared checkpoint volume: the pod's node-local staging volume (render.py sizes it).
STAGING_PATH = "/var/lib/llmtrain/staging"
# The pod command's (llmtrain_trainer.launch) exit code when the preflight health check found the
# nodes unfit (its termination message is the check's JSON verdict); the operator reads it back from
# the pod (controller/policy/preflight.py, podfailure.py). Not 1 (any error), 3 (the healthcheck
# worker's own "unhealthy"), 137/143 (signals) or torchrun's codes.
PREFLIGHT_EXIT_CODE = 86
# The first line of the termination message the launcher writes when torchrun fails with a record of
# what failed: ROOT_CAUSE, then "rank 3 (local 1): ValueError: boom" (a worker's exception), "rank 3
# (local 1): SIGKILL (signal 9)" or, torchrun's own, "RendezvousClosedError"; the other failed ranks
# (ALSO_FAILED) and the end of the traceback follow. The operator classifies the pod by the root
# cause and its traceback, not by the other ranks' lines (controller/policy/podfailure.py). Without a
# record the launcher writes none, and the kubelet keeps the log's tail instead.
ROOT_CAUSE = "torchrun failed; root cause:"
ALSO_FAILED = "also rank"  # starts each line about another failed rank of the pod, after ROOT_CAUSE's
# NCCL flight recorder (PyTorch's ProcessGroupNCCL): each rank keeps the last N collectives in a
# ring buffer and, when the watchdog sees a collective time out, dumps it to
# TORCH_NCCL_DEBUG_INFO_TEMP_FILE + <rank>. 2000 entries is PyTorch's own suggestion for
# debugging hangs (torch docs, "Flight Recorder"); the buffer costs a few MB per rank.
FLIGHT_RECORDER_ENTRIES = 2000
FLIGHT_RECORDER_DIR = "flight-recorder"
# PyTorch's CUDA caching allocator grows segments in place instead of allocating new fixed-size ones:
# far less fragmentation when block sizes vary from step to step (FSDP's gathered parameters, the
# loss's chunks, checkpoint staging), so fewer out-of-memory errors and cache flushes at the same
# batch size. torchtitan's launch scripts set it too. GPU pods only (it names the CUDA allocator).
CUDA_ALLOCATOR_ENV = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}

# The environment variables the operator sets in every worker and the trainer reads
# (llmtrain_trainer.config; the checkpoint cadence's two are cadence.MTBF_ENV and BLOCKING_ENV).
SPEC_ENV = "LLMTRAIN_SPEC"  # the whole resolved spec, as JSON
JOB_NAME_ENV = "LLMTRAIN_JOB_NAME"
JOB_NAMESPACE_ENV = "LLMTRAIN_JOB_NAMESPACE"
ATTEMPT_ENV = "LLMTRAIN_ATTEMPT"
METRICS_PORT_ENV = "LLMTRAIN_METRICS_PORT"
STAGING_ENV = "LLMTRAIN_CHECKPOINT_STAGING"
# spec.checkpoint.memory: where each rank keeps its in-memory snapshots and its partner's copies. The
# pod's /dev/shm (an emptyDir of medium Memory) outlives the worker processes, not the pod; unset:
# SNAPSHOT_PATH (`llmtrain local` sets a folder of its workdir).
SNAPSHOT_DIR_ENV = "LLMTRAIN_SNAPSHOT_DIR"
SNAPSHOT_PATH = "/dev/shm/llmtrain-snapshots"
# Where a worker resumed from, as llmtrain_trainer_resume_tier's value (the index) and as
# status.progress.resumeFrom says it: nothing (a fresh start or pretrained weights), the durable
# checkpoint, every rank's own in-memory snapshot, or in-memory snapshots with partner copies.
RESUME_TIERS = ("none", "durable", "memory", "partner")
RESUME_BEFORE_STEP_ENV = "LLMTRAIN_RESUME_BEFORE_STEP"  # a loss rollback: resume before this step
PREFLIGHT_ENV = "LLMTRAIN_PREFLIGHT"  # "1": the launcher runs the health check first
NODE_NAME_ENV = "LLMTRAIN_NODE_NAME"  # the pod's node (downward API)


def child_name(job: str, attempt: int) -> str:
    """The name of attempt `attempt`'s child object (PyTorchJob or JobSet, whichever backend)."""
    return f"{job}-a{attempt}"


def rendezvous_id(namespace: str, job: str, uid: str | None, attempt: int) -> str:
    # Starts with the namespace's own prefix (`<namespace>.`, padded): the rendezvous etcd grants
    # each namespace's identity exactly the keys of ids with that prefix (rendezvous_keys.py).
    return f"{tenant_prefix(namespace)}{job}-{(uid or 'local')[:8]}-a{attempt}"


def flight_recorder_location(spec: LLMTrainingJobSpec, attempt: int) -> tuple[str, bool]:
    """(directory the NCCL flight recorder dumps of `attempt` go to, whether it outlives the pod).
    A file:// checkpoint (a shared volume such as FSx) keeps them beside the checkpoints, per
    attempt; with S3 or no checkpoints they stay on the pod's node-local staging volume, which
    is gone with the pod (read them with `kubectl cp` while an attempt hangs)."""
    uri = spec.checkpoint.uri or ""
    if uri.startswith("file://"):
        return f"{uri[len('file://') :].rstrip('/')}/{FLIGHT_RECORDER_DIR}/attempt-{attempt}", True
    return f"{STAGING_PATH}/{FLIGHT_RECORDER_DIR}/attempt-{attempt}", False


def flight_recorder_env(spec: LLMTrainingJobSpec, attempt: int) -> dict[str, str]:
    where, _ = flight_recorder_location(spec, attempt)
    return {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": str(FLIGHT_RECORDER_ENTRIES),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        # PyTorch appends the global rank to this prefix: .../attempt-N/rank_<rank>
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{where}/rank_",
    }


def worker_env(
    spec: LLMTrainingJobSpec,
    inst: InstanceType,
    job: str,
    namespace: str,
    attempt: int,
    resume_before_step: int | None = None,
    cadence_inputs: tuple[float, float] | None = None,
    backend_env: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """A worker container's `env`, in the order it takes precedence: the instance family's
    NCCL/libfabric preset < what the backend's controller does not set (backends/) < llmtrain's own
    < `spec.cluster.env`; then the pod's and the node's names from the downward API. The renderer
    puts it in the pod; the torchx component gives it to the same workers outside Kubernetes."""
    values: dict[str, Any] = dict(inst.nccl_env)
    values.update(backend_env or {})
    values.update(
        {
            # Let a NCCL error or timeout abort the process instead of hanging the collective.
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
            "LLMTRAIN_COLLECTIVE_TIMEOUT_SECONDS": str(spec.resilience.collective_timeout_minutes * 60),
            JOB_NAME_ENV: job,
            JOB_NAMESPACE_ENV: namespace,
            ATTEMPT_ENV: str(attempt),
            METRICS_PORT_ENV: str(METRICS_PORT),
            STAGING_ENV: STAGING_PATH,
            SPEC_ENV: json.dumps(spec.wire(), sort_keys=True, separators=(",", ":")),
        }
    )
    if resume_before_step:  # the trainer resumes from the newest checkpoint before this step
        values[RESUME_BEFORE_STEP_ENV] = str(int(resume_before_step))
    if cadence_inputs is not None and spec.checkpoint.auto:
        # intervalMinutes auto: the job's MTBF and the blocking cost the trainer starts from
        mtbf, blocking = cadence_inputs
        values[cadence.MTBF_ENV] = f"{mtbf:.0f}"
        values[cadence.BLOCKING_ENV] = f"{blocking:.6g}"
    if spec.resilience.preflight:
        # launch.py runs `healthcheck` on every rank (its own rendezvous id) before training
        values[PREFLIGHT_ENV] = "1"
    if inst.is_gpu:
        values.update(flight_recorder_env(spec, attempt))
        values.update(CUDA_ALLOCATOR_ENV)
    values.update(spec.cluster.env)
    env = [{"name": k, "value": v} for k, v in values.items()]
    env.append({"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    # The node this pod runs on: the preflight verdict names suspects by it (status.badNodes).
    env.append({"name": NODE_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
    # No HF_TOKEN, even with spec.model.hfTokenSecretRef: nothing in the trainer talks to the
    # Hugging Face Hub (weights come from s3:// or file://), and a secret in every rank's
    # environment is one more thing code run in a rank could take.
    return env
