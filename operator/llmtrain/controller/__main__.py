"""`llmtrain-operator`: run the operator (in a pod, or locally against a kubeconfig).

High availability: with `--peering NAME` replicas coordinate through kopf peering objects; the
replica with the highest priority acts, the others stand by. kopf freezes every replica that shares
a priority, so the default priority is derived from the pod name (distinct per replica).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import sys

import kopf
from prometheus_client import start_http_server

from ..spec import DEFAULT_ETCD_ENDPOINT, LLMTrainingJobSpec
from .config import CONFIG


# Sections the CRD makes immutable (the CEL rule `self == oldSelf` on the section).
IMMUTABLE_SECTIONS = [name for name, field in LLMTrainingJobSpec.model_fields.items()
                      if name not in ("checkpoint", "resilience")]


def default_priority() -> int:
    pod = os.environ.get("POD_NAME") or os.uname().nodename
    return int(hashlib.sha256(pod.encode()).hexdigest()[:6], 16) + 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="llmtrain-operator", description=__doc__.splitlines()[0])
    p.add_argument("--namespace", action="append", default=[],
                   help="watch only this namespace (repeatable; default: all namespaces)")
    p.add_argument("--liveness-port", type=int, default=8080, help="kopf /healthz port (0: off)")
    p.add_argument("--metrics-port", type=int, default=8000, help="Prometheus /metrics port (0: off)")
    p.add_argument("--bind-address", default="0.0.0.0", help="address for the health and metrics servers")
    p.add_argument("--peering", help="kopf peering name for several replicas (default: standalone)")
    p.add_argument("--priority", type=int, default=None, help="peering priority (default: from POD_NAME)")
    p.add_argument("--default-etcd-endpoint", default=os.environ.get("LLMTRAIN_DEFAULT_ETCD_ENDPOINT",
                                                                     DEFAULT_ETCD_ENDPOINT))
    p.add_argument("--trainer-metrics-port", type=int, default=CONFIG.trainer_metrics_port,
                   help="port of rank 0's trainer metrics in the worker pod")
    p.add_argument("--progress-interval", type=float, default=CONFIG.progress_interval,
                   help="seconds between progress scrapes / hang checks per running job")
    p.add_argument("--workers", type=int, default=CONFIG.workers,
                   help="handler threads (sync handlers make blocking API calls)")
    p.add_argument("--verbose", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    CONFIG.default_etcd_endpoint = args.default_etcd_endpoint or None
    CONFIG.trainer_metrics_port = args.trainer_metrics_port
    CONFIG.progress_interval = args.progress_interval
    CONFIG.workers = args.workers
    from . import handlers  # noqa: F401 — importing registers the handlers with kopf
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.bind_address)

    @kopf.on.startup()
    def configure(settings: kopf.OperatorSettings, **_):
        settings.posting.level = logging.INFO
        settings.watching.server_timeout = 300
        settings.networking.request_timeout = 60
        settings.execution.max_workers = CONFIG.workers  # sync handlers run in this pool; API calls block
        # kopf waits this long for more events of one object before handling it; its 0.1 s default
        # is a tenth of a second on every new job's create→PyTorchJob latency.
        settings.batching.batch_window = 0.02
        # Progress in annotations, not status.kopf: status is ours and the chart's printer columns'.
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="llmtrain.dev")
        # The diff base is an annotation, and annotations share a 256 KiB limit: storing the whole
        # spec there broke jobs with a large spec (cluster.env). Only the mutable sections are ever
        # diffed (spec_changed), so only they are stored; the API server's CEL rules keep the others.
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix="llmtrain.dev", key="last-handled-configuration",
            ignored_fields=[f"spec.{s}" for s in IMMUTABLE_SECTIONS])

    kopf.run(
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        standalone=not args.peering,
        peering_name=args.peering,
        priority=args.priority if args.priority is not None else (default_priority() if args.peering else 0),
        liveness_endpoint=f"http://{args.bind_address}:{args.liveness_port}/healthz" if args.liveness_port else None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
