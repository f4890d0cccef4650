"""Re-adopt after a SIGKILL, several commits' operators interleaved on one light dev cluster.

``operator_scale.py --operator-tree`` compares two commits with one cluster per run, so every run
also pays (and varies with) the create phase and a new cluster. This bench starts one cluster
(kube-apiserver, etcd, controller-manager) and sets up each tree once, in a namespace of its own:
that tree's operator with its CRD creates --jobs jobs and their PyTorchJobs, and one worker pod per
job is created (labelled as its attempt's, as the training-operator would). Then --rounds rounds,
each one re-adoption per tree, in the given order in even rounds and reversed in odd ones (A B,
B A, A B, ...): install the tree's CRD, start its operator, time until it has re-adopted every job,
SIGKILL it. One tree's runs are spread over the whole session, so the cluster's drift (it grows
with every namespace, and every re-adoption posts an event per job) falls on every tree alike,
which back-to-back runs of one tree did not give. Printed per run: seconds to /healthz, seconds
from /healthz to every job re-adopted, the operator's CPU seconds (from /proc) and the API
requests per job; then the medians per tree and their ratios to the first tree's.

    git worktree add --detach /tmp/before <commit>
    .venv/bin/python bench/readopt_abba.py --jobs 600 --rounds 8 /tmp/before .
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent)]

import operator_scale as osc  # noqa: E402
from chainbench import OperatorProcess, make_namespace, request_counts, wait_for  # noqa: E402


def set_up(api, custom, cluster, tree: Path, ns: str, workdir: Path, jobs: int) -> OperatorProcess:
    """The tree's namespace with --jobs jobs, each with its PyTorchJob recorded and one attempt pod."""
    from llmtrain.spec import API_VERSION, GROUP, KIND, PLURAL, VERSION

    cluster.install_crds([osc.crd_path(tree)])
    make_namespace(api, ns)
    names = [f"job-{i:05d}" for i in range(jobs)]
    op = OperatorProcess(cluster.kubeconfig, ns, workdir / f"{ns}.log", [], tree)
    op.start()
    body = {"apiVersion": API_VERSION, "kind": KIND, "spec": osc.SPEC}
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda n: custom.create_namespaced_custom_object(
                    GROUP, VERSION, ns, PLURAL, {**body, "metadata": {"name": n}}
                ),
                names,
            )
        )

    def recorded() -> bool:
        items = custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
        return len(items) == jobs and all((j.get("status") or {}).get("child") for j in items)

    wait_for(recorded, 600, "every job's PyTorchJob recorded")
    osc.make_pods(api, ns, names, 1, 8)
    op.stop(signal.SIGKILL)
    return op


def readopt(api, cluster, op: OperatorProcess, label: str, round_: int, jobs: int) -> dict:
    """One SIGKILLed operator's successor started, timed until every job is re-adopted, killed."""
    cluster.install_crds([osc.crd_path(op.tree)])
    before = request_counts(api)
    started = op.start()
    healthy, cpu_healthy = time.monotonic(), op.usage()[1]
    wait_for(lambda: op.counter("adopted") + op.counter("unchanged") >= jobs, 600, "re-adoption", interval=0.5)
    done, cpu_done = time.monotonic(), op.usage()[1]
    after = request_counts(api)
    op.stop(signal.SIGKILL)
    made = {k: v - before.get(k, 0) for k, v in after.items()}
    return {
        "tree": label,
        "round": round_,
        "start_to_healthz_s": round(healthy - started, 2),
        "healthz_to_readopted_s": round(done - healthy, 2),
        "readopt_s": round(done - started, 2),
        "cpu_start_s": cpu_healthy,
        "cpu_readopt_s": round(cpu_done, 2),
        "requests_per_job": {k: round(n / jobs, 2) for k, n in made.items() if n >= jobs / 20},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trees", nargs="+", type=Path, help="checkouts of this repo (the first is the baseline)")
    p.add_argument("--jobs", type=int, default=600)
    p.add_argument("--rounds", type=int, default=8, help="re-adoptions per tree, interleaved (A B, B A, ...)")
    p.add_argument("--json", type=Path, help="also write every run and the summary here")
    a = p.parse_args(argv)
    from kubernetes import client, config

    from llmtrain_devcluster import DevCluster

    workdir = Path(tempfile.mkdtemp(prefix="readopt-abba-"))
    cluster = DevCluster(workdir / "cluster")
    cluster.up()
    runs: list[dict] = []
    try:
        cfg = client.Configuration()
        config.load_kube_config(str(cluster.kubeconfig), client_configuration=cfg)
        cfg.connection_pool_maxsize = 16
        api = client.ApiClient(cfg)
        custom = client.CustomObjectsApi(api)
        trees = list(dict.fromkeys(t.resolve() for t in a.trees))
        labels = [f"{k}: {osc.tree_commit(t)}" for k, t in enumerate(trees)]
        ops = [set_up(api, custom, cluster, t, f"readopt-{k}", workdir, a.jobs) for k, t in enumerate(trees)]
        for r in range(a.rounds):
            order = list(zip(labels, ops))
            for label, op in order if r % 2 == 0 else reversed(order):
                runs.append(readopt(api, cluster, op, label, r, a.jobs))
                print(json.dumps(runs[-1]), flush=True)
    finally:
        cluster.down()
        shutil.rmtree(workdir, ignore_errors=True)
    by_tree: dict[str, list[dict]] = {}
    for r in runs:
        by_tree.setdefault(r["tree"], []).append(r)
    first = next(iter(by_tree))
    summary = {}
    for tree, rs in by_tree.items():
        summary[tree] = {
            k: statistics.median(r[k] for r in rs) for k in ("readopt_s", "cpu_readopt_s", "healthz_to_readopted_s")
        }
    for tree, s in summary.items():
        ratio = {k: round(v / summary[first][k], 3) for k, v in s.items()}
        print(f"{tree[:60]:60}  medians {s}  / first tree {ratio}")
    if a.json:
        a.json.write_text(json.dumps({"jobs": a.jobs, "runs": runs, "medians": summary}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
