"""Who may run what: the cluster admin's allow-lists (validation.Policy), the backend, the name."""

from __future__ import annotations

from collections.abc import Iterator

from ..backends import BACKENDS
from .base import Problem, Subject, rule, shorten


@rule("spec.cluster.image")
def allowed_image_registry(j: Subject) -> Iterator[Problem]:
    """The image comes from a registry the cluster allows (chart: `admission.allowedImageRegistries`).

    Without the allow-list anyone allowed to create an LLMTrainingJob could run any image through the
    operator. An entry matches the image itself or anything under it: `public.ecr.aws/llmtrain`
    allows `public.ecr.aws/llmtrain/llmtrain-trainer:0.1.0`, not `public.ecr.aws/llmtrain-x/...`.
    An empty list allows every image."""
    registries, image = j.policy.image_registries, j.spec.cluster.image
    if registries and not any(image == r.rstrip("/") or image.startswith(r.rstrip("/") + "/") for r in registries):
        yield Problem(
            "spec.cluster.image",
            f"{image!r} is not from a registry this cluster allows",
            "an image under " + " | ".join(registries),
        )


@rule("spec.cluster.serviceAccountName")
def allowed_service_account(j: Subject) -> Iterator[Problem]:
    """The ServiceAccount is one jobs may use (chart: `admission.allowedServiceAccounts`).

    Otherwise a job could run under any ServiceAccount of its namespace, with that account's API
    permissions. A job without serviceAccountName runs as the namespace's `default` and is always
    allowed; an empty list allows every account."""
    allowed, sa = j.policy.service_accounts, j.spec.cluster.service_account_name
    if allowed and sa is not None and sa not in allowed:
        yield Problem(
            "spec.cluster.serviceAccountName",
            f"{sa!r} is not a ServiceAccount jobs may use",
            " | ".join(allowed) + ", or leave it unset",
        )


@rule("spec.cluster.backend", stop=True)
def known_backend(j: Subject) -> Iterator[Problem]:
    """The job's backend is one llmtrain has (llmtrain/backends: pytorchjob, jobset).

    The CRD's enum says the same at `kubectl apply`; this repeats it for a CRD installed without
    the schema and for `llmtrain validate`. The name limit below depends on it."""
    if j.chosen_backend not in BACKENDS:
        yield Problem("spec.cluster.backend", f"unknown backend {shorten(j.chosen_backend)}", " | ".join(BACKENDS))


@rule("spec.cluster.backend", needs=(known_backend,))
def enabled_backend(j: Subject) -> Iterator[Problem]:
    """The job's backend is one the platform enabled (the operator chart's `backends.enabled`).

    The operator watches, creates and has RBAC for those kinds only; a job's own
    spec.cluster.backend, or the default chosen for it, must be among them."""
    chosen, enabled = j.chosen_backend, j.enabled
    if enabled is not None and chosen not in enabled:
        how = "" if j.spec.cluster.backend == chosen else " (the default chosen for the job: it names none)"
        yield Problem(
            "spec.cluster.backend",
            f"backend {chosen!r}{how} is not enabled on this platform",
            f"{' | '.join(enabled)} (the operator chart's backends.enabled), or have the platform enable "
            f"{chosen} ({_enabling(chosen)})",
        )


def _enabling(backend: str) -> str:
    installs = BACKENDS[backend].installs
    return f"install {installs} and add it there" if installs else "add it there: Kubernetes itself serves its kind"


# A job's name limit is its backend's (backends.base.Backend.max_job_name; 45 on PyTorchJob).
@rule("metadata.name", needs=(known_backend,))
def job_name(j: Subject) -> Iterator[Problem]:
    """The job's name can name what its backend makes of it: lower-case letters, digits and '-',
    starting with a letter, at most 45 characters on PyTorchJob, 37-40 on JobSet.

    Each attempt's objects are named after it, and each must be a DNS-1035 label of at most 63
    characters: Kubeflow's worker Services `<name>-a<attempt>-worker-<index>`; JobSet's pods
    `<name>-a<attempt>-worker-0-<index>-<5 characters>` (backends.base.Backend.name_problem)."""
    problem = BACKENDS[j.chosen_backend].name_problem(j.name, j.spec.cluster.nodes)
    if problem is not None:
        yield Problem("metadata.name", *problem)
