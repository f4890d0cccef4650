"""Operator settings, from the command line (`__main__` builds them and the Operator)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...pod_contract import METRICS_PORT
from ...spec import DEFAULT_BACKEND, DEFAULT_ETCD_ENDPOINT
from .sicknodes import DEFAULT_CONDITIONS, FREE_MOVES


@dataclass
class OperatorConfig:
    default_etcd_endpoint: str | None = DEFAULT_ETCD_ENDPOINT
    trainer_metrics_port: int = METRICS_PORT
    progress_interval: float = 30.0
    workers: int = 32
    scrape_timeout: float = 3.0
    # scrapes in flight at once (each is a coroutine on the event loop, not a thread)
    max_concurrent_scrapes: int = 200
    # taint nodes blamed for a failure llmtrain.dev/suspect=<reason>:NoSchedule, on at most this
    # fraction of the nodes of their instance type (0: never; controller/adapters/nodes.py)
    suspect_taint_fraction: float = 0.0
    # a NetworkPolicy per job: its pods accept only its own pods, but on the metrics ports
    # (controller/adapters/tenancy.py; needs a CNI that enforces NetworkPolicy)
    job_network_policy: bool = False
    # the rendezvous CA (ca.crt, ca.key): the default etcd requires per-namespace client
    # certificates, which the operator issues (rendezvous_auth.py); None: plain etcd
    rendezvous_ca_dir: str | None = None
    # and on at most this many nodes for one namespace's jobs at once (a tenant's failures, or a
    # tenant's lies, cannot fence off a node group), each for this long (seconds; then removed)
    suspect_taint_max_per_namespace: int = 2
    suspect_taint_ttl: float = 24 * 3600.0
    # the least restart backoff whatever spec.resilience.restartBackoffSeconds says (seconds): a job
    # that fails at once must not make the operator and the API server create attempts in a loop
    min_restart_backoff: float = 5.0
    # the ConfigMap (namespace, name) that keeps deleted jobs' node faults and node-hours for the
    # node MTBF of checkpoint.intervalMinutes auto (retired.py); None: deleted jobs are forgotten
    reliability_configmap: tuple[str, str] | None = None
    # how often a job's status.goodput figures are recomputed and written between transitions (seconds)
    goodput_interval: float = 300.0
    # The training backends (llmtrain.backends) this platform installed: the kinds the operator
    # watches, creates and has RBAC for, and the only ones a job may name (spec.cluster.backend).
    backends: tuple[str, ...] = (DEFAULT_BACKEND,)
    # the backend of a job that names none (chart: backends.default), and per namespace
    # (backends.namespaceDefaults: a namespace moved to another backend before the platform is)
    default_backend: str = DEFAULT_BACKEND
    namespace_backends: dict[str, str] = field(default_factory=dict)
    # A queued attempt whose child has no Kueue Workload this long after its creation (seconds) is
    # said to be one Kueue does not manage (status reason NoKueueWorkload, an event naming
    # Kueue's integrations.frameworks): Kueue makes a job's Workload within a second or so.
    kueue_workload_wait: float = 60.0
    # Node conditions that, False on a node under a running attempt, move the attempt away
    # (controller/policy/sicknodes.py; chart: nodeHealth.conditions): the EKS node monitoring agent's by
    # default, or another node problem detector's
    node_conditions: tuple[str, ...] = DEFAULT_CONDITIONS
    # moves off a sick node that spend no restart, per job; later ones spend the restart budget, so
    # a flapping node cannot restart a job without end (sicknodes.py)
    free_node_moves: int = FREE_MOVES
    # at most this many of the operator's children that their controller has not taken up yet, on a
    # backend whose creates are paced (controller/adapters/pacing.py; 0: never held)
    max_children_untaken: int = 64
