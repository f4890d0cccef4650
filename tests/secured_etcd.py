"""A real etcd (3.4, v2 API on) with the chart's security flags (charts/llmtrain-operator/charts/
llmtrain-etcd/templates/statefulset.yaml, auth.enabled): HTTPS, client certificates of the
rendezvous CA required, /health on a plain-HTTP metrics listener. Shared by the trainer and the
operator tests; the caller bootstraps auth with the operator's code."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from llmtrain import rendezvous_auth as ra
from llmtrain_devcluster.process import free_port
from llmtrain_trainer.cli.local import _etcd_binary, etcd_process


@contextmanager
def secured_etcd(tmp: Path, ca: ra.CertificateAuthority, client_port: int | None = None):
    """Yields host:port; the server certificate is for 127.0.0.1 and localhost."""
    server = ca.issue("etcd-server", server_names=("127.0.0.1", "localhost")).write(tmp / "server")
    cport, pport, mport = client_port or free_port(), free_port(), free_port()
    curl, purl = f"https://127.0.0.1:{cport}", f"http://127.0.0.1:{pport}"
    argv = [
        _etcd_binary(),
        "--name=default",
        f"--data-dir={tmp / 'data'}",
        f"--listen-client-urls={curl}",
        f"--advertise-client-urls={curl}",
        f"--listen-peer-urls={purl}",
        f"--initial-advertise-peer-urls={purl}",
        f"--initial-cluster=default={purl}",
        "--initial-cluster-state=new",
        "--enable-v2=true",
        f"--cert-file={server / ra.CERT_KEY}",
        f"--key-file={server / ra.KEY_KEY}",
        f"--trusted-ca-file={server / ra.CA_KEY}",
        "--client-cert-auth=true",
        f"--listen-metrics-urls=http://127.0.0.1:{mport}",
        "--log-level=warn",
    ]
    # readiness as the chart's probes: the metrics listener's /health
    with etcd_process(argv, f"http://127.0.0.1:{mport}/health", str(tmp / "etcd.log")):
        yield f"127.0.0.1:{cport}"
