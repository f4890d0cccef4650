"""A real etcd (v2 API on) with the chart's security flags (charts/llmtrain-operator/charts/
llmtrain-etcd/templates/statefulset.yaml, auth.enabled): HTTPS, client certificates of the
rendezvous CA required, /health on a plain-HTTP metrics listener. Shared by the trainer and the
operator tests; the caller bootstraps auth with the operator's code. The process itself is
llmtrain_devcluster.etcd.start_secured_etcd, which the demo runs on the real node's bridge."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from llmtrain import rendezvous_auth as ra
from llmtrain_devcluster.etcd import start_secured_etcd
from llmtrain_devcluster.process import stop_process
from llmtrain_trainer.cli.local import _etcd_binary


@contextmanager
def secured_etcd(tmp: Path, ca: ra.CertificateAuthority, client_port: int | None = None, host: str = "127.0.0.1"):
    """Yields host:port; the server certificate is for `host` (and localhost)."""
    server = ca.issue("etcd-server", server_names=(host, "localhost")).write(tmp / "server")
    proc, endpoint = start_secured_etcd(
        tmp / "data",
        host=host,
        cert=server / ra.CERT_KEY,
        key=server / ra.KEY_KEY,
        ca=server / ra.CA_KEY,
        log_path=tmp / "etcd.log",
        client_port=client_port,
        etcd=_etcd_binary(),  # the pinned one, else Debian's: test-fast runs without make tools
    )
    try:
        yield endpoint
    finally:
        stop_process(proc)
