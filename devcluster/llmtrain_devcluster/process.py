"""Process supervision: starting components, free ports, readiness polling, pid files and bounded
shutdown."""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class DevClusterError(RuntimeError):
    """A dev-cluster component failed to start, or the cluster is not in the expected state."""


def spawn(cmd: Sequence[str | Path], log_path: Path, *, env: dict | None = None) -> subprocess.Popen:
    """Start a component in its own session (it outlives the starter), output to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(f"\n# {' '.join(map(str, cmd))}\n".encode())
        log.flush()
        return subprocess.Popen(
            [str(c) for c in cmd],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            close_fds=True,
        )


@functools.cache
def _unshare_mount() -> tuple[str, ...] | None:
    """``unshare`` flags that give a child a private mount namespace in which it may bind-mount
    (as root; else inside a user namespace), or None where this host allows neither."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    for flags in (("--mount",), ("--mount", "--map-root-user")):
        cmd = (unshare, *flags, "--propagation", "private", "--")
        probe = subprocess.run([*cmd, "sh", "-c", "mount --bind /tmp /tmp"], capture_output=True)
        if probe.returncode == 0:
            return cmd
    return None


def private_tmp_available() -> bool:
    """Whether :func:`with_private_tmp` can make a private mount namespace on this host."""
    return _unshare_mount() is not None


_PRIVATE_TMP_SH = """set -e
root=$1; n=$2; shift 2
while [ "$n" -gt 0 ]; do mount --bind "/tmp$1" "$root$1"; n=$((n - 1)); shift; done
mount --rbind "$root" /tmp
exec "$@"
"""


def with_private_tmp(tmp: Path, argv: Sequence[str | Path], *, keep: Sequence[Path] = ()) -> list[str | Path] | None:
    """``argv`` run with ``tmp`` bind-mounted over ``/tmp`` in a private mount namespace, so what
    the process writes to ``/tmp`` lands in ``tmp`` and nobody else sees it; None where the host
    cannot make one. The process keeps the pid (unshare and sh exec, neither forks).

    ``keep``: files under the real ``/tmp`` the process needs (a state dir under /tmp holds its
    kubeconfig): each stays visible at its own path, bind-mounted onto a mountpoint created here
    under ``tmp``."""
    prefix = _unshare_mount()
    if prefix is None:
        return None
    real_tmp = Path("/tmp").resolve()
    kept = []
    for f in keep:
        f = Path(f).resolve()
        if not f.is_relative_to(real_tmp):
            continue
        mountpoint = tmp / f.relative_to(real_tmp)
        mountpoint.parent.mkdir(parents=True, exist_ok=True)
        mountpoint.touch()
        kept.append(f"/{f.relative_to(real_tmp)}")
    # sh binds /tmp/<rel> onto tmp/<rel>: the mountpoint made above.
    return [*prefix, "sh", "-c", _PRIVATE_TMP_SH, "sh", str(tmp), str(len(kept)), *kept, *argv]


# Ports handed out by free_port() come from below the kernel's ephemeral range, so no outgoing
# connection (a component's to the API server, a client's) can take one between free_port() and the
# server's bind, and each is reserved for RESERVE_S across processes (see free_port()).
PORTS_FROM = 16384
RESERVE_S = 300.0
_reserved: list[tuple[float, socket.socket]] = []  # (when, the reservation's socket), oldest first
_rng = random.Random()
_lock = threading.Lock()


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _reserve(port: int) -> bool:
    """Claim ``port`` for RESERVE_S against every other free_port() caller on this machine (other
    processes, other xdist workers): an abstract Unix socket named after it, which no other process
    can bind while this one holds it and which the kernel drops when this process ends. No file is
    written (a dev cluster writes nothing outside its state directory)."""
    now = time.monotonic()
    while _reserved and now - _reserved[0][0] > RESERVE_S:
        _reserved.pop(0)[1].close()
    claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        claim.bind(f"\0llmtrain-port-{port}")
    except OSError:
        claim.close()
        return False
    _reserved.append((now, claim))
    return True


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_block(n: int) -> int:
    """A base port with ``n`` consecutive ports on 127.0.0.1, free right now and handed out to no
    other free_port() caller for RESERVE_S (a trainer's metrics port + LOCAL_RANK).

    ``bind(port 0)`` and close, as before, let two xdist workers get the same port at once, or an
    outgoing connection take it before the server bound it. Here ports come from
    [PORTS_FROM, start of the ephemeral range) and each is reserved (:func:`_reserve`); where that
    range is too small (a machine whose ephemeral range starts low) from ``bind(0)``, reserved too."""
    lo, hi = PORTS_FROM, _ephemeral_range()[0]
    with _lock:
        return _free_block(n, lo, hi)


