"""Resilience and rendezvous: what snapshots and replacements need, and the rendezvous endpoint."""

from __future__ import annotations

from collections.abc import Iterator

from .base import Problem, Subject, rule

# --- resilience -----------------------------------------------------------------------------------


@rule("spec.checkpoint.memory")
def memory_snapshots_need_checkpoints(j: Subject) -> Iterator[Problem]:
    """checkpoint.memory needs a checkpoint.uri.

    In-memory snapshots supplement durable checkpoints, they do not replace them: a node lost with
    its partner, or the whole job, takes its snapshots with it, and without a durable checkpoint
    the next attempt would start the training over from step 0."""
    c = j.spec.checkpoint
    if c.memory is not None and not c.uri:
        yield Problem(
            "spec.checkpoint.memory",
            "in-memory snapshots supplement durable checkpoints: without spec.checkpoint.uri, a node lost "
            "together with its partner (or the whole job) would restart the training from step 0",
            "a spec.checkpoint.uri, or no spec.checkpoint.memory",
        )


@rule("spec.resilience.stragglers.action")
def straggler_replace_needs_checkpoints(j: Subject) -> Iterator[Problem]:
    """stragglers action replace needs a checkpoint.uri.

    A replacement restarts the job away from the slow node and resumes from the newest checkpoint;
    without checkpoints it would start the training over, which no slowdown is worth."""
    s = j.spec
    if s.resilience.stragglers.action == "replace" and not s.checkpoint.uri:
        yield Problem(
            "spec.resilience.stragglers.action",
            "replace restarts the job away from a slow node, and without spec.checkpoint.uri every restart "
            "starts the training over",
            "report, or a spec.checkpoint.uri",
        )


# --- rendezvous -----------------------------------------------------------------------------------


@rule("spec.rendezvous.endpoint")
def endpoint_port(j: Subject) -> Iterator[Problem]:
    """The rendezvous endpoint's port, when given, is a number 1..65535."""
    endpoint = j.spec.rendezvous.endpoint or ""
    port = endpoint.rpartition(":")[2] if ":" in endpoint else None
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
        yield Problem(
            "spec.rendezvous.endpoint", f"{j.spec.rendezvous.endpoint!r} has no valid port", "host:port, port 1..65535"
        )


@rule("spec.rendezvous.endpoint")
def etcd_endpoint(j: Subject) -> Iterator[Problem]:
    """The etcd backends (etcd, etcd-v2) have an endpoint: the spec's, or the operator's default.

    The default is the operator's `--default-etcd-endpoint` (chart: `defaultEtcdEndpoint`); an
    operator started with an empty one has none. c10d needs no etcd."""
    r = j.spec.rendezvous
    if r.backend.startswith("etcd") and not (r.endpoint or j.default_etcd_endpoint):
        yield Problem(
            "spec.rendezvous.endpoint",
            f"backend {r.backend} needs an etcd endpoint and the operator has no default",
            "host:port of an etcd (v2 API enabled), or backend c10d",
        )
