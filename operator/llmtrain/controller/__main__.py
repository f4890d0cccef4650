"""`llmtrain-operator`: run the operator (in a pod, or locally against a kubeconfig).

High availability: with `--leader-elect` replicas share a coordination.k8s.io Lease
(`leader.py`): exactly one holds it and runs the handlers; the others wait (serving /healthz) and
take over within seconds of the leader dying, or at once when it shuts down cleanly.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from typing import Any

import kopf
from prometheus_client import start_http_server

from ..spec import BACKENDS, DEFAULT_BACKEND, DEFAULT_ETCD_ENDPOINT
from . import kopfconfig
from .policy.config import OperatorConfig
from .policy.sicknodes import CONDITION_TYPE

DEFAULTS = OperatorConfig()


# The flags, in the order --help lists them: (flag, add_argument's keywords). The defaults read from
# the environment, and the lists that `append` fills, parse_args sets on each call (set_defaults):
# read when the arguments are parsed, not when this module is imported, and a new list every time.
FLAGS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("--namespace", {"action": "append", "help": "watch only this namespace (repeatable; default: all namespaces)"}),
    ("--liveness-port", {"type": int, "default": 8080, "help": "kopf /healthz port (0: off)"}),
    ("--metrics-port", {"type": int, "default": 8000, "help": "Prometheus /metrics port (0: off)"}),
    ("--bind-address", {"default": "0.0.0.0", "help": "address for the health and metrics servers"}),
    ("--default-etcd-endpoint", {}),  # default: from the environment (parse_args)
    (
        "--trainer-metrics-port",
        {
            "type": int,
            "default": DEFAULTS.trainer_metrics_port,
            "help": "port of rank 0's trainer metrics in the worker pod",
        },
    ),
    (
        "--progress-interval",
        {
            "type": float,
            "default": DEFAULTS.progress_interval,
            "help": "seconds between progress scrapes / hang checks per running job",
        },
    ),
    (
        "--leader-elect",
        {"action": "store_true", "help": "run only while holding a coordination.k8s.io Lease (for several replicas)"},
    ),
    ("--leader-election-namespace", {}),  # default: from the environment (parse_args)
    ("--leader-election-name", {"default": "llmtrain-operator"}),
    (
        "--reliability-configmap",
        {
            "default": "llmtrain-reliability",
            "help": "ConfigMap in --reliability-namespace that keeps deleted jobs' node faults and node-hours "
            "for checkpoint.intervalMinutes auto ('': forget them)",
        },
    ),
    ("--reliability-namespace", {}),  # default: from the environment (parse_args)
    (
        "--leader-lease-seconds",
        {"type": float, "default": 10.0, "help": "a dead leader is replaced this long after its last renewal"},
    ),
    (
        "--workers",
        {
            "type": int,
            "default": DEFAULTS.workers,
            "help": "reconciler worker threads: jobs reconciled at once (each makes blocking API calls)",
        },
    ),
    (
        "--suspect-taint-fraction",
        {
            "type": float,
            "default": DEFAULTS.suspect_taint_fraction,
            "help": "taint nodes blamed for a failed attempt llmtrain.dev/suspect=<reason>:NoSchedule, "
            "at most this fraction of the nodes of their instance type (default 0: never; "
            "needs RBAC to patch nodes)",
        },
    ),
    (
        "--job-network-policy",
        {
            "action": "store_true",
            "help": "create a NetworkPolicy per job: its pods accept only its own pods, except on the "
            "trainer metrics ports (needs RBAC to create networkpolicies)",
        },
    ),
    (
        "--rendezvous-ca-dir",
        {
            "default": None,
            "help": "directory with the rendezvous CA (ca.crt, ca.key): the default etcd requires "
            "client certificates, issued per namespace (needs RBAC to create secrets)",
        },
    ),
    (
        "--suspect-taint-max-per-namespace",
        {
            "type": int,
            "default": DEFAULTS.suspect_taint_max_per_namespace,
            "help": "at most this many nodes carry a suspect taint for one namespace's jobs at once "
            f"(default {DEFAULTS.suspect_taint_max_per_namespace})",
        },
    ),
    (
        "--suspect-taint-ttl-hours",
        {
            "type": float,
            "default": DEFAULTS.suspect_taint_ttl / 3600,
            "help": "a suspect taint is removed this long after it was set "
            f"(default {DEFAULTS.suspect_taint_ttl / 3600:g})",
        },
    ),
    (
        "--min-restart-backoff-seconds",
        {
            "type": float,
            "default": DEFAULTS.min_restart_backoff,
            "help": "the least wait before a restart, whatever a job's restartBackoffSeconds says "
            f"(default {DEFAULTS.min_restart_backoff:g})",
        },
    ),
    (
        "--backend",
        {
            "dest": "backends",
            "action": "append",
            "choices": BACKENDS,
            "help": "a training backend this platform installed, whose kind the operator watches and creates "
            f"(repeatable; default: {DEFAULT_BACKEND})",
        },
    ),
    (
        "--default-backend",
        {
            "choices": BACKENDS,
            "default": None,
            "help": "the backend of a job that names none in spec.cluster.backend (default: the first --backend)",
        },
    ),
    (
        "--namespace-backend",
        {
            "action": "append",
            "metavar": "NAMESPACE=BACKEND",
            "help": "the default backend of one namespace's jobs, over --default-backend (repeatable)",
        },
    ),
    (
        "--kueue-workload-wait-seconds",
        {
            "type": float,
            "default": DEFAULTS.kueue_workload_wait,
            "help": "a queued attempt whose child has no Kueue Workload this long after its creation is reported as "
            f"one Kueue does not manage (default {DEFAULTS.kueue_workload_wait:g})",
        },
    ),
    (
        "--node-conditions",
        {
            "default": ",".join(DEFAULTS.node_conditions),
            "help": "comma-separated node conditions that, False on a node under a job's attempt, move the attempt "
            "off the node (default: the EKS node monitoring agent's, " + ",".join(DEFAULTS.node_conditions) + "; "
            "empty: nodes' health is not watched)",
        },
    ),
    (
        "--free-node-moves",
        {
            "type": int,
            "default": DEFAULTS.free_node_moves,
            "help": "moves off a sick node per job that spend no restart; later ones spend the restart budget "
            f"(default {DEFAULTS.free_node_moves})",
        },
    ),
    (
        "--max-children-untaken",
        {
            "type": int,
            "default": DEFAULTS.max_children_untaken,
            "help": "at most this many children created that their controller has not taken up yet, on a backend whose "
            "creates are paced (JobSet); further creates wait their turn (0: never held; "
            f"default {DEFAULTS.max_children_untaken})",
        },
    ),
    ("--verbose", {"action": "store_true"}),
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="llmtrain-operator", description=__doc__.splitlines()[0])
    for flag, options in FLAGS:
        p.add_argument(flag, **options)
    pod_namespace = os.environ.get("POD_NAMESPACE", "default")
    p.set_defaults(
        namespace=[],
        backends=[],
        namespace_backend=[],
        default_etcd_endpoint=os.environ.get("LLMTRAIN_DEFAULT_ETCD_ENDPOINT", DEFAULT_ETCD_ENDPOINT),
        leader_election_namespace=pod_namespace,
        reliability_namespace=pod_namespace,
    )
    return p.parse_args(argv)


def node_conditions(flag: str) -> tuple[str, ...]:
    """--node-conditions as a tuple, or SystemExit naming the flag and what a name may be."""
    names = tuple(dict.fromkeys(n.strip() for n in flag.split(",") if n.strip()))
    for n in names:
        if not CONDITION_TYPE.fullmatch(n):
            raise SystemExit(
                f"--node-conditions: {n!r} is not a condition type (letters, digits, '.', '_', '-', '/'; at most 316)"
            )
    return names


def backend_config(args: argparse.Namespace) -> tuple[tuple[str, ...], str, dict[str, str]]:
    """(enabled backends, default backend, namespace defaults) from the flags, or SystemExit naming
    the flag that is wrong."""
    enabled = tuple(dict.fromkeys(args.backends or [DEFAULT_BACKEND]))
    default = args.default_backend or enabled[0]
    if default not in enabled:
        raise SystemExit(f"--default-backend {default} is not one of the enabled backends (--backend): {enabled}")
    per_namespace: dict[str, str] = {}
    for item in args.namespace_backend:
        namespace, sep, backend = item.partition("=")
        if not sep or not namespace or backend not in enabled:
            raise SystemExit(
                f"--namespace-backend {item!r}: expected NAMESPACE=BACKEND with BACKEND one of the enabled {enabled}"
            )
        per_namespace[namespace] = backend
    return enabled, default, per_namespace


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not args.verbose:  # kopf logs every handler and timer run of every object at INFO
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    if not 0 <= args.suspect_taint_fraction <= 1:
        raise SystemExit(f"--suspect-taint-fraction must be in [0, 1], got {args.suspect_taint_fraction}")
    if args.suspect_taint_max_per_namespace < 0 or not args.suspect_taint_ttl_hours > 0:
        raise SystemExit("--suspect-taint-max-per-namespace must be ≥ 0 and --suspect-taint-ttl-hours > 0")
    if args.min_restart_backoff_seconds < 0:
        raise SystemExit("--min-restart-backoff-seconds must be ≥ 0")
    if args.rendezvous_ca_dir and not args.default_etcd_endpoint:
        raise SystemExit("--rendezvous-ca-dir needs --default-etcd-endpoint (the etcd it secures)")
    if not args.kueue_workload_wait_seconds > 0:
        raise SystemExit("--kueue-workload-wait-seconds must be > 0")
    if args.max_children_untaken < 0:
        raise SystemExit(f"--max-children-untaken must be ≥ 0, got {args.max_children_untaken}")
    if args.free_node_moves < 0:
        raise SystemExit(f"--free-node-moves must be ≥ 0, got {args.free_node_moves}")
    conditions = node_conditions(args.node_conditions)
    enabled, default_backend, namespace_backends = backend_config(args)
    config = OperatorConfig(
        default_etcd_endpoint=args.default_etcd_endpoint or None,
        trainer_metrics_port=args.trainer_metrics_port,
        progress_interval=args.progress_interval,
        workers=args.workers,
        suspect_taint_fraction=args.suspect_taint_fraction,
        suspect_taint_max_per_namespace=args.suspect_taint_max_per_namespace,
        suspect_taint_ttl=args.suspect_taint_ttl_hours * 3600,
        min_restart_backoff=args.min_restart_backoff_seconds,
        node_conditions=conditions,
        free_node_moves=args.free_node_moves,
        job_network_policy=args.job_network_policy,
        rendezvous_ca_dir=args.rendezvous_ca_dir,
        reliability_configmap=(args.reliability_namespace, args.reliability_configmap)
        if args.reliability_configmap
        else None,
        backends=enabled,
        default_backend=default_backend,
        namespace_backends=namespace_backends,
        kueue_workload_wait=args.kueue_workload_wait_seconds,
        max_children_untaken=args.max_children_untaken,
    )
    from . import watch
    from .adapters import tenancy
    from .operator import Operator

    tenancy.warm(config)
    watch.register(Operator(config))
    # What exists now (modules, pydantic and kubernetes client classes, kopf's registry: ~160,000
    # objects) lives as long as the process. Frozen, the cyclic collector's full collections skip
    # it and walk only what the watch caches and reconciles create: those collections were ~15% of
    # the operator's CPU while it re-adopted 600 jobs (docs/performance/operator-scale.md).
    gc.freeze()
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.bind_address)

    @kopf.on.startup()
    def configure(settings: kopf.OperatorSettings, **_):
        kopfconfig.apply(settings)

    elector = None
    if args.leader_elect:
        elector = _become_leader(args)

    try:
        _run_kopf(args)
    finally:
        if elector is not None:
            elector.release()
    return 0


def _become_leader(args):
    """Block until this replica holds the Lease, serving /healthz meanwhile; then keep renewing
    and exit the process the moment the lease is lost (a stale leader must not act)."""
    from .adapters.leader import LeaderElector, LeaseConfig

    identity = os.environ.get("POD_NAME") or f"{os.uname().nodename}-{os.getpid()}"
    lease = args.leader_lease_seconds
    elector = LeaderElector(
        LeaseConfig(
            name=args.leader_election_name,
            namespace=args.leader_election_namespace,
            identity=identity,
            lease_seconds=lease,
            renew_deadline=lease * 0.6,
            retry=max(0.2, lease / 10),
        )
    )
    standby = _standby_health_server(args) if args.liveness_port else None
    try:
        elector.wait_until_leader()
    finally:
        if standby is not None:
            standby.shutdown()
            standby.server_close()

    def lost():
        logging.getLogger("llmtrain.leader").error("lease lost: exiting so that only the new leader acts")
        os._exit(3)

    elector.keep_renewing(lost)
    return elector


def _standby_health_server(args):
    import http.server
    import threading

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path.startswith("/healthz") else 404)
            self.end_headers()
            self.wfile.write(b"standby\n")

        def log_message(self, *_):
            pass

    http.server.HTTPServer.allow_reuse_address = True
    server = http.server.HTTPServer((args.bind_address, args.liveness_port), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _run_kopf(args) -> None:
    kopf.run(
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        standalone=True,  # HA is the Lease (leader.py), not kopf's peering
        liveness_endpoint=f"http://{args.bind_address}:{args.liveness_port}/healthz" if args.liveness_port else None,
    )


if __name__ == "__main__":
    sys.exit(main())
