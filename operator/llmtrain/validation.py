"""Validation of an LLMTrainingJob: what is wrong, why, and what would be accepted.

Two layers. The CRD schema (generated from `spec.py`) lets the API server reject wrong types,
enums and bounds at `kubectl apply`. This module repeats that offline (`llmtrain validate`) and adds
what a schema cannot express: cross-field rules, URI schemes, the memory fit, batch arithmetic,
each a rule of the table in validation_rules/. The operator runs the same checks and marks a job
Failed with these messages; docs/reference/validation.md lists them all.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic
import yaml

from . import validation_rules
from .defaults import resolve
from .spec import API_VERSION, DEFAULT_ETCD_ENDPOINT, KIND, LLMTrainingJobSpec
from .spec_constraints import (
    DNS_SUBDOMAIN,
    HOST_PORT,
    IMAGE_REFERENCE,
    INTERVAL_MINUTES_ACCEPTED,
    INTERVAL_MINUTES_ERROR,
    LABEL_KEY,
    LABEL_VALUE,
    PRIORITY_CLASS_NAME,
    QUEUE_NAME,
)

# The rules and their constants live in validation_rules/; these names stay importable from here.
from .validation_rules import (  # noqa: F401 - re-exported
    DATA_SCHEMES,
    ENV_NAME_RE,
    FLOAT8_GPUS,
    LOADER_ENV,
    LOADER_ENV_PREFIXES,
    RESERVED_ENV,
    RESERVED_ENV_PREFIXES,
    STORAGE_SCHEMES,
    Problem,
    Subject,
    shorten,
    supports_float8,
)

INLINE_TOKEN_KEYS = ("hfToken", "huggingFaceToken", "token", "hf_token")


class InvalidJob(ValueError):
    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


@dataclass(frozen=True)
class Policy:
    """A cluster admin's allow-lists: which image registries and ServiceAccounts jobs may use.

    Without them anyone allowed to create an LLMTrainingJob could run any image under any
    ServiceAccount of the namespace through the operator. The chart's `admission.*` values reach
    the operator as the environment variables below (comma-separated); empty means no restriction.
    A registry entry matches the image itself or anything under it (`public.ecr.aws/llmtrain`
    allows `public.ecr.aws/llmtrain/llmtrain-trainer:0.1.0`, not `public.ecr.aws/llmtrain-x/...`).
    A job without serviceAccountName runs as the namespace's `default` and is always allowed.
    """

    image_registries: tuple[str, ...] = ()
    service_accounts: tuple[str, ...] = ()

    ENV_IMAGES = "LLMTRAIN_ALLOWED_IMAGE_REGISTRIES"
    ENV_SERVICE_ACCOUNTS = "LLMTRAIN_ALLOWED_SERVICE_ACCOUNTS"

    @classmethod
    def from_env(cls, env=None) -> Policy:
        env = os.environ if env is None else env

        def split(var):
            return tuple(x.strip() for x in env.get(var, "").replace(",", " ").split() if x.strip())

        return cls(split(cls.ENV_IMAGES), split(cls.ENV_SERVICE_ACCOUNTS))


@dataclass(frozen=True)
class Job:
    name: str
    namespace: str
    spec: LLMTrainingJobSpec
    document: dict


def _loc(loc: tuple) -> str:
    path = "spec"
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


# What each name/format pattern of spec_constraints.py means, in words: pydantic's own message for a mismatch
# is "String should match pattern '<regex>'", which tells a user nothing.
_STARTS_ENDS = "starting and ending with a letter or digit"
PATTERN_WORDS: dict[str, tuple[str, str]] = {
    DNS_SUBDOMAIN: (
        "is not a DNS subdomain",
        f"lowercase letters, digits, '-' and '.', {_STARTS_ENDS} (e.g. 'llmtrain-trainer')",
    ),
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$": (
        "is not a DNS label",
        f"up to 63 lowercase letters, digits and '-', {_STARTS_ENDS} (e.g. 'scratch-1')",
    ),
    QUEUE_NAME: (
        "is not a Kueue LocalQueue name",
        f"up to 63 lowercase letters, digits, '-' and '.', {_STARTS_ENDS} (e.g. 'team-a')",
    ),
    PRIORITY_CLASS_NAME: (
        "is not a Kueue WorkloadPriorityClass name",
        f"up to 63 lowercase letters, digits, '-' and '.', {_STARTS_ENDS} (e.g. 'production')",
    ),
    LABEL_KEY: (
        "is not a label key",
        f"[prefix/]name: a name of up to 63 letters, digits, '-', '_' and '.', {_STARTS_ENDS}; "
        "the prefix a DNS subdomain (e.g. 'example.com/pool')",
    ),
    LABEL_VALUE: ("is not a label value", f"empty, or up to 63 letters, digits, '-', '_' and '.', {_STARTS_ENDS}"),
    HOST_PORT: (
        "is not host:port",
        "a host name or IP, optionally ':' and a port number; no scheme or path (e.g. 'etcd.infra.svc:2379')",
    ),
    IMAGE_REFERENCE: (
        "is not a container image reference",
        "[registry[:port]/]path[:tag][@sha256:<digest>] with a lowercase path "
        "(e.g. 'public.ecr.aws/llmtrain/llmtrain-trainer:0.1.0')",
    ),
    r"^/": ("is not an absolute path", "a path starting with '/'"),
}


def _pydantic_problems(err: pydantic.ValidationError) -> list[Problem]:
    problems = []
    for e in err.errors():
        field = _loc(e["loc"])
        kind = e["type"]
        if kind == "extra_forbidden":
            problems.append(
                Problem(field, "unknown field", "the fields the CRD documents (kubectl explain llmtrainingjob.spec)")
            )
        elif kind == "missing":
            problems.append(Problem(field, "is required", "a value"))
        elif kind == INTERVAL_MINUTES_ERROR:
            problems.append(Problem(field, f"{shorten(e['input'])} {e['msg']}", INTERVAL_MINUTES_ACCEPTED))
        elif kind in ("literal_error", "enum"):
            expected = e.get("ctx", {}).get("expected", "")
            problems.append(Problem(field, f"{e['input']!r} is not a known value", expected))
        elif kind == "string_pattern_mismatch":
            pattern = e.get("ctx", {}).get("pattern", "")
            reason, accepted = PATTERN_WORDS.get(
                pattern, ("does not have the required format", f"a string matching {pattern}")
            )
            problems.append(Problem(field, f"{shorten(e['input'])} {reason}", accepted))
        elif "ctx" in e and any(k in e["ctx"] for k in ("ge", "gt", "le", "lt")):
            bound = ", ".join(
                f"{'≥>≤<'[['ge', 'gt', 'le', 'lt'].index(k)]} {v}"
                for k, v in e["ctx"].items()
                if k in ("ge", "gt", "le", "lt")
            )
            problems.append(Problem(field, f"{e['input']!r} is out of range", bound))
        else:
            problems.append(Problem(field, e["msg"], "see the CRD schema"))
    return problems


def _inline_token_problems(raw: dict) -> list[Problem]:
    model = raw.get("model") if isinstance(raw, dict) else None
    if not isinstance(model, dict):
        return []
    return [
        Problem(
            f"spec.model.{key}",
            "an inline Hugging Face token would be stored in plain text in the object",
            "spec.model.hfTokenSecretRef: {name: <Secret>, key: token}",
        )
        for key in INLINE_TOKEN_KEYS
        if key in model
    ]


def parse_spec(raw: dict) -> LLMTrainingJobSpec:
    """Turn the wire spec into the typed spec, or raise InvalidJob naming every bad field."""
    token = _inline_token_problems(raw)
    if token:
        raw = {**raw, "model": {k: v for k, v in raw["model"].items() if k not in INLINE_TOKEN_KEYS}}
    try:
        spec = resolve(LLMTrainingJobSpec.model_validate(raw))
    except pydantic.ValidationError as err:
        raise InvalidJob(token + _pydantic_problems(err)) from None
    if token:
        raise InvalidJob(token)
    return spec


def check(
    spec: LLMTrainingJobSpec,
    name: str = "job",
    default_etcd_endpoint: str | None = DEFAULT_ETCD_ENDPOINT,
    policy: Policy | None = None,
    backend: str | None = None,
    enabled: tuple[str, ...] | None = None,
) -> list[Problem]:
    """Semantic checks the schema cannot express: the rules of validation_rules.RULES, in order.
    Returns every problem found, not just the first. `policy`: the allow-lists (default: from the
    environment, as the operator gets them); `backend`, `enabled`: the job's backend when already
    chosen and the backends the platform enabled (validation_rules.Subject)."""
    policy = policy if policy is not None else Policy.from_env()
    return validation_rules.run(Subject(spec, name, default_etcd_endpoint, policy, backend, enabled))


def validate(
    raw_spec: dict,
    name: str = "job",
    default_etcd_endpoint: str | None = DEFAULT_ETCD_ENDPOINT,
    policy: Policy | None = None,
    backend: str | None = None,
    enabled: tuple[str, ...] | None = None,
) -> LLMTrainingJobSpec:
    spec = parse_spec(raw_spec)
    problems = check(spec, name, default_etcd_endpoint, policy, backend, enabled)
    if problems:
        raise InvalidJob(problems)
    return spec


_A_JOB = f"a YAML mapping with apiVersion: {API_VERSION}, kind: {KIND}, metadata and spec"


def load_documents(path: str | Path) -> list[dict[str, Any]]:
    """The non-empty YAML documents of a file ('-': stdin), each a mapping. A syntax error or a
    document that is a list or a scalar is an InvalidJob naming the file, not a traceback further on."""
    text = Path(path).read_text() if str(path) != "-" else __import__("sys").stdin.read()
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise InvalidJob(
            [Problem(str(path), f"is not valid YAML{at}: {getattr(err, 'problem', None) or err}", _A_JOB)]
        ) from None
    for i, d in enumerate(docs, 1):
        if not isinstance(d, dict):
            which = f"document {i}" if len(docs) > 1 else "its YAML"
            kind = {list: "a list", str: "a string", bool: "a boolean"}.get(type(d), "a number")
            raise InvalidJob(
                [Problem(str(path), f"{which} is {kind}, but an LLMTrainingJob mapping was expected", _A_JOB)]
            )
    return [d for d in docs if d]


def job_from_document(
    doc: dict,
    default_etcd_endpoint: str | None = DEFAULT_ETCD_ENDPOINT,
    policy: Policy | None = None,
    backend: str | None = None,
) -> Job:
    """`backend`: the platform's default, for a job whose spec names none."""
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
        raise InvalidJob(
            [
                Problem(
                    "apiVersion/kind",
                    f"{doc.get('apiVersion')}/{doc.get('kind')} is not an LLMTrainingJob",
                    f"apiVersion: {API_VERSION}, kind: {KIND}",
                )
            ]
        )
    meta = doc.get("metadata") or {}
    name = meta.get("name") or ""
    raw = doc.get("spec") or {}
    cluster = raw.get("cluster") if isinstance(raw, dict) else None
    requested = cluster.get("backend") if isinstance(cluster, dict) else None
    spec = validate(raw, name, default_etcd_endpoint, policy, requested if isinstance(requested, str) else backend)
    return Job(name=name, namespace=meta.get("namespace") or "default", spec=spec, document=doc)


def read_job_document(path: str | Path) -> dict:
    """The single LLMTrainingJob document in a YAML file (other kinds in the file are ignored)."""
    docs = [d for d in load_documents(path) if d.get("kind") == KIND]
    if len(docs) != 1:
        raise InvalidJob([Problem(str(path), f"holds {len(docs)} LLMTrainingJobs", "exactly one")])
    return docs[0]


def load_job(
    path: str | Path,
    default_etcd_endpoint: str | None = DEFAULT_ETCD_ENDPOINT,
    policy: Policy | None = None,
    backend: str | None = None,
) -> Job:
    """Read and validate the single LLMTrainingJob in a YAML file (`backend`: job_from_document's)."""
    return job_from_document(read_job_document(path), default_etcd_endpoint, policy, backend)