def _free_block(n: int, lo: int, hi: int) -> int:
    for _ in range(200):
        if hi - lo >= 1024:
            base = _rng.randrange(lo, hi - n + 1)
        else:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", 0))
                base = s.getsockname()[1]
        ports = range(base, base + n)
        if all(_bindable(p) for p in ports) and all(_reserve(p) for p in ports):
            return base
    raise RuntimeError(f"no block of {n} free ports on 127.0.0.1")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now and that no other free_port() caller on this
    machine gets for RESERVE_S (see :func:`free_port_block`)."""
    return free_port_block(1)


def log_tail(path: Path | str, lines: int = 40) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as e:
        return f"<no log: {e}>"
    return "\n".join(text.splitlines()[-lines:])


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get(url: str, *, context: ssl.SSLContext | None = None, timeout: float = 2.0):
    """GET ``url`` without any proxy; returns (status, body) or raises OSError."""
    opener = _NO_PROXY
    if context is not None:
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
        )
    try:
        with opener.open(url, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def wait_until(
    check: Callable[[], T],
    *,
    timeout: float,
    what: str,
    alive: Callable[[], bool] | None = None,
    on_fail: Callable[[str], Exception] | None = None,
) -> T:
    """Poll ``check`` (with a short backoff) until it returns something truthy, which is returned;
    fail when the process dies or time runs out (exceptions from ``check`` count as "not yet")."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    last_err = ""
    while True:
        try:
            value = check()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 - reported if we time out
            last_err = f"{type(e).__name__}: {e}"
        if alive is not None and not alive():
            msg = f"{what}: process exited before becoming ready"
            raise (on_fail(msg) if on_fail else DevClusterError(msg))
        if time.monotonic() >= deadline:
            msg = f"{what}: not ready after {timeout:.0f}s" + (f" (last error: {last_err})" if last_err else "")
            raise (on_fail(msg) if on_fail else DevClusterError(msg))
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)


def wait_ready(name: str, proc: subprocess.Popen, check: Callable[[], object], *, timeout: float, log: Path) -> None:
    """Poll ``check`` until it is truthy; if ``proc`` exits first or time runs out, raise
    DevClusterError carrying the tail of its ``log``."""

    def fail(msg: str) -> Exception:
        return DevClusterError(f"{name} {msg}\n--- tail of {log} ---\n{log_tail(log)}")

    wait_until(check, timeout=timeout, what=name, alive=lambda: proc.poll() is None, on_fail=fail)


# --- pid bookkeeping that survives the process that started the cluster ------------------


def _proc_start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks): detects pid reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def pid_record(proc: subprocess.Popen) -> dict:
    return {"pid": proc.pid, "start": _proc_start_time(proc.pid)}


def is_running(rec: dict) -> bool:
    """True while the recorded process exists (and is not a zombie) and is the same process."""
    pid = rec["pid"]
    state = _proc_state(pid)
    if state is None or state in ("Z", "X"):
        return False
    return rec.get("start") is None or _proc_start_time(pid) == rec["start"]


def write_pids(path: Path, records: dict[str, dict]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(records, indent=2))
    os.replace(tmp, path)


def read_pids(path: Path) -> dict[str, dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def stop_pid(rec: dict, *, proc: subprocess.Popen | None = None, term_timeout: float = 15.0) -> None:
    """SIGTERM the process (its own session/process group), SIGKILL after ``term_timeout``.

    Returns only once the process is gone (reaped if it is our child).
    """
    pid = rec["pid"]

    def gone() -> bool:
        if proc is not None:
            return proc.poll() is not None
        return not is_running(rec)

    def send(sig: int) -> None:
        if gone():
            return
        try:
            # Started with start_new_session=True: pid is its process-group id.
            if os.getpgid(pid) == pid:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except ProcessLookupError:
            pass

    send(signal.SIGTERM)
    deadline = time.monotonic() + term_timeout
    delay = 0.02
    while not gone() and time.monotonic() < deadline:
        time.sleep(delay)
        delay = min(delay * 1.5, 0.25)
    if not gone():
        send(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not gone() and time.monotonic() < deadline:
            time.sleep(0.05)
    if proc is not None:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    if not gone():
        raise DevClusterError(f"process {pid} survived SIGKILL")


def stop_process(proc: subprocess.Popen, term_timeout: float = 15.0) -> None:
    """SIGTERM a process started here (its whole session), SIGKILL after a bounded wait, reap it."""
    stop_pid({"pid": proc.pid, "start": None}, proc=proc, term_timeout=term_timeout)
