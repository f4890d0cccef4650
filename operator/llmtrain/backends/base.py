"""What a training backend is to llmtrain: the one interface the operator, the CLI and the chart's
tests see, whichever kind of object runs an attempt's pods (a Kubeflow PyTorchJob, a JobSet).

Everything that differs per backend is here, and nothing else is: the kind and where the API serves
it; the child's name and the DNS limits its children's names put on a job's name; the render (a
wrapper around render.py's one shared pod template); the child's state in the one vocabulary
decide reads (`ChildState`); which pods are the attempt's (the controller-owner chain from a pod up
to the child, checked by uid: anyone can label a pod like a worker); rank 0's pod; what Kueue calls
the kind (its `integrations.frameworks` entry); the API permissions beyond the child kind itself.
decide, the situations and the rest of the operator read only this, so a third backend is one new
module beside pytorchjob.py, jobset.py and job.py, its name in spec.BACKENDS and its template.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar

from ..pod_contract import child_name
from ..render import render_attempt

# The states of a child, in the words decide reads (controller/policy/child_status.PHASE_OF maps them to phases,
# and the Created/Running/Restarting/Succeeded reasons are these words). None: it says nothing yet.
STATES = ("Created", "Suspended", "Running", "Restarting", "Succeeded", "Failed")
# A Kubernetes name in a DNS-1035 label (pods' hostnames, Services): at most 63 characters.
DNS_LABEL_MAX = 63
# The attempt numbers a job's name is checked against: `<job>-a<attempt>` for attempts up to 9999
# (maxRestarts is at most 1000; free restarts, a failed preflight or a resume, add some).
MAX_ATTEMPT_DIGITS = 4
# where the jobset and job templates record the attempt's rendezvous id
RENDEZVOUS_ID_ANNOTATION = "llmtrain.dev/rendezvous-id"
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class ApiKind:
    """A namespaced kind, where the API server serves it."""

    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def crd(self) -> str:
        """The CustomResourceDefinition that serves it: `<plural>.<group>`."""
        return f"{self.plural}.{self.group}"

    @property
    def built_in(self) -> bool:
        """Kubernetes serves it itself (core, batch, apps...: a CRD's group has a dot)."""
        return "." not in self.group


@dataclass(frozen=True)
class ChildState:
    """What decide needs of a child object, in the backend-neutral vocabulary."""

    state: str | None  # one of STATES, None while its controller has said nothing
    suspended: bool = False  # its own suspend flag: Kueue has not admitted it (or took it back)
    failure_message: str = ""  # why it failed, in its controller's words
    rendezvous_id: str | None = None  # the torchrun rendezvous id it was rendered with


class Backend:
    """One backend. Subclasses set the class attributes and implement `render` and `state`."""

    name: str  # spec.cluster.backend, the chart's backends.default / backends.enabled, status.backend
    child: ApiKind  # what the operator creates, one per attempt
    template: str  # its template under llmtrain/templates (includes pod.yaml.j2)
    # the (apiVersion, kind) of the controller owner of its pods: the child itself, or the object
    # between them (`owner`)
    pod_controller: tuple[str, str]
    # the kind between the child and its pods (a JobSet's batch Jobs), whose uid the operator reads
    # (kube.get_owner) and trusts only when the child is its controller; None: the child owns them
    owner: ApiKind | None = None
    rank_label: str  # the pod label whose value "0" marks the pod where global rank 0 runs
    kueue_framework: str  # Kueue's name of the integration (Configuration integrations.frameworks)
    kueue_note: str = ""  # what to know of that integration in Kueue's releases (its defaults)
    kueue_default: bool = True  # in the integrations a default install of Kueue (v0.19) enables
    installs: str  # what a platform installs for it, in words (messages and docs); "" for nothing
    # torchrun's settings are all arguments (render._args); this is what else the backend's
    # controller does not set that the trainer's pods rely on
    backend_env: ClassVar[Mapping[str, str]] = MappingProxyType({})
    restart_policy: str | None = None  # the pod template's restartPolicy, where the controller sets none
    # creates paced by the controller's progress (controller/adapters/pacing.py): measured to pay on
    # JobSet (one controller worker); not measured on the others
    pace_creates: bool = False
    # kinds the operator creates beside each child, owned by it: Services (kube.create_service), as
    # the job backend's headless one. Created once the child exists, never read, changed or deleted
    # (the garbage collector deletes them with their child)
    companion_kinds: ClassVar[tuple[ApiKind, ...]] = ()

    # --- names --------------------------------------------------------------------------------
    def child_name(self, job: str, attempt: int) -> str:
        return child_name(job, attempt)

    def c10d_host(self, child: str) -> str:
        """The DNS name of the first worker pod, where the c10d rendezvous store runs."""
        raise NotImplementedError

    def pod_subdomain(self, child: str) -> str | None:
        """The pods' subdomain, where the backend's controller does not set one (None: it does, or
        none is needed)."""
        return None

    def pod_owner_names(self, child: str) -> tuple[str, ...]:
        """The names of the `owner` objects between the child and its pods (none without `owner`)."""
        return ()

    def longest_names(self, job: str, nodes: int) -> dict[str, str]:
        """What the longest attempt's objects would be named, each that must be a DNS-1035 label
        (63): {what: name}. Checked at validation (`name_problem`)."""
        raise NotImplementedError

    def max_job_name(self, nodes: int) -> int:
        """The longest job name whose `longest_names` all fit."""
        n = DNS_LABEL_MAX
        while n > 1 and any(len(v) > DNS_LABEL_MAX for v in self.longest_names("x" * n, nodes).values()):
            n -= 1
        return n

    def name_problem(self, job: str, nodes: int) -> tuple[str, str] | None:
        """(why, accepted) when `job` cannot name this backend's objects, else None."""
        limit = self.max_job_name(nodes)
        if len(job) <= limit and NAME_RE.match(job):
            return None
        over = {what: name for what, name in self.longest_names(job, nodes).items() if len(name) > DNS_LABEL_MAX}
        if over:
            what, name = next(iter(over.items()))
            why = (
                f"{job!r} is too long for backend {self.name}: {what} would be named {name!r} "
                f"({len(name)} characters; a DNS-1035 label has at most {DNS_LABEL_MAX})"
            )
        else:
            why = f"{job!r} cannot name {self.child.kind}s and their pods (it must be a DNS-1035 label)"
        return why, f"lower-case letters, digits and '-', starting with a letter, ≤ {limit} characters on {self.name}"

    # --- the object -----------------------------------------------------------------------------
    def render(
        self,
        spec,
        name: str,
        namespace: str = "default",
        attempt: int = 1,
        uid: str | None = None,
        default_etcd_endpoint: str | None = None,
        **kw,
    ) -> dict:
        """Attempt `attempt`'s child: render.render_attempt with this backend's template and
        pieces (keywords: resume_before_step, avoid_nodes, rendezvous_credentials, cadence_inputs)."""
        return render_attempt(
            self.template,
            spec,
            name,
            namespace,
            attempt,
            uid,
            default_etcd_endpoint,
            c10d_host=self.c10d_host(self.child_name(name, attempt)),
            backend_env=self.backend_env,
            restart_policy=self.restart_policy,
            subdomain=self.pod_subdomain(self.child_name(name, attempt)),
            **kw,
        )

    def state(self, obj: dict) -> ChildState:
        raise NotImplementedError

    def companions(self, child: dict) -> list[dict]:
        """The objects (of `companion_kinds`) to create beside `child`, the child as the API server
        returned it (its uid), each owned by it."""
        return []

    def is_child(self, obj: dict) -> bool:
        """Whether an object of the child kind, labelled with a job, can be one of its attempts
        (False: another controller's object of the same kind, as a JobSet's batch Jobs are to the
        job backend); whose it is is checked by uid wherever it matters."""
        return True

    def taken_up(self, obj: dict) -> bool:
        """Its controller has reconciled it at least once: the first status write (a new child
        has none: the status subresource ignores what a create carries)."""
        return bool(obj.get("status"))


def count(value) -> int:
    """A status counter as a count: a positive int, anything else (absent, negative, a bool) 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def state_by_conditions(
    obj: dict, *, failed: tuple[str, ...], succeeded: tuple[str, ...], all_ready: Callable[[dict, dict], bool]
) -> ChildState:
    """The state of a child that says it with True conditions and its own `spec.suspend` (a JobSet,
    a batch Job): Failed (the message of the first of `failed` that holds) before Succeeded (any of
    `succeeded`), then Suspended (the flag, or the Suspended condition while its controller catches
    up), Running once `all_ready(spec, status)`, Created before."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
    true = {c.get("type"): c for c in conditions if c.get("status") == "True"}
    suspended = spec.get("suspend") is True
    failure = ""
    fail = next((true[t] for t in failed if t in true), None)
    if fail is not None:
        state = "Failed"
        failure = str(fail.get("message") or fail.get("reason") or f"the {obj.get('kind') or 'child'} failed")
    elif any(t in true for t in succeeded):
        state = "Succeeded"
    elif suspended or "Suspended" in true:
        state = "Suspended"
    elif all_ready(spec, status):
        state = "Running"
    else:
        state = "Created"
    return ChildState(
        state=state,
        suspended=suspended,
        failure_message=failure,
        rendezvous_id=((obj.get("metadata") or {}).get("annotations") or {}).get(RENDEZVOUS_ID_ANNOTATION),
    )
