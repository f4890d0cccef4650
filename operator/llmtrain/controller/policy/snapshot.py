"""What the reconciler decides from and what it decides: `Observed` (one frozen snapshot of a job
and everything known about it, built by `observe.py`) and `Plan` (what `act.py` does about it).

Both are plain data, so `decide.py` is a pure function between them and the tests build them by
hand (tests/operator_core/test_decide_<stage>.py, one file per lifecycle stage).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from typing import Any, Literal

from ...cadence import NodeMTBF
from ...spec import DEFAULT_BACKEND, LLMTrainingJobSpec
from ...status import LLMTrainingJobStatus, Reason
from .progress import Progress
from .sicknodes import SickNode


@dataclass(frozen=True)
class Child:
    """One child object (of the job's backend's kind) labelled as an attempt of the job."""

    name: str
    attempt: int | None
    owned: bool  # ownerReferences name this job's uid (else: a name conflict)
    deleting: bool = False  # deletionTimestamp set: its DELETED event will follow
    state: str | None = None  # its backend's ChildState: Created/Suspended/Running/Restarting/Succeeded/Failed
    failure_message: str = ""  # its Failed condition's message
    spec_hash: str | None = None
    rendezvous_id: str | None = None
    uid: str = ""  # its own uid: its pods' controller chain leads to it (controller/adapters/owners.py)
    suspended: bool = False  # its own suspend flag: Kueue has not admitted it (or took it back)


@dataclass(frozen=True)
class Workload:
    """What Kueue says about a child's Workload (controller/adapters/kueue.py reads it)."""

    name: str
    admitted: bool = False
    message: str = ""  # Kueue's words: why it waits (QuotaReserved=False), or was admitted
    evicted: str | None = None  # the Evicted condition's reason (Preempted, PodsReadyTimeout, ...)
    evicted_message: str = ""


@dataclass(frozen=True)
class CreateResult:
    """What creating attempt N's child came to (act.py's first step), decided on again.
    "not-served": the API server does not serve the backend's kind (its CRD is not installed)."""

    name: str
    outcome: Literal["created", "adopted", "rejected", "not-owned", "not-served"]
    message: str = ""  # the API server's words for a rejection
    rendezvous_id: str | None = None


@dataclass(frozen=True)
class Observed:
    namespace: str
    name: str
    uid: str
    generation: int | None
    resource_version: str | None
    raw_spec: dict[str, Any]
    spec: LLMTrainingJobSpec | None  # validated and resolved once per uid and generation
    spec_error: str | None  # why it is invalid (spec None)
    raw_status: dict[str, Any]
    status: LLMTrainingJobStatus
    now: dt.datetime
    backend: str = DEFAULT_BACKEND  # what runs its attempts (backends.choose: status.backend once written)
    creation_time: dt.datetime | None = None  # metadata.creationTimestamp
    children: tuple[Child, ...] = ()
    first_sight: bool = False  # this process has not reconciled the job before
    awaiting_watch: bool = False  # its recorded child may still come through the watch
    pods: tuple[dict, ...] = ()  # the current attempt's pods (status.pod_summary)
    failures: tuple[dict, ...] | None = None  # the current attempt's pod failures; None: not read
    ran_nodes: frozenset[str] = frozenset()  # where the current attempt's pods ran (read with failures)
    ready_nodes: frozenset[str] | None = None  # Ready nodes of the instance type (None: unknown)
    ready_nodes_read: bool = False
    progress: Progress | None = None  # the monitor's latest scrape of the current attempt
    final: Progress | None = None  # the trainer's final summary from the attempt's pods (ending.py)
    final_read: bool = False
    workload: Workload | None = None  # Kueue's Workload of the current child (None: none found)
    workload_read: bool = False
    node_mtbf: NodeMTBF | None = None  # one node's MTBF on the instance type (reliability.py)
    node_mtbf_read: bool = False
    created: CreateResult | None = None
    # watched node conditions False on the nodes of the current attempt's own pods (sicknodes.py)
    sick_nodes: tuple[SickNode, ...] = ()
    # the nodes of the current attempt's own pods, read when rank 0 reports a straggler (its node
    # must be one of them: slownodes.py); None: not read
    pod_nodes: frozenset[str] | None = None

    @property
    def is_new(self) -> bool:
        """No phase written yet (the raw field: a phase this version cannot read is not "new")."""
        return not self.raw_status.get("phase")

    @property
    def attempt(self) -> int:
        return self.status.attempt or 1

    def child(self, name: str | None) -> Child | None:
        return next((c for c in self.children if c.name == name), None) if name else None

    def with_(self, **changes) -> Observed:
        return replace(self, **changes)


@dataclass(frozen=True)
class Event:
    warning: bool
    reason: Reason
    message: str


@dataclass(frozen=True)
class Plan:
    """What to do, in act.py's fixed order: create (then decide again with the result), write
    `status` conditionally on the observed resourceVersion, delete children, post events, taint,
    count. `need`: observe this too and decide again (read only when a situation needs it)."""

    situation: str
    status: dict[str, Any] | None = None
    create: dict[str, Any] | None = None
    delete: tuple[str, ...] = ()
    events: tuple[Event, ...] = ()
    need: Literal["failures", "ready_nodes", "workload", "node_mtbf", "final"] | None = None
    requeue: float | None = None
    outcome: str | None = None  # llmtrain_operator_reconciles{outcome}
    restart: Reason | None = None  # llmtrain_operator_job_restarts{reason}
    ended: Reason | None = None  # why the attempt ended, also when no restart follows (goodput)
    blamed: tuple[dict, ...] = ()  # nodes blamed for the failure (llmtrain_operator_bad_nodes)
    taint: tuple[dict, ...] = ()  # blamed nodes the next attempt avoids (--suspect-taint-fraction)
    preflight_busbw: float | None = None  # llmtrain_operator_preflight_bus_bandwidth_gbps
    monitor: bool = False  # scrape rank 0 (Running)
    waiting: bool = False  # for the watch: not yet a sight of the job
    periodic: bool = False  # nothing changed (steady): the periodic refresh of status.goodput may write

    @property
    def writes(self) -> bool:
        return self.status is not None or self.create is not None
