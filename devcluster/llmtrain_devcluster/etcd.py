"""A single-member etcd on free ports: the dev cluster's store on 127.0.0.1, and torch's rendezvous
store (plain in tests; with the chart's TLS flags where pods meet on it, :func:`start_secured_etcd`)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from .components import etcd_argv
from .process import DevClusterError, free_port, http_get, log_tail, spawn, stop_process, wait_until
from .tools import find_tool

__all__ = ["start_etcd", "start_secured_etcd"]


def start_etcd(
    data_dir: Path | str,
    enable_v2: bool = True,
    *,
    log_path: Path | str | None = None,
    client_port: int | None = None,
    timeout: float = 60.0,
) -> tuple[subprocess.Popen, str]:
    """Start a single-member etcd on free 127.0.0.1 ports and wait until ``/health`` is true.

    Returns ``(process, client_url)``. ``enable_v2`` turns on the v2 API that torch's etcd
    rendezvous (python-etcd) speaks. Stop it with :func:`.process.stop_process` (or terminate +
    wait).
    """
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    data_dir.chmod(0o700)
    log = Path(log_path) if log_path else data_dir.parent / f"{data_dir.name}.etcd.log"
    cport = client_port or free_port()
    pport = free_port()
    client_url = f"http://127.0.0.1:{cport}"
    peer_url = f"http://127.0.0.1:{pport}"
    argv = etcd_argv(find_tool("etcd"), data_dir, client_url, peer_url, enable_v2=enable_v2)
    return _started(argv, f"{client_url}/health", log, "etcd", timeout), client_url


def _started(argv: list, health_url: str, log: Path, what: str, timeout: float) -> subprocess.Popen:
    """etcd started with ``argv``, once ``health_url`` says it is healthy (stopped if it never is)."""
    proc = spawn(argv, log)

    def healthy() -> bool:
        status, body = http_get(health_url)
        return status == 200 and json.loads(body).get("health") == "true"

    def fail(msg: str) -> Exception:
        stop_process(proc)
        return DevClusterError(f"{what} {msg}\n--- tail of {log} ---\n{log_tail(log)}")

    wait_until(healthy, timeout=timeout, what=what, alive=lambda: proc.poll() is None, on_fail=fail)
    return proc


def start_secured_etcd(
    data_dir: Path | str,
    *,
    host: str,
    cert: Path,
    key: Path,
    ca: Path,
    log_path: Path | str,
    client_port: int | None = None,
    etcd: Path | str | None = None,
    timeout: float = 60.0,
) -> tuple[subprocess.Popen, str]:
    """A v2-enabled etcd with the chart's security flags (the llmtrain-etcd subchart with
    auth.enabled): HTTPS on ``host`` only, client certificates signed by ``ca`` required, and
    ``/health`` on a plain-HTTP metrics listener on 127.0.0.1 (as the chart's probes read it).
    ``cert`` must name ``host``. Returns ``(process, "host:port")``; who bootstraps its auth is the
    caller's business (the operator does, with the rendezvous CA). ``etcd``: the binary (default:
    the pinned one of ``make tools``)."""
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    data_dir.chmod(0o700)
    cport, pport, mport = client_port or free_port(), free_port(), free_port()
    argv = [
        *etcd_argv(
            Path(etcd or find_tool("etcd")),
            data_dir,
            f"https://{host}:{cport}",
            f"http://127.0.0.1:{pport}",
            enable_v2=True,
        ),
        f"--cert-file={cert}",
        f"--key-file={key}",
        f"--trusted-ca-file={ca}",
        "--client-cert-auth=true",
        f"--listen-metrics-urls=http://127.0.0.1:{mport}",
    ]
    proc = _started(argv, f"http://127.0.0.1:{mport}/health", Path(log_path), "secured etcd", timeout)
    return proc, f"{host}:{cport}"
