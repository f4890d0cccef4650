"""``python -m llmtrain_devcluster up|down|status [--state-dir .dev-cluster] [--chain [--real-node]]``."""

from __future__ import annotations

import argparse
import json
import sys

from . import kueue
from .chain import DEFAULT_NODES
from .cluster import DevCluster
from .process import DevClusterError
from .tools import ToolNotFoundError


def _nodes(text: str) -> dict[str, int]:
    from llmtrain.catalog import instance_types

    known = instance_types()
    out = {}
    for item in filter(None, text.split(",")):
        name, _, count = item.partition("=")
        if name not in known or not count.isdigit():
            raise argparse.ArgumentTypeError(
                f"{item!r}: expected INSTANCE_TYPE=COUNT with INSTANCE_TYPE one of {', '.join(known)}"
            )
        out[name] = int(count)
    return out


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m llmtrain_devcluster", description=__doc__)
    ap.add_argument("command", choices=("up", "down", "status"))
    ap.add_argument("--state-dir", default=".dev-cluster", help="where certs, data, logs, pids live")
    ap.add_argument(
        "--crd", action="append", default=[], metavar="FILE", help="extra CRD YAML to install on up (repeatable)"
    )
    ap.add_argument("--no-project-crd", action="store_true", help="don't install llmtrain.crd.crd_manifest()")
    ap.add_argument("--json", action="store_true", help="status as JSON")
    ap.add_argument(
        "--chain",
        action="store_true",
        help="also run kube-scheduler, kwok GPU nodes, the training-operator and the JobSet controller",
    )
    ap.add_argument(
        "--kueue",
        action="store_true",
        help="with --chain: also run the pinned Kueue (webhooks registered, a ResourceFlavor per "
        "instance type, a ClusterQueue with quota for the nodes; make kueue builds it)",
    )
    ap.add_argument(
        "--kueue-integrations",
        choices=("backends", "release-default"),
        default="backends",
        help="with --kueue: Kueue's integrations, llmtrain's two backends' kinds (PyTorchJob, JobSet; "
        "the default) or what a default install of the pinned Kueue enables (from v0.19 without PyTorchJob)",
    )
    ap.add_argument(
        "--nodes",
        type=_nodes,
        default=None,
        metavar="TYPE=N,...",
        help="kwok nodes for --chain, e.g. p5.48xlarge=2,p4de.24xlarge=1 "
        f"(default: {','.join(f'{k}={v}' for k, v in DEFAULT_NODES.items())})",
    )
    ap.add_argument(
        "--trainer-v2",
        action="store_true",
        help="with --chain: also run Kubeflow Trainer v2 (make peer-tools) on the chain's JobSet, its "
        "CRDs, loopback-served webhooks and the release's torch-distributed runtime",
    )
    ap.add_argument(
        "--real-node",
        action="store_true",
        help="with --chain: also run a real node on this machine (kubelet, containerd, a CNI bridge, "
        "CoreDNS; needs root), tainted llmtrain.dev/real-node so only pods that tolerate it land there",
    )
    return ap


def _print_status(st: dict) -> None:
    print(f"state dir:  {st['state_dir']}")
    print(f"server:     {st['server'] or '-'}")
    print(f"ready:      {st['ready']}")
    for name, c in st["components"].items():
        print(f"{name:24s} pid {c['pid']:<8d} {'running' if c['running'] else 'NOT running'}")
    node = st.get("real_node")
    if node:
        print(
            f"real node:  {node.get('name')} (slot {node.get('slot')}, bridge {node.get('bridge')}, "
            f"ip {node.get('ip')}, cgroup {node.get('cgroup_root')})"
        )
        for name, c in node.get("processes", {}).items():
            state = "running" if c["running"] else "NOT running"
            print(f"  {name:22s} pid {c['pid']:<8d} {state}")
    if st["ready"]:
        print(f"export KUBECONFIG={st['kubeconfig']}")


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.real_node and not args.chain:
        ap.error("--real-node needs --chain (light mode runs no kube-scheduler to bind its pods)")
    if args.trainer_v2 and not args.chain:
        ap.error("--trainer-v2 needs --chain (its pods need the scheduler and kwok nodes)")
    frameworks: tuple[str, ...] = kueue.CHAIN_FRAMEWORKS
    if args.kueue and args.kueue_integrations == "release-default":
        try:
            frameworks = kueue.release_default_frameworks()
        except ToolNotFoundError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    cluster = DevCluster(
        args.state_dir,
        chain=True if args.chain else None,
        nodes=args.nodes,
        kueue=True if args.kueue else None,
        kueue_frameworks=frameworks,
        real_node=True if args.real_node else None,
    )
    try:
        if args.command == "up":
            already = cluster.is_running()
            cluster.up(args.crd, install_project_crd=not args.no_project_crd)
            if args.trainer_v2 and not already:
                from .trainer_v2 import TrainerV2

                peer = TrainerV2(cluster).start()
                peer.install_runtime(peer.upstream_torch_runtime())
            pid_list = " ".join(f"{n}={p}" for n, p in cluster.pids().items())
            print(
                f"# dev cluster {'already running' if already else 'up'}: {cluster.server} ({pid_list})",
                file=sys.stderr,
            )
            print(
                f"# logs: {cluster.logs_dir}; stop with: python -m llmtrain_devcluster down "
                f"--state-dir {args.state_dir}",
                file=sys.stderr,
            )
            print(f"export KUBECONFIG={cluster.kubeconfig}")
        elif args.command == "down":
            from .trainer_v2 import stop_recorded

            stop_recorded(args.state_dir)  # the Trainer v2 peer first: it talks to the API server
            pids = cluster.pids()
            cluster.down()
            print(f"dev cluster stopped ({len(pids)} processes)" if pids else "dev cluster not running")
        else:
            st = cluster.status()
            if args.json:
                print(json.dumps(st, indent=2))
            else:
                _print_status(st)
            return 0 if st["ready"] else 3
    except (DevClusterError, ToolNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
