"""The Kubeflow training-operator v1 backend: one `kubeflow.org/v1` PyTorchJob per attempt.

The PyTorchJob (templates/pytorchjob.yaml.j2) wraps the shared pod template in one `Worker`
replica set with an `elasticPolicy` (the rendezvous, the node range, torchrun's in-place restarts),
`runPolicy.backoffLimit: 0` and `restartPolicy: Never`: the training-operator never restarts a pod,
the operator decides every restart. The training-operator controls the pods itself (their
controller owner is the PyTorchJob), gives each a Service `<name>-worker-<i>` (the c10d host is
worker 0's) and labels them with their replica index. It also injects torchrun's PET_* variables
from the elasticPolicy, which say what the rendered arguments already say (render._args).

Kubeflow keeps training-operator v1 on its release-1.9 branch for maintenance only, and Kueue v0.19
no longer enables its `kubeflow.org/pytorchjob` integration by default: see the JobSet backend and
docs/decisions/ for where new clusters should go.
"""

from __future__ import annotations

from .base import MAX_ATTEMPT_DIGITS, NAME_RE, ApiKind, Backend, ChildState

# Set by the training-operator on each worker pod; index 0 runs local rank 0 of the first node.
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
# Kubeflow's JobConditionType values (training-operator v1), in the order a job passes them.
CONDITIONS = ("Created", "Suspended", "Running", "Restarting", "Succeeded", "Failed")
_TERMINAL = ("Succeeded", "Failed")
# The job names llmtrain has always accepted for PyTorchJobs (`<name>-a<attempt>-worker-<index>`
# Services for attempts up to 9999 and 4096 nodes): kept, whatever the node count, so that no name
# that was valid stops being so.
MAX_NAME_LENGTH = 45


def state_of(ptj: dict) -> str | None:
    """The PyTorchJob's current state: its terminal condition if any, else the latest True one."""
    conds = [c for c in (ptj.get("status") or {}).get("conditions") or [] if c.get("status") == "True"]
    types = {c["type"] for c in conds}
    for terminal in _TERMINAL:
        if terminal in types:
            return terminal
    if not conds:
        return None
    latest = max(
        conds,
        key=lambda c: (
            c.get("lastTransitionTime") or "",
            CONDITIONS.index(c["type"]) if c["type"] in CONDITIONS else -1,
        ),
    )
    return latest["type"]


def failure_message(ptj: dict) -> str:
    for c in (ptj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Failed" and c.get("status") == "True":
            return c.get("message") or c.get("reason") or "the PyTorchJob failed"
    return "the PyTorchJob failed"


class PyTorchJobBackend(Backend):
    name = "pytorchjob"
    child = ApiKind("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
    template = "pytorchjob.yaml.j2"
    pod_controller = ("kubeflow.org/v1", "PyTorchJob")
    rank_label = REPLICA_INDEX_LABEL
    kueue_framework = "kubeflow.org/pytorchjob"
    kueue_note = "deprecated, and left out of Kueue's default integrations from v0.19"
    kueue_default = False
    installs = "the Kubeflow training-operator v1 (its PyTorchJob CRD and controller)"

    def c10d_host(self, child: str) -> str:
        return f"{child}-worker-0"  # the training-operator's Service for worker 0

    def longest_names(self, job: str, nodes: int) -> dict[str, str]:
        child = f"{job}-a{'9' * MAX_ATTEMPT_DIGITS}"
        return {"the worker Services": f"{child}-worker-4095"}

    def max_job_name(self, nodes: int) -> int:
        return MAX_NAME_LENGTH

    def name_problem(self, job: str, nodes: int) -> tuple[str, str] | None:
        """In the words llmtrain has always used for a PyTorchJob's name."""
        if len(job) <= MAX_NAME_LENGTH and NAME_RE.match(job):
            return None
        return (
            f"{job!r} cannot name the worker Services (<name>-worker-<n> must be a DNS-1035 label)",
            f"lower-case letters, digits and '-', starting with a letter, ≤ {MAX_NAME_LENGTH} characters",
        )

    def state(self, obj: dict) -> ChildState:
        spec = obj.get("spec") or {}
        state = state_of(obj)
        return ChildState(
            state=state,
            suspended=(spec.get("runPolicy") or {}).get("suspend") is True,
            failure_message=failure_message(obj) if state == "Failed" else "",
            rendezvous_id=(spec.get("elasticPolicy") or {}).get("rdzvId"),
        )


PYTORCHJOB = PyTorchJobBackend()


def render_pytorchjob(spec, name: str, namespace: str = "default", attempt: int = 1, uid=None, *args, **kw) -> dict:
    """The PyTorchJob of one attempt (Backend.render's arguments)."""
    return PYTORCHJOB.render(spec, name, namespace, attempt, uid, *args, **kw)
