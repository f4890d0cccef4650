"""The JobSet backend: one `jobset.x-k8s.io/v1alpha2` JobSet per attempt (kubernetes-sigs/jobset, the
layer Kubeflow Trainer v2 renders to, and the kind Kueue v0.19 points PyTorchJob users at).

The JobSet (templates/jobset.yaml.j2) has one replicated Job, `worker`, of one batch Job with
`nodes` indexed pods (parallelism = completions = nodes, completionMode Indexed) around the shared
pod template. Every restart stays the operator's: the Job fails at its first failed pod
(`backoffLimit: 0`, pods `restartPolicy: Never`), the JobSet at its first failed Job
(`failurePolicy.maxRestarts: 0`), and success is all Jobs completing (`successPolicy: All`).

What JobSet v0.12.0's controller does that this relies on (pkg/controllers/jobset_controller.go):
  * the Job is `<jobset>-worker-0` (placement.GenJobName), the pods `<jobset>-worker-0-<index>-<5>`
    with the hostname `<jobset>-worker-0-<index>`; the webhook refuses a JobSet whose longest Job or
    pod name is not a DNS-1035 label (63), so a job name is checked against that at validation;
  * `network.enableDNSHostnames` makes a headless Service named after the JobSet (the pods'
    subdomain), `publishNotReadyAddresses` true: worker 0 resolves as `<jobset>-worker-0-0.<jobset>`
    before it is Ready, the c10d rendezvous host (etcd rendezvous does not use it);
  * the Job's labels are the replicated Job template's (the job's and attempt's, never Kueue's:
    Kueue manages the JobSet), the pods' the pod template's plus `jobset.sigs.k8s.io/*` and the Job
    controller's `batch.kubernetes.io/job-completion-index` (rank 0's pod is index 0);
  * `spec.suspend` suspends the Jobs (their pods deleted without counting as failures) and resumes
    them; Kueue writes it, the operator only creates the JobSet suspended under a queue.

Nothing of torchrun comes from the environment of its controller: the rendered arguments carry the
node count, processes per node and rendezvous, and with an elastic rendezvous the node rank is the
rendezvous's to give (the training-operator's PET_* variables only repeated the arguments).
PYTHONUNBUFFERED, which the training-operator set on every PyTorchJob pod, is set here: the
termination message of a crashed worker is its log's tail (FallbackToLogsOnError).

Which pods are an attempt's: a pod's controller owner is the batch Job, whose controller owner is
the JobSet. The operator reads the Job (by its name) and trusts the pods of that Job's uid only
when the JobSet's uid is its controller (controller/adapters/owners.py), as it trusts a PyTorchJob's pods by
the PyTorchJob's uid: a pod labelled like a worker by hand is never one.

The JobSet's state, in decide's words: Failed and Completed (→ Succeeded) are its conditions;
Suspended its `spec.suspend` (or the Suspended condition while the controller catches up); Running
once every Job is ready (`status.replicatedJobsStatus`: ready + succeeded Jobs = replicas, a Job
ready when all its pods are), Created before.
"""

from __future__ import annotations

from types import MappingProxyType

from .base import MAX_ATTEMPT_DIGITS, ApiKind, Backend, ChildState, count, state_by_conditions

REPLICATED_JOB = "worker"
# The Job controller's label on each pod of an Indexed Job (Kubernetes >= 1.28)
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
# JobSet's webhook checks pod names with a 5-character suffix of the Job controller's (`-abcde`)
POD_NAME_SUFFIX = "-abcde"


class JobSetBackend(Backend):
    name = "jobset"
    child = ApiKind("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet")
    template = "jobset.yaml.j2"
    pod_controller = ("batch/v1", "Job")
    owner = ApiKind("batch", "v1", "jobs", "Job")
    rank_label = COMPLETION_INDEX_LABEL
    kueue_framework = "jobset.x-k8s.io/jobset"
    kueue_note = "in Kueue's default integrations: this Kueue's configuration was changed"
    installs = "JobSet (its CRD and controller, with its webhooks)"
    backend_env = MappingProxyType({"PYTHONUNBUFFERED": "1"})
    restart_policy = "Never"
    # v0.12's controller writes a new JobSet's first status (replicatedJobsStatus) in the reconcile
    # that made its Service and Jobs, with one worker for all JobSets: paced (pacing.py)
    pace_creates = True

    def job_name(self, child: str) -> str:
        return f"{child}-{REPLICATED_JOB}-0"

    def c10d_host(self, child: str) -> str:
        return f"{self.job_name(child)}-0.{child}"  # worker 0's hostname in the JobSet's subdomain

    def pod_owner_names(self, child: str) -> tuple[str, ...]:
        return (self.job_name(child),)

    def longest_names(self, job: str, nodes: int) -> dict[str, str]:
        child = f"{job}-a{'9' * MAX_ATTEMPT_DIGITS}"
        return {
            "the JobSet's headless Service": child,
            "its Job": self.job_name(child),
            f"pod {nodes - 1}": f"{self.job_name(child)}-{nodes - 1}{POD_NAME_SUFFIX}",
        }

    def state(self, obj: dict) -> ChildState:
        return state_by_conditions(obj, failed=("Failed",), succeeded=("Completed",), all_ready=_all_jobs_ready)


def _all_jobs_ready(spec: dict, status: dict) -> bool:
    """Every Job of every replicated Job ready (all its pods ready) or done, as JobSet's own
    allJobsReady counts them."""
    want = sum(count(r.get("replicas", 1)) for r in spec.get("replicatedJobs") or [] if isinstance(r, dict))
    have = sum(
        count(r.get("ready")) + count(r.get("succeeded"))
        for r in status.get("replicatedJobsStatus") or []
        if isinstance(r, dict)
    )
    return want > 0 and have >= want


JOBSET = JobSetBackend()
