"""What the CRD's schema has the API server check in an LLMTrainingJob beyond the fields' types: the
Kubernetes name formats a field must match, the bounds on what a tenant's spec makes the operator copy,
and the CEL rules (`x-kubernetes-validations`): what may not change once the job exists, the keys of
the node selector and the env, the int-or-"auto" intervals (their bounds, check and schema).

The models of `llmtrain.spec` attach them to their fields, so the CRD (`llmtrain.crd`) carries them
and a bad spec is refused at `kubectl apply`; `llmtrain.validation` repeats the formats offline and
says each in words (PATTERN_WORDS).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import PlainValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

IMMUTABLE: dict[str, Any] = {
    "x-kubernetes-validations": [
        {
            "rule": "self == oldSelf",
            "message": "is immutable once the job exists (only spec.resilience, spec.suspend and "
            "spec.checkpoint.intervalMinutes/keep may change); delete and re-create the job "
            "to change it — it resumes from spec.checkpoint.uri",
        }
    ]
}


# Kubernetes name formats (apimachinery's validation), so a bad name is refused at `kubectl apply`
# instead of when the training-operator creates the pods.
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# A label value that is also a valid Kueue LocalQueue name (DNS subdomain ≤ 63).
QUEUE_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
# A Kueue WorkloadPriorityClass name, also a label value (DNS subdomain ≤ 63); the same language as
# QUEUE_NAME, written apart so that each has its own words in validation.PATTERN_WORDS.
PRIORITY_CLASS_NAME = r"^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$"
LABEL_KEY = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
# host:port (port optional: the backend's default); no scheme, no path.
HOST_PORT = r"^[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?(:[0-9]{1,5})?$"
# A container image reference as the distribution/reference grammar has it: [registry[:port]/]path[:tag][@digest]
_PATH_COMPONENT = r"[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*"
IMAGE_REFERENCE = (
    r"^([A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*(:[0-9]+)?/)?"
    + _PATH_COMPONENT
    + r"(/"
    + _PATH_COMPONENT
    + r")*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
# The node label the renderer pins GPU workers to; the instance type decides it, never nodeSelector.
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
NODE_SELECTOR_RULES: dict[str, Any] = {
    "x-kubernetes-validations": [
        {
            "rule": "self.all(k, k.matches('" + LABEL_KEY.replace("\\", "\\\\") + "'))",
            "message": (
                "every key must be a label key ([prefix/]name: name ≤ 63 of [A-Za-z0-9_.-], prefix a DNS subdomain)"
            ),
        },
        {
            "rule": f"!('{INSTANCE_TYPE_LABEL}' in self)",
            "message": f"{INSTANCE_TYPE_LABEL} is set from spec.cluster.instanceType; do not override it",
        },
    ]
}


# Bounds on what a tenant's spec makes the operator copy: `env` goes into the PyTorchJob twice (the
# container's env and LLMTRAIN_SPEC) and every list into each of its pods, so one job must not be able to
# make an object the API server refuses (1.5 MiB in etcd) or the operator's memory hold megabytes per job.
# S3 keys are at most 1,024 bytes, so is a URI here.
MAX_URI = 1024
MAX_ENV, MAX_ENV_NAME, MAX_ENV_VALUE = 64, 128, 2048
MAX_TOLERATIONS = 32
MAX_VOLUMES = 16
ENV_RULES: dict[str, Any] = {
    "x-kubernetes-validations": [
        {
            "rule": f"self.all(k, size(k) <= {MAX_ENV_NAME})",
            "message": f"every env name must be at most {MAX_ENV_NAME} characters",
        }
    ]
}


# spec.cluster is immutable as a whole (IMMUTABLE); the backend also gets a rule of its own, so that
# the refusal of a changed, added or removed backend names the field.
CLUSTER_RULES: dict[str, Any] = {
    "x-kubernetes-validations": [
        *IMMUTABLE["x-kubernetes-validations"],
        {
            "rule": "has(self.backend) == has(oldSelf.backend) && "
            "(!has(self.backend) || self.backend == oldSelf.backend)",
            "message": "spec.cluster.backend is immutable once the job exists (it cannot be added, changed or "
            "removed: the job's attempts run on the backend recorded in status.backend); delete and re-create "
            "the job to move it, it resumes from spec.checkpoint.uri",
        },
    ]
}


CHECKPOINT_URI_FIXED: dict[str, Any] = {
    "x-kubernetes-validations": [
        {
            "rule": "has(self.uri) == has(oldSelf.uri) && (!has(self.uri) || self.uri == oldSelf.uri)",
            "message": "spec.checkpoint.uri is immutable once the job exists (it cannot be added, changed or "
            "removed: the next attempt resumes from it); delete and re-create the job to change it",
        },
        {
            # the pods' /dev/shm and memory are sized for the snapshots: turning them on or off, or
            # changing them, would need new pods
            "rule": "has(self.memory) == has(oldSelf.memory) && (!has(self.memory) || self.memory == oldSelf.memory)",
            "message": "spec.checkpoint.memory is immutable once the job exists (the pods' memory is sized for "
            "it); delete and re-create the job to change it",
        },
    ]
}


# spec.checkpoint.intervalMinutes and memory.intervalSteps: a whole number, or "auto" (Young/Daly's
# interval, llmtrain.cadence). A value that is neither fails with this pydantic error type, which
# llmtrain.validation turns into words (INTERVAL_MINUTES_ACCEPTED).
INTERVAL_AUTO = "auto"
INTERVAL_MINUTES_ERROR = "int_or_auto"


def int_or_auto(lo: int, hi: int, unit: str, accepted: str) -> tuple[Callable[[Any], int | str], dict]:
    """A whole number of `unit` from `lo` to `hi`, or "auto": the value's check and its JSON schema.
    int-or-string: the API server keeps `60` an integer and `auto` a string; the schema's CEL rule is
    the same check as the function's."""

    def check(value: Any) -> int | str:
        if value == INTERVAL_AUTO:
            return INTERVAL_AUTO
        if isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi:
            return value
        raise PydanticCustomError(INTERVAL_MINUTES_ERROR, f"is not a number of {unit} or 'auto'")

    schema = {
        "x-kubernetes-int-or-string": True,
        "x-kubernetes-validations": [
            {
                "rule": f"type(self) == int ? (self >= {lo} && self <= {hi}) : self == '{INTERVAL_AUTO}'",
                "message": f"must be {accepted}",
            }
        ],
    }
    return check, schema


