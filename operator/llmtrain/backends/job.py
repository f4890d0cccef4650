"""The batch Job backend: one `batch/v1` Indexed Job per attempt, and its headless Service.

For a cluster with no training CRD at all: the Job controller is in every Kubernetes, and Kueue's
default integrations include `batch/job`. The Job (templates/job.yaml.j2) runs `nodes` pods
(parallelism = completions = nodes, completionMode Indexed) of the shared pod template. Every
restart stays the operator's: the Job fails at its first failed pod (`backoffLimit: 0`, pods
`restartPolicy: Never`) and succeeds when every index has completed.

What the Job controller does that this relies on (Kubernetes ≥ 1.28):
  * pod i's hostname is `<job>-<i>` and its label `batch.kubernetes.io/job-completion-index` is i
    (rank 0's pod is index 0); the pods' controller owner is the Job itself, so an attempt's pods
    are trusted by the Job's uid, with no read (as a PyTorchJob's);
  * its pods carry `batch.kubernetes.io/controller-uid`: the Job's uid, which selects them;
  * `spec.suspend` deletes the pods (not counted as failures) and resumes them; Kueue writes it,
    the operator only creates the Job suspended under a queue.

What it does not do that a JobSet's controller does: a DNS name for each pod. So the operator
creates, once the Job exists, a headless Service named after it (`publishNotReadyAddresses`: worker
0 resolves before it is Ready, as the c10d rendezvous needs; etcd rendezvous does not use it),
selecting the Job's pods by its uid and owned by it: the garbage collector deletes it with the
Job. The pods' subdomain is that Service, so the c10d host is `<job>-0.<job>`. Created only, like
the attempt's other companions (tenancy.py): one already there (an operator restart) is left as it
is; a tenant who put another under that name in its own namespace only breaks its own job's DNS.

A watch of batch Jobs also sees a JobSet's Jobs, which carry the job's and attempt's labels:
`is_child` leaves out any Job whose controller is not an LLMTrainingJob.

The Job's state, in decide's words: Failed is its Failed condition, or FailureTarget (Kubernetes ≥
1.31 sets it the moment the Job is doomed, while the remaining pods terminate: the next attempt
need not wait for them); Succeeded its Complete condition (SuccessCriteriaMet first, likewise);
Suspended its `spec.suspend` (or the Suspended condition while the controller catches up); Running
once every index is ready or done (`status.ready` + `status.succeeded` = completions), Created
before.
"""

from __future__ import annotations

from types import MappingProxyType

from ..spec import API_VERSION, KIND
from .base import MAX_ATTEMPT_DIGITS, ApiKind, Backend, ChildState, count, state_by_conditions

# The Job controller's labels on each pod of an Indexed Job (Kubernetes >= 1.27 / 1.28)
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
CONTROLLER_UID_LABEL = "batch.kubernetes.io/controller-uid"
# the child's labels its Service carries too
OWN_LABELS = ("llmtrain.dev/", "app.kubernetes.io/")
SERVICE = ApiKind("", "v1", "services", "Service")
# A Job's condition types that end the attempt: failed (the final one first, for its message), succeeded
FAILED = ("Failed", "FailureTarget")
SUCCEEDED = ("Complete", "SuccessCriteriaMet")


class JobBackend(Backend):
    name = "job"
    child = ApiKind("batch", "v1", "jobs", "Job")
    template = "job.yaml.j2"
    pod_controller = ("batch/v1", "Job")
    rank_label = COMPLETION_INDEX_LABEL
    kueue_framework = "batch/job"
    kueue_note = "in Kueue's default integrations: this Kueue's configuration was changed"
    installs = ""  # the Job controller is part of Kubernetes
    backend_env = MappingProxyType({"PYTHONUNBUFFERED": "1"})
    restart_policy = "Never"
    companion_kinds = (SERVICE,)

    def c10d_host(self, child: str) -> str:
        return f"{child}-0.{child}"  # worker 0's hostname in the Service's subdomain

    def pod_subdomain(self, child: str) -> str:
        return child

    def longest_names(self, job: str, nodes: int) -> dict[str, str]:
        child = f"{job}-a{'9' * MAX_ATTEMPT_DIGITS}"
        # the Job's name is also a label value (batch.kubernetes.io/job-name): 63, as the Service's
        return {"the Job's headless Service": child, f"pod {nodes - 1}'s hostname": f"{child}-{nodes - 1}"}

    def companions(self, child: dict) -> list[dict]:
        meta = child["metadata"]
        labels = meta.get("labels") or {}
        return [
            {
                "apiVersion": SERVICE.api_version,
                "kind": SERVICE.kind,
                "metadata": {
                    "name": meta["name"],
                    "namespace": meta["namespace"],
                    # the job's and attempt's, not Kueue's: Kueue manages the Job, never its parts
                    "labels": {k: v for k, v in labels.items() if k.startswith(OWN_LABELS)},
                    "ownerReferences": [
                        {
                            "apiVersion": self.child.api_version,
                            "kind": self.child.kind,
                            "name": meta["name"],
                            "uid": meta["uid"],
                            "controller": True,
                        }
                    ],
                },
                "spec": {
                    "clusterIP": "None",
                    "selector": {CONTROLLER_UID_LABEL: meta["uid"]},
                    "publishNotReadyAddresses": True,
                },
            }
        ]

    def is_child(self, obj: dict) -> bool:
        for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
            if isinstance(ref, dict) and ref.get("controller"):
                return (ref.get("apiVersion"), ref.get("kind")) == (API_VERSION, KIND)
        return True

    def state(self, obj: dict) -> ChildState:
        return state_by_conditions(obj, failed=FAILED, succeeded=SUCCEEDED, all_ready=_all_ready)


def _all_ready(spec: dict, status: dict) -> bool:
    """Every index ready (its pod Ready) or done."""
    want = count(spec.get("completions"))
    return want > 0 and count(status.get("ready")) + count(status.get("succeeded")) >= want


JOB = JobBackend()
