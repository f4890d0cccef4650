"""Starting and stopping the real node: its slot, bridge, cgroups, containerd, images, kubelet and
CoreDNS, in that order; ``down`` in the order that leaves nothing behind.

**One private mount namespace.** containerd runs under ``unshare --mount --propagation private``
with the state directory's ``ns/{var-lib,var-log,run}`` bound over ``/var/lib``, ``/var/log`` and
``/run``; the kubelet joins that namespace (``nsenter --mount``). What they still write to
hard-coded paths (the kubelet's ``/var/lib/kubelet/device-plugins`` and ``/var/log/containers``,
libcni's ``/var/lib/cni``, containerd's ``/run/containerd/s`` shim sockets) lands in the state
directory, is never seen by the host or the other dev cluster's node, and every mount they make
(rootfs overlays, netns, volumes) vanishes with the namespace's last process.

**Down**, hard and in this order (a graceful drain is not needed for a dev cluster): CoreDNS, the
kubelet (so it restarts nothing), SIGKILL every process in the node's cgroup tree, the containers'
records removed through containerd (so the kept containerd root starts clean next time),
containerd, the shims whose argv names our socket (a shim outlives containerd by design), wait for
the cgroups to empty and remove them deepest first, delete the bridge, and last release the slot.

What lives where: ``<state_dir>/node/`` (everything per run; ``node.json`` records it; the
kubelet's root is its default ``/var/lib/kubelet``, i.e. ``<state_dir>/node/ns/var-lib/kubelet``)
and ``$LLMTRAIN_CACHE/node/slot-<n>/`` (``containerd-root``: images and snapshots, kept across runs,
wiped but for its content store when the previous run did not end in a clean ``down``;
``run/containerd.sock``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

from ..certs import load_ca
from ..kubeconfigs import write_cert_kubeconfig
from ..pki import CertificateAuthority
from ..process import (
    DevClusterError,
    free_port,
    http_get,
    is_running,
    pid_record,
    spawn,
    stop_pid,
    wait_ready,
)
from ..tools import find_tool, node_cni_dir, node_image, refuse_in_unmarked_test
from . import cgroups, containerd, coredns, images, kubelet, network
from .oci_archive import read_index
from .slots import Slot, claim_slot, slot_dir

__all__ = ["NODE_NAME", "down", "read_info", "start", "status"]

NODE_NAME = "real-node"
_STOP_ORDER = ("coredns", "kubelet")  # then the cgroup tree, containerd, shims, and "slot" last
_HIDDEN = ("/var/lib", "/var/log", "/run")  # bound over inside the node's mount namespace
_CONTENT = "io.containerd.content.v1.content"
_SOCKET_MAX = 104  # containerd's limit for a unix socket path

_NS_SH = """set -e
mount --bind "$1" /var/lib
mount --bind "$2" /var/log
mount --bind "$3" /run
shift 3
exec "$@"
"""


def _dir(state_dir: Path) -> Path:
    return Path(state_dir) / "node"


def read_info(state_dir: Path | str) -> dict:
    try:
        return json.loads((_dir(Path(state_dir)) / "node.json").read_text())
    except (OSError, ValueError):
        return {}


def _write_info(state_dir: Path, info: dict) -> None:
    path = _dir(state_dir) / "node.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(info, indent=2))
    os.replace(tmp, path)


def _check_host(paths: list[Path]) -> None:
    if os.geteuid() != 0:
        raise DevClusterError("the real node needs root (a bridge, cgroups and a mount namespace of its own)")
    for p in paths:
        r = p.resolve()
        for hidden in _HIDDEN:
            if r.is_relative_to(hidden):
                raise DevClusterError(
                    f"{p} lies under {hidden}, which the real node's mount namespace replaces: "
                    "use a state directory (and LLMTRAIN_CACHE) elsewhere"
                )


def _prepare_root(root: Path) -> None:
    """The kept containerd root: as the last clean ``down`` left it, else wiped but for its
    content store (a crashed run's containers and snapshots must not come back)."""
    clean = root.parent / "clean"
    if root.exists() and not clean.exists():
        for child in root.iterdir():
            if child.name != _CONTENT:
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    clean.unlink(missing_ok=True)
    root.mkdir(parents=True, exist_ok=True)


def _socket_up(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


def _node_ready(cluster: Any) -> bool:
    from kubernetes import client

    with cluster.api_client() as api:
        node = client.CoreV1Api(api).read_node(NODE_NAME)
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


def _apply_rbac(cluster: Any) -> None:
    from kubernetes import client

    with cluster.api_client() as api:
        rbac = client.RbacAuthorizationV1Api(api)
        role, binding = coredns.rbac()
        for create, body in ((rbac.create_cluster_role, role), (rbac.create_cluster_role_binding, binding)):
            try:
                create(body)
            except client.ApiException as e:
                if e.status != 409:
                    raise


def start(cluster: Any, *, timeout: float = 120.0, verbosity: int = 1) -> dict:
    """Start the real node of ``cluster`` (a running ``DevCluster``); returns what ``node.json``
    records. On failure whatever was started is torn down again."""
    refuse_in_unmarked_test("cluster", "a real node")
    state_dir = Path(cluster.state_dir)
    d = _dir(state_dir)
    _check_host([state_dir, slot_dir(0).parent])
    tools = {t: find_tool(t) for t in ("kubelet", "containerd", "ctr", "runc", "coredns")}
    cni_bin, pause, busybox = node_cni_dir(), node_image("pause"), node_image("busybox")
    down(state_dir)  # a previous run's leftovers
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    logs = cluster.logs_dir
    slot, holder = claim_slot(logs / "node-slot.log")
    info: dict[str, Any] = {"name": NODE_NAME, "slot": slot.index, "pids": {"slot": pid_record(holder)}}
    _write_info(state_dir, info)
    try:
        _start(cluster, d, slot, info, tools, cni_bin, (pause, busybox), timeout, verbosity)
    except BaseException:
        down(state_dir)
        raise
    return info


def _start(
    cluster: Any,
    d: Path,
    slot: Slot,
    info: dict,
    tools: dict[str, Path],
    cni_bin: Path,
    archives: tuple[Path, ...],
    timeout: float,
    verbosity: int,
) -> None:
    state_dir = Path(cluster.state_dir)
    sdir = slot_dir(slot.index)
    _kill_shims(_last_socket(sdir))  # of a run on this slot that died without its down
    cgroups.remove(slot.cgroup_root)
    for sub in ("ns/var-lib", "ns/var-log", "ns/run", "tmp", "cni/net.d", "cni/ipam", "containerd/state"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    ctd = _containerd_paths(d, sdir, tools["runc"], cni_bin)
    info.update(
        socket=str(ctd.socket), bridge=slot.bridge, ip=slot.ip, cgroup_root=slot.cgroup_root, subnet=slot.subnet
    )
    _write_info(state_dir, info)

    network.create_bridge(slot)
    cgroups.create(slot.cgroup_root)
    env = {
        **os.environ,
        "PATH": f"{tools['containerd'].parent}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}",
        "TMPDIR": str(d / "tmp"),
    }
    ctd_proc = _start_containerd(cluster, d, slot, info, ctd, tools["containerd"], archives, env, timeout)
    ca = load_ca(cluster.pki_dir)
    kproc = _start_kubelet(cluster, d, slot, info, ca, ctd, ctd_proc, tools["kubelet"], env, verbosity)
    # CoreDNS while the kubelet registers.
    dproc, ready_port = _start_coredns(cluster, d, slot, info, ca, tools["coredns"])

    wait_ready("kubelet", kproc, lambda: _node_ready(cluster), timeout=timeout, log=cluster.logs_dir / "kubelet.log")
    wait_ready(
        "coredns",
        dproc,
        lambda: http_get(f"http://127.0.0.1:{ready_port}/ready")[0] == 200,
        timeout=timeout,
        log=cluster.logs_dir / "coredns.log",
    )


def _containerd_paths(d: Path, sdir: Path, runc: Path, cni_bin: Path) -> containerd.ContainerdPaths:
    """Where the node's containerd keeps what: its root kept in the slot's directory across runs
    (:func:`_prepare_root`), the rest in the state directory; no stale socket left at its path."""
    ctd = containerd.ContainerdPaths(
        root=sdir / "containerd-root",
        state=d / "containerd" / "state",
        # In the slot's directory: a unix socket's path must stay under 104 bytes, a state
        # directory's need not (pytest's are longer); the slot is ours alone.
        socket=sdir / "run" / "containerd.sock",
        runc_root=d / "containerd" / "runc",
        opt=d / "containerd" / "opt",
        cni_conf_dir=d / "cni" / "net.d",
        cni_bin_dir=cni_bin,
        runc=runc,
    )
    _prepare_root(ctd.root)
    if len(str(ctd.socket)) + len(".ttrpc") > _SOCKET_MAX:
        raise DevClusterError(
            f"{ctd.socket}: too long for a unix socket ({_SOCKET_MAX} bytes at most); use a shorter LLMTRAIN_CACHE"
        )
    ctd.socket.parent.mkdir(parents=True, exist_ok=True)
    for stale in (ctd.socket, Path(str(ctd.socket) + ".ttrpc")):
        stale.unlink(missing_ok=True)
    (sdir / "last-socket").write_text(str(ctd.socket))
    return ctd


def _start_containerd(
    cluster: Any,
    d: Path,
    slot: Slot,
    info: dict,
    ctd: containerd.ContainerdPaths,
    binary: Path,
    archives: tuple[Path, ...],
    env: dict[str, str],
    timeout: float,
) -> subprocess.Popen:
    """containerd in the node's own mount namespace (the module's docstring), serving once its
    socket answers, with ``archives`` imported (the first is the pause image)."""
    state_dir = Path(cluster.state_dir)
    (ctd.cni_conf_dir / "10-llmtrain.conflist").write_text(network.cni_conflist(slot, d / "cni" / "ipam"))
    pause_ref = read_index(archives[0]).name
    cfg = d / "containerd" / "config.toml"
    cfg.write_text(containerd.config_toml(ctd, sandbox_image=pause_ref))
    ns = [d / "ns" / "var-lib", d / "ns" / "var-log", d / "ns" / "run"]
    argv: list[str | Path] = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _NS_SH, "sh", *ns]
    log = cluster.logs_dir / "containerd.log"
    ctd_proc = spawn([*argv, binary, "--config", cfg], log, env=env)
    info["pids"]["containerd"] = pid_record(ctd_proc)
    _write_info(state_dir, info)
    wait_ready("containerd", ctd_proc, lambda: _socket_up(ctd.socket), timeout=timeout, log=log)
    for archive in archives:
        images.import_image(state_dir, archive)
    return ctd_proc


def _start_kubelet(
    cluster: Any,
    d: Path,
    slot: Slot,
    info: dict,
    ca: CertificateAuthority,
    ctd: containerd.ContainerdPaths,
    ctd_proc: subprocess.Popen,
    binary: Path,
    env: dict[str, str],
    verbosity: int,
) -> subprocess.Popen:
    """The kubelet, in containerd's mount namespace; the caller waits for it (its node Ready)."""
    kpaths = kubelet.KubeletPaths(
        dir=d / "kubelet",
        # Its default, inside the node's mount namespace (so in the state directory's ns/var-lib):
        # its pod-resources socket's path stays short whatever the state directory's length.
        root=Path("/var/lib/kubelet"),
        pod_logs=d / "kubelet" / "pod-logs",
        volume_plugins=d / "kubelet" / "volume-plugins",
        client_ca=cluster.pki_dir / "ca.crt",
        runtime_socket=ctd.socket,
    )
    kubelet.write_certs(ca, kpaths, name=NODE_NAME, ip=slot.ip, server=cluster.server)
    port, healthz = free_port(), free_port()
    kpaths.config.write_text(kubelet.config_yaml(kpaths, slot, port=port, healthz_port=healthz))
    nsenter = ["nsenter", f"--mount=/proc/{ctd_proc.pid}/ns/mnt", "--"]
    kargv = kubelet.argv(binary, kpaths, name=NODE_NAME, ip=slot.ip, verbosity=verbosity)
    kproc = spawn([*nsenter, *kargv], cluster.logs_dir / "kubelet.log", env=env)
    info["pids"]["kubelet"] = pid_record(kproc)
    info["kubelet"] = f"https://{slot.ip}:{port}"
    _write_info(Path(cluster.state_dir), info)
    return kproc


def _start_coredns(
    cluster: Any, d: Path, slot: Slot, info: dict, ca: CertificateAuthority, binary: Path
) -> tuple[subprocess.Popen, int]:
    """CoreDNS with its RBAC and a client certificate of its own; returns it and its readiness
    port, for the caller to wait on."""
    _apply_rbac(cluster)
    cert, key = ca.issue(coredns.USER, client=True)
    dns_kc = d / "coredns" / "kubeconfig"
    write_cert_kubeconfig(
        dns_kc, server=cluster.server, ca_pem=ca.cert_pem, user=coredns.USER, cert_pem=cert, key_pem=key
    )
    ready_port = free_port()
    corefile = d / "coredns" / "Corefile"
    corefile.write_text(coredns.corefile(slot, kubeconfig=dns_kc, ready_port=ready_port))
    dproc = spawn(coredns.argv(binary, corefile), cluster.logs_dir / "coredns.log")
    info["pids"]["coredns"] = pid_record(dproc)
    info["dns"] = f"{slot.ip}:53"
    _write_info(Path(cluster.state_dir), info)
    return dproc, ready_port


def _last_socket(sdir: Path) -> str | None:
    try:
        return (sdir / "last-socket").read_text().strip() or None
    except OSError:
        return None


def _kill_shims(sock: str | None) -> int:
    """SIGKILL every containerd shim whose argv names ``sock`` (``-address <sock>``)."""
    if not sock:
        return 0
    n = 0
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"-address" in argv and argv.index(b"-address") + 1 < len(argv):
            if argv[argv.index(b"-address") + 1].decode(errors="replace") == sock:
                try:
                    os.kill(int(p.name), signal.SIGKILL)
                    n += 1
                except ProcessLookupError:
                    pass
    return n


def _forget_containers(sock: str) -> bool:
    """Delete every task and container record in the node's containerd (their processes are
    dead already), so the kept root holds only images; True when it did."""
    try:
        tasks = images.ctr(sock, "tasks", "ls", "-q", timeout=20).stdout.split()
        if tasks:
            images.ctr(sock, "tasks", "delete", "-f", *tasks, timeout=20, check=False)
        ctrs = images.ctr(sock, "containers", "ls", "-q", timeout=20).stdout.split()
        if ctrs:
            images.ctr(sock, "containers", "rm", *ctrs, timeout=20)
    except (DevClusterError, subprocess.TimeoutExpired, OSError):
        return False
    return True


def down(state_dir: Path | str, *, term_timeout: float = 10.0) -> list[str]:
    """Stop the real node recorded in ``state_dir`` and remove what it made (see the module's
    docstring for the order); returns what could not be removed (nothing, normally)."""
    state_dir = Path(state_dir)
    info = read_info(state_dir)
    if not info:
        return []
    pids = info.get("pids", {})
    problems: list[str] = []
    for name in _STOP_ORDER:
        if name in pids:
            try:
                stop_pid(pids[name], term_timeout=term_timeout)
            except DevClusterError as e:
                problems.append(f"{name}: {e}")
    root = info.get("cgroup_root")
    if root:
        cgroups.kill_all(root)
    sock = info.get("socket")
    clean = False
    ctd = pids.get("containerd")
    if ctd and is_running(ctd) and sock:
        clean = _forget_containers(sock)
    if ctd:
        try:
            stop_pid(ctd, term_timeout=term_timeout)
        except DevClusterError as e:
            problems.append(f"containerd: {e}")
    _kill_shims(sock)
    if sock:  # containerd leaves its ttrpc socket file behind
        for f in (Path(sock), Path(sock + ".ttrpc")):
            f.unlink(missing_ok=True)
    if root:
        problems += [f"cgroup {c} not removed" for c in cgroups.remove(root)]
    if info.get("bridge"):
        try:
            network.delete_bridge(info["bridge"])
        except DevClusterError as e:
            problems.append(str(e))
    if "slot" in info:
        if clean and not problems:
            (slot_dir(info["slot"]) / "clean").touch()
        if "slot" in pids:
            stop_pid(pids["slot"], term_timeout=term_timeout)  # last: releases the slot
    (_dir(state_dir) / "node.json").unlink(missing_ok=True)
    return problems


def status(state_dir: Path | str) -> dict:
    """What ``node.json`` records, with whether each process is running."""
    info = read_info(state_dir)
    if not info:
        return {}
    procs = {n: {"pid": r["pid"], "running": is_running(r)} for n, r in info.get("pids", {}).items()}
    return {**{k: v for k, v in info.items() if k != "pids"}, "processes": procs}
