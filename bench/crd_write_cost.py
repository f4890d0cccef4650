"""API server and etcd CPU per job object: what a job's own object costs the control plane, apart
from its children and pods.

On the operator-scale peer runs llmtrain's JobSet path cost the API server 10-20 ms more per job
than Kubeflow Trainer v2's, with about as many requests. This bench isolates the job object's
share. An LLMTrainingJob's life in the API server is the user's create and the operator's two status
writes (the attempt's child made: Pending; every Job ready: Running); a TrainJob's is the user's
create and its controller's status writes (`jobsStatus`, active then ready).

1. The two LLMTrainingJob status bodies are the real operator's (JobSet backend): it runs on a light
   dev cluster for one job, whose JobSet is handed its controller's Running status by hand.
2. Each kind is then created and written on ``--jobs`` fresh objects per round, in rounds whose
   order alternates (ABC..., ...CBA): the LLMTrainingJob under its CRD; the same objects under
   copies of the CRD (each under a group of its own) without its CEL rules
   (``x-kubernetes-validations``), without its defaults, and without a schema at all
   (``x-kubernetes-preserve-unknown-fields``); and, after ``make peer-tools``, a TrainJob under
   Trainer v2's CRD. Status writes are merge patches, as both controllers make them.
3. It prints API server + etcd CPU ms per object (create + two status writes) for each kind, and
   the LLMTrainingJob's ratio to each, as one JSON line.

    .venv/bin/python bench/crd_write_cost.py [--jobs 500] [--rounds 4] [--quick]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench"), str(REPO / "operator"), str(REPO / "devcluster")]

# The copies of the CRD: group → what is taken out of it (None: the whole schema)
COPIES = {
    "without CEL rules": ("nocel.bench.llmtrain.dev", "x-kubernetes-validations"),
    "without defaults": ("nodefaults.bench.llmtrain.dev", "default"),
    "without a schema": ("schemaless.bench.llmtrain.dev", None),
}
TRAINJOB_STATUS = (  # Trainer v2.3's controller: one replicated Job, active, then ready
    {"jobsStatus": [{"name": "node", "active": 1, "ready": 0, "succeeded": 0, "failed": 0, "suspended": 0}]},
    {"jobsStatus": [{"name": "node", "active": 1, "ready": 1, "succeeded": 0, "failed": 0, "suspended": 0}]},
)


def crd_copy(crd: dict, group: str, drop: str | None) -> dict:
    """The CRD's kind under ``group``, every schema key ``drop`` taken out (None: no schema, every
    field kept as written)."""
    c = copy.deepcopy(crd)
    c["metadata"] = {"name": f"{c['spec']['names']['plural']}.{group}"}
    c["spec"]["group"] = group
    for v in c["spec"]["versions"]:
        if drop is None:
            v["schema"] = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
            v.pop("additionalPrinterColumns", None)
        else:
            _drop(v["schema"], drop)
    return c


def _drop(node, key: str) -> None:
    if isinstance(node, dict):
        node.pop(key, None)
        for value in node.values():
            _drop(value, key)
    elif isinstance(node, list):
        for value in node:
            _drop(value, key)


def capture_statuses(cluster, custom, spec: dict, workdir: Path, wait_for) -> tuple[dict, dict]:
    """The operator's first two status writes of one JobSet-backed job, as it made them."""
    from chainbench import OperatorProcess, make_namespace
    from llmtrain.spec import API_VERSION, GROUP, KIND, PLURAL, VERSION

    ns = "capture"
    make_namespace(custom.api_client, ns)
    op = OperatorProcess(
        cluster.kubeconfig, ns, workdir / "operator.log", ["--progress-interval", "3600", "--backend", "jobset"]
    )
    op.start()
    try:
        body = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "capture"}, "spec": spec}
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)

        def status_in(phase: str):
            s = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "capture").get("status") or {}
            if s.get("phase") == "Failed":
                raise SystemExit(f"the captured job failed: {s.get('message')}")
            return s if s.get("phase") == phase else None

        pending = wait_for(lambda: status_in("Pending"), 120, "the operator's first status write")
        ready = {
            "replicatedJobsStatus": [
                {"name": "worker", "ready": 1, "succeeded": 0, "failed": 0, "active": 1, "suspended": 0}
            ]
        }
        custom.patch_namespaced_custom_object_status(
            "jobset.x-k8s.io", "v1alpha2", ns, "jobsets", pending["child"], {"status": ready}
        )
        running = wait_for(lambda: status_in("Running"), 120, "the operator's Running status write")
    finally:
        op.stop()
    return pending, running


