"""containerd's configuration for the real node (Debian's containerd 1.6/1.7, CRI v1, config
version 2).

Everything it writes is the node's own: ``root`` (images, snapshots, metadata) in the slot's
persistent directory, so an image imported once survives dev-cluster restarts as a real node's
``/var/lib/containerd`` survives reboots, and its sockets beside it (a unix socket's path must stay
under 104 bytes; the slot is this node's alone); ``state``, the runc root, the netns bind mounts
(``netns_mounts_under_state_dir``) and the CNI config in the cluster's state directory.
What it still hard-codes (``/run/containerd/s`` for shim sockets, libcni's ``/var/lib/cni``) lands
in the state directory too, through the private mount namespace (:mod:`.lifecycle`).

``restrict_oom_score_adj = true``: runc sets the kubelet's oom_score_adj for the sandbox (-998),
and lowering it needs CAP_SYS_RESOURCE, which root lacks on some machines (containers, CI
sandboxes): without it every sandbox fails with "can't get final child's PID from pipe: EOF". With
it containerd clamps the value to its own. ``sandbox_image`` is the pause image built by
``make tools`` (no registry is ever contacted: every image is imported).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["ContainerdPaths", "config_toml"]


@dataclass(frozen=True)
class ContainerdPaths:
    root: Path
    state: Path
    socket: Path
    runc_root: Path
    opt: Path
    cni_conf_dir: Path
    cni_bin_dir: Path
    runc: Path


def _q(p: Path | str) -> str:
    s = str(p)
    if '"' in s or "\\" in s:
        raise ValueError(f"path {s!r}: quotes and backslashes are not supported in the node's config")
    return f'"{s}"'


def config_toml(p: ContainerdPaths, *, sandbox_image: str) -> str:
    disabled = [
        "io.containerd.snapshotter.v1.aufs",
        "io.containerd.snapshotter.v1.btrfs",
        "io.containerd.snapshotter.v1.devmapper",
        "io.containerd.snapshotter.v1.zfs",
        "io.containerd.grpc.v1.cri.tracing",
        "io.containerd.tracing.processor.v1.otlp",
    ]
    cri = '[plugins."io.containerd.grpc.v1.cri"]'
    return f"""version = 2
root = {_q(p.root)}
state = {_q(p.state)}
disabled_plugins = [{", ".join(f'"{d}"' for d in disabled)}]

[grpc]
  address = {_q(p.socket)}
[ttrpc]
  address = {_q(str(p.socket) + ".ttrpc")}
[debug]
  address = ""
[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = {_q(p.opt)}

{cri}
  sandbox_image = "{sandbox_image}"
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_unprivileged_ports = false
  enable_unprivileged_icmp = false
  {cri[:-1]}.cni]
    bin_dir = {_q(p.cni_bin_dir)}
    conf_dir = {_q(p.cni_conf_dir)}
    max_conf_num = 1
  {cri[:-1]}.containerd]
    default_runtime_name = "runc"
    snapshotter = "overlayfs"
    {cri[:-1]}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      {cri[:-1]}.containerd.runtimes.runc.options]
        BinaryName = {_q(p.runc)}
        Root = {_q(p.runc_root)}
        SystemdCgroup = false
"""
