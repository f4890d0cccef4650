"""Re-adopt after a SIGKILL, two commits' operators alternated on one light dev cluster.

``operator_scale.py --operator-tree`` compares two commits with one cluster per run, so every run
also pays (and varies with) the create phase and a new cluster. This bench starts one cluster
(kube-apiserver, etcd, controller-manager) and, for each tree in the order given (e.g. ABBA: A B B A),
in a namespace of its own: starts that tree's operator with its tree's CRD, creates --jobs jobs
and waits until each has its PyTorchJob recorded, creates one worker pod per job (labelled as its
attempt's, as the training-operator would), then --reps times: SIGKILL the operator, start it
again and time until it has re-adopted every job. Printed per run: seconds to /healthz, seconds
from /healthz to every job re-adopted, the operator's CPU seconds for each part (from /proc), and
the API requests per job; then the medians per tree and their ratio to the first tree's.

    git worktree add --detach /tmp/before <commit>
    .venv/bin/python bench/readopt_abba.py --jobs 600 /tmp/before . . /tmp/before
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
from chainbench import OperatorProcess, wait_for  # noqa: E402


def tree_runs(api, custom, cluster, tree: Path, ns: str, workdir: Path, jobs: int, reps: int) -> list[dict]:
    from llmtrain.spec import API_VERSION, GROUP, KIND, PLURAL, VERSION

    cluster.install_crds([osc.crd_path(tree)])
    osc.make_namespace(api, ns)
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
        return len(items) == jobs and all((j.get("status") or {}).get("pytorchJob") for j in items)

    wait_for(recorded, 600, "every job's PyTorchJob recorded")
    osc.make_pods(api, ns, names, 1, 8)
    runs = []
    for rep in range(reps):
        op.stop(signal.SIGKILL)
        before = osc.request_counts(api)
        started = op.start()
        healthy, cpu_healthy = time.monotonic(), op.usage()[1]
        wait_for(lambda: op.counter("adopted") + op.counter("unchanged") >= jobs, 600, "re-adoption", interval=0.5)
        done, cpu_done = time.monotonic(), op.usage()[1]
        after = osc.request_counts(api)
        made = {k: v - before.get(k, 0) for k, v in after.items()}
        runs.append(
            {
                "tree": osc.tree_commit(tree),
                "rep": rep,
                "start_to_healthz_s": round(healthy - started, 2),
                "healthz_to_readopted_s": round(done - healthy, 2),
                "readopt_s": round(done - started, 2),
                "cpu_start_s": cpu_healthy,
                "cpu_readopt_s": round(cpu_done, 2),
                "requests_per_job": {k: round(n / jobs, 2) for k, n in made.items() if n >= jobs / 20},
            }
        )
        print(json.dumps(runs[-1]), flush=True)
    op.stop()
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trees", nargs="+", type=Path, help="checkouts of this repo, in the order to run them")
    p.add_argument("--jobs", type=int, default=600)
    p.add_argument("--reps", type=int, default=2, help="SIGKILL and re-adopt this many times per tree run")
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
        for k, tree in enumerate(a.trees):
            runs += tree_runs(api, custom, cluster, tree.resolve(), f"readopt-{k}", workdir, a.jobs, a.reps)
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