# spec.checkpoint.intervalMinutes: a whole number of minutes, or "auto" (llmtrain.cadence: Young/Daly's
# √(2 × blocking cost × MTBF), from the trainer's measured saves and the failures the operator has seen).
MIN_INTERVAL_MINUTES, MAX_INTERVAL_MINUTES = 1, 10080
INTERVAL_MINUTES_ACCEPTED = (
    f'a whole number of minutes from {MIN_INTERVAL_MINUTES} to {MAX_INTERVAL_MINUTES}, or "auto" '
    "(Young/Daly from the measured checkpoint cost and the instance type's failure rate)"
)


_interval_minutes, _interval_minutes_schema = int_or_auto(
    MIN_INTERVAL_MINUTES, MAX_INTERVAL_MINUTES, "minutes", INTERVAL_MINUTES_ACCEPTED
)
IntervalMinutes = Annotated[int | str, PlainValidator(_interval_minutes), WithJsonSchema(_interval_minutes_schema)]


# spec.checkpoint.memory.intervalSteps: a whole number of steps, or "auto" (Young/Daly on the snapshot's
# measured blocking cost, as intervalMinutes auto does for durable checkpoints).
MAX_SNAPSHOT_INTERVAL_STEPS = 1_000_000
SNAPSHOT_INTERVAL_ACCEPTED = (
    f'a whole number of steps from 1 to {MAX_SNAPSHOT_INTERVAL_STEPS}, or "auto" '
    "(Young/Daly from the measured snapshot cost and the instance type's failure rate)"
)
_interval_steps, _interval_steps_schema = int_or_auto(
    1, MAX_SNAPSHOT_INTERVAL_STEPS, "steps", SNAPSHOT_INTERVAL_ACCEPTED
)
SnapshotInterval = Annotated[int | str, PlainValidator(_interval_steps), WithJsonSchema(_interval_steps_schema)]