def measure(custom, pids: dict, kind: dict, ns: str, n: int, threads: int) -> dict:
    """Create ``n`` objects of ``kind``, then write each one's two statuses: CPU ms per object of
    the processes in ``pids`` together, by step and in total."""
    from operator_scale import cpu_seconds

    group, version, plural = kind["gvp"]
    names = [f"o-{i:05d}" for i in range(n)]

    def create(name: str) -> None:
        body = {
            "apiVersion": f"{group}/{version}",
            "kind": kind["kind"],
            "metadata": {"name": name},
            "spec": kind["spec"],
        }
        custom.create_namespaced_custom_object(group, version, ns, plural, body)

    def write(status: dict):  # a merge patch: the client's default for a dict body
        return lambda name: custom.patch_namespaced_custom_object_status(
            group, version, ns, plural, name, {"status": status}
        )

    steps = {"create": create, "status 1": write(kind["statuses"][0]), "status 2": write(kind["statuses"][1])}
    out: dict = {}
    with ThreadPoolExecutor(threads) as pool:
        for step, fn in steps.items():
            before = sum(cpu_seconds(pids).values())
            list(pool.map(fn, names))
            out[step] = 1000 * (sum(cpu_seconds(pids).values()) - before) / n
    out["total"] = sum(out.values())
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=500, help="objects per kind per round")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--quick", action="store_true", help="smoke run: 20 objects, 2 rounds")
    p.add_argument("--json", help="also write the result here")
    a = p.parse_args(argv)
    if a.quick:
        a.jobs, a.rounds = 20, 2

    import yaml
    from kubernetes import client

    from chainbench import api_client, job_spec, make_namespace, wait_for
    from llmtrain.spec import GROUP, KIND, PLURAL, VERSION
    from llmtrain_devcluster.cluster import DevCluster
    from llmtrain_devcluster.tools import ToolNotFoundError
    from operator_scale import crd_path

    spec = job_spec(nodes=1)
    spec["cluster"]["backend"] = "jobset"
    crd = yaml.safe_load(crd_path(REPO).read_text())
    out: dict = {"jobs_per_round": a.jobs, "rounds": a.rounds, "threads": a.threads, "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="crd-write-cost-") as tmp:
        workdir = Path(tmp)
        cluster = DevCluster(workdir / "cluster").up()
        try:
            cluster.install_crds([crd, *(crd_copy(crd, g, drop) for g, drop in COPIES.values())])
            api = api_client(cluster.kubeconfig, pool=max(16, a.threads * 2))
            custom = client.CustomObjectsApi(api)
            pending, running = capture_statuses(cluster, custom, spec, workdir, wait_for)
            kinds = {
                "llmtrainingjob": {
                    "gvp": (GROUP, VERSION, PLURAL),
                    "kind": KIND,
                    "spec": spec,
                    "statuses": (pending, running),
                }
            }
            for label, (group, _) in COPIES.items():
                kinds[f"llmtrainingjob {label}"] = {**kinds["llmtrainingjob"], "gvp": (group, VERSION, PLURAL)}
            try:
                from llmtrain_devcluster.trainer_v2 import _TRAINER_CRDS, TRAINJOB, peer_tools_dir
                from trainer_peer import trainjob

                root = peer_tools_dir()
                cluster.install_crds([root / f for f in _TRAINER_CRDS])
                # the peer runs' TrainJob: a reference to their runtime (not installed: no webhook here)
                kinds["trainjob"] = {
                    "gvp": TRAINJOB,
                    "kind": "TrainJob",
                    "spec": trainjob("")["spec"],
                    "statuses": TRAINJOB_STATUS,
                }
            except ToolNotFoundError as err:
                out["trainjob"] = f"not measured: {err}"
            pids = {k: pid for k, pid in cluster.pids().items() if k in ("kube-apiserver", "etcd")}
            sizes = {}
            runs: dict[str, list[dict]] = {k: [] for k in kinds}
            order = list(kinds)
            for r in range(a.rounds):
                for name in order if r % 2 == 0 else order[::-1]:
                    ns = f"r{r}-{order.index(name)}"
                    make_namespace(api, ns)
                    runs[name].append(measure(custom, pids, kinds[name], ns, a.jobs, a.threads))
                    if name not in sizes:
                        g, v, pl = kinds[name]["gvp"]
                        obj = custom.get_namespaced_custom_object(g, v, ns, pl, "o-00000")
                        sizes[name] = {
                            part: len(json.dumps(o, separators=(",", ":")))
                            for part, o in (("object", obj), ("spec", obj["spec"]))
                        }
                print(
                    json.dumps({"round": r, **{k: round(v[-1]["total"], 2) for k, v in runs.items()}}),
                    file=sys.stderr,
                )
        finally:
            cluster.down()
    ms = {
        k: {
            "median": round(statistics.median(x["total"] for x in v), 2),
            "all": [round(x["total"], 2) for x in v],
        }
        for k, v in runs.items()
    }
    out["api_server_and_etcd_cpu_ms_per_object"] = ms
    out["by_step_median_ms"] = {
        k: {s: round(statistics.median(x[s] for x in v), 2) for s in ("create", "status 1", "status 2")}
        for k, v in runs.items()
    }
    out["object_bytes"] = sizes
    base = ms["llmtrainingjob"]["median"]
    out["ratios"] = {
        f"llmtrainingjob / {k}": round(base / v["median"], 2) for k, v in ms.items() if k != "llmtrainingjob"
    }
    print(json.dumps(out))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
