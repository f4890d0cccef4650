"""How does the operator scale? Create→PyTorchJob latency and throughput against creating the rendered
PyTorchJobs directly, in the same run, on the same API server.

Phases (each in its own namespace):
  direct    `--threads` client threads create `--jobs` rendered PyTorchJobs themselves: the
            baseline rate (what the API server + etcd sustain for these objects, no operator);
  operator  the same threads create `--jobs` LLMTrainingJobs; a watch records when each job's
            PyTorchJob appears. Per job create→PyTorchJob latency (p50/p95/p99), jobs/s and its
            ratio to the direct rate, API requests per job (the API server's own request counter,
            less the bench's creates), the operator's peak RSS and CPU seconds; in both phases
            the CPU per job of every process (etcd, kube-apiserver, controller-manager, the
            operator, this bench), from /proc: what the shared cores spend per job;
  re-adopt  SIGKILL the operator, start it again: time until it has resumed every job (its
            reconcile counter), and that nothing was created twice (`--pods N`: with N worker
            pods per job present, as for running jobs);
  clean-up  delete every job: time until the garbage collector removed every PyTorchJob;
  counts    lost (no PyTorchJob, or status not recorded) and duplicated (a PyTorchJob created twice
            or a second attempt) jobs.
With `--running` (a cluster with scheduler, nodes and training-operator, given by `--kubeconfig`) it
also waits for each job to be Running and reports create→Running.
With `--nodes N` it starts its own chain dev cluster with N kwok-simulated p5.48xlarge nodes, the real
kube-scheduler and training-operator, and creates one-node p5 jobs (at most N run at once): per phase
(direct PyTorchJobs, then LLMTrainingJobs) create→PyTorchJob, how many reached Running and their
create→Running (p50/p95/p99), and clean-up (delete all → no PyTorchJob, no pod left); see run_chain.

    .venv/bin/python bench/operator_scale.py                      # 1,000 jobs, 8 threads, own dev cluster
    .venv/bin/python bench/operator_scale.py --quick              # 20 jobs, 4 threads (the test suite runs this)
    .venv/bin/python bench/operator_scale.py --nodes 200 --jobs 200 --peer --repeat 2
                                       # four paths on one cluster: llmtrain on JobSet, on PyTorchJob, on a
                                       # batch Job, Kubeflow Trainer v2 (make peer-tools; bench/trainer_peer.py)
    .venv/bin/python bench/operator_scale.py --peer --quick       # its smoke run: 3 jobs, 4 nodes, one phase each
    .venv/bin/python bench/operator_scale.py --kubeconfig K --running --jobs 1000
    .venv/bin/python bench/operator_scale.py --nodes 500 --jobs 1000 --training-operator-threads 4 \
        --training-operator-qps 100                               # on simulated p5 nodes
Prints a table and, last, one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from chainbench import (
    PTJ,
    REPO,
    OperatorProcess,
    clean_up,
    delete_all,
    exit_on_sigterm,
    llmtrain_operator_args,
    log,
    make_namespace,
    percentile,
    print_operator_log_tail,
    request_counts,
    wait_for,
)


def crd_path(tree: Path) -> Path:
    """The LLMTrainingJob CRD a checkout's chart installs: each commit's operator runs on its own."""
    return tree / "charts" / "llmtrain-operator" / "crds" / "llmtrain.dev_llmtrainingjobs.yaml"


SPEC = {
    "model": {"preset": "tiny"},
    "data": {"seqLen": 64},
    "cluster": {"instanceType": "cpu", "nodes": 1, "processesPerNode": 2, "image": "llmtrain-trainer:dev"},
    "fsdp": {"mixedPrecision": "fp32"},
    "training": {"maxSteps": 20, "globalBatchTokens": 64 * 2 * 2, "microBatchSize": 2, "warmupSteps": 2},
    "rendezvous": {"backend": "c10d"},
}


class PTJWatch:
    """First time each PyTorchJob was seen, and how often one was ADDED (a duplicate create)."""

    def __init__(self, api, namespace: str):
        from kubernetes import client, watch

        self.custom, self.namespace = client.CustomObjectsApi(api), namespace
        self.first: dict[str, float] = {}
        self.added: dict[str, int] = {}
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        version = None
        while not self._stopped:
            try:  # a watch can end early (server timeout, a dropped connection): resume it
                for ev in self._watch.stream(
                    self.custom.list_namespaced_custom_object,
                    *PTJ[:2],
                    self.namespace,
                    PTJ[2],
                    timeout_seconds=300,
                    resource_version=version,
                ):
                    meta = ev["object"]["metadata"]
                    version = meta.get("resourceVersion", version)
                    if ev["type"] == "ADDED":
                        self.first.setdefault(meta["name"], time.monotonic())
                        self.added[meta["name"]] = self.added.get(meta["name"], 0) + 1
            except Exception as err:  # noqa: BLE001
                if self._stopped:
                    return
                print(f"watch restarted: {err!r}", file=sys.stderr)
                version = None  # 410 Gone and friends: list again (re-lists count as ADDED once more)
                self.relisted = True

    _stopped = False
    relisted = False

    def stop(self):
        self._stopped = True
        self._watch.stop()


def make_pods(api, namespace: str, names: list[str], per_job: int, threads: int) -> None:
    """`per_job` pods per job labelled as attempt 1's workers (what the operator's pod watch
    selects), as the training-operator creates them; nothing schedules them here."""
    from kubernetes import client

    from llmtrain.backends.pytorchjob import REPLICA_INDEX_LABEL
    from llmtrain.render import ATTEMPT_LABEL, JOB_LABEL

    core = client.CoreV1Api(api)

    def pod(job: str, i: int) -> dict:
        return {
            "metadata": {
                "name": f"{job}-a1-worker-{i}",
                "labels": {JOB_LABEL: job, ATTEMPT_LABEL: "1", REPLICA_INDEX_LABEL: str(i)},
            },
            "spec": {"containers": [{"name": "pytorch", "image": "llmtrain-trainer:dev"}]},
        }

    with ThreadPoolExecutor(threads) as pool:
        list(
            pool.map(
                lambda p: core.create_namespaced_pod(namespace, p), [pod(n, i) for n in names for i in range(per_job)]
            )
        )


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds (user + system) each process has used so far, from /proc."""
    import os

    out = {}
    for name, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[name] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def cpu_ms_per_job(before: dict[str, float], after: dict[str, float], jobs: int) -> dict[str, float]:
    return {k: round(1000 * (after[k] - before[k]) / jobs, 2) for k in after if k in before}


def run(a: argparse.Namespace, kubeconfig: Path, api, workdir: Path, pids: dict[str, int] | None = None) -> dict:
    """`pids`: the cluster's processes (etcd, kube-apiserver...) whose CPU per job each phase reports."""
    from kubernetes import client

    from llmtrain.backends.pytorchjob import render_pytorchjob
    from llmtrain.spec import API_VERSION, GROUP, KIND, PLURAL, VERSION
    from llmtrain.validation import parse_spec

    custom = client.CustomObjectsApi(api)
    tag = uuid.uuid4().hex[:6]
    ns_direct, ns_op = f"bench-direct-{tag}", f"bench-op-{tag}"
    make_namespace(api, ns_direct)
    make_namespace(api, ns_op)
    names = [f"job-{i:05d}" for i in range(a.jobs)]
    spec = parse_spec(SPEC)
    out: dict = {"jobs": a.jobs, "threads": a.threads}

    # --- direct baseline ---
    rendered = [render_pytorchjob(spec, n, ns_direct, 1, None, "etcd.bench.svc:2379") for n in names]
    import os

    pids = {**(pids or {}), "bench": os.getpid()}  # the bench: its 8 client threads and its watch
    before, cpu_before = request_counts(api), cpu_seconds(pids)
    started = time.monotonic()
    with ThreadPoolExecutor(a.threads) as pool:
        list(pool.map(lambda o: custom.create_namespaced_custom_object(*PTJ[:2], ns_direct, PTJ[2], o), rendered))
    direct_s = time.monotonic() - started
    out["direct_cpu_ms_per_job"] = cpu_ms_per_job(cpu_before, cpu_seconds(pids), a.jobs)
    out["direct_jobs_per_s"] = a.jobs / direct_s
    # What the API server served per second (all clients): the ceiling both phases share.
    out["direct_api_requests_per_s"] = (sum(request_counts(api).values()) - sum(before.values())) / direct_s
    delete_all(custom, PTJ[:2], ns_direct, PTJ[2])
    log(out)

    # --- operator ---
    tree = a.operator_tree.resolve() if a.operator_tree else REPO
    out["operator_tree"] = tree_commit(tree)
    op = OperatorProcess(
        kubeconfig, ns_op, workdir / "operator.log", llmtrain_operator_args(a.workers, a.operator_arg), tree
    )
    op.start()
    pids["operator"] = op.proc.pid
    watch = PTJWatch(api, ns_op)
    created_at: dict[str, float] = {}

    def create(name: str):
        created_at[name] = time.monotonic()
        custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            ns_op,
            PLURAL,
            {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": SPEC},
        )

    before, cpu_before = request_counts(api), cpu_seconds(pids)
    started = time.monotonic()
    with ThreadPoolExecutor(a.threads) as pool:
        list(pool.map(create, names))
    wait_for(lambda: all(f"{n}-a1" in watch.first for n in names), a.timeout, "every PyTorchJob")
    op_s = max(watch.first[f"{n}-a1"] for n in names) - started

    def recorded() -> bool:  # status written too: the operator is done with every job
        items = custom.list_namespaced_custom_object(GROUP, VERSION, ns_op, PLURAL)["items"]
        return len(items) == a.jobs and all((j.get("status") or {}).get("child") for j in items)

    wait_for(recorded, a.timeout, "every job's status")
    # CPU per job of each process in this phase (the bench's status polls, a few LISTs, included)
    out["operator_phase_cpu_ms_per_job"] = cpu_ms_per_job(cpu_before, cpu_seconds(pids), a.jobs)
    after = request_counts(api)
    by_kind = {k: (v - before.get(k, 0)) / a.jobs for k, v in after.items() if v - before.get(k, 0) >= a.jobs / 10}
    requests = sum(after.values()) - sum(before.values())
    latencies = [watch.first[f"{n}-a1"] - created_at[n] for n in names]
    out.update(
        {
            "create_to_ptj_p50_s": percentile(latencies, 50),
            "create_to_ptj_p95_s": percentile(latencies, 95),
            "create_to_ptj_p99_s": percentile(latencies, 99),
            "operator_jobs_per_s": a.jobs / op_s,
            # less the bench's own creates and its status polls (one LIST each, counted approximately as one)
            "api_requests_per_job": (requests - a.jobs) / a.jobs,
            "api_requests_per_job_by_kind": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
            "operator_api_requests_per_s": requests / (time.monotonic() - started),
        }
    )
    out["throughput_ratio"] = out["operator_jobs_per_s"] / out["direct_jobs_per_s"]
    log(out)

    if a.running:

        def running() -> bool:
            items = custom.list_namespaced_custom_object(GROUP, VERSION, ns_op, PLURAL)["items"]
            now = time.monotonic()
            for j in items:
                if (j.get("status") or {}).get("phase") == "Running":
                    running_at.setdefault(j["metadata"]["name"], now)
            return len(running_at) == a.jobs

        running_at: dict[str, float] = {}
        wait_for(running, a.timeout, "every job Running")
        lat = [running_at[n] - created_at[n] for n in names]
        out.update(
            {
                "create_to_running_p50_s": percentile(lat, 50),
                "create_to_running_p95_s": percentile(lat, 95),
                "create_to_running_p99_s": percentile(lat, 99),
            }
        )

    rss, cpu = op.usage()
    out["operator_peak_rss_mib"], out["operator_cpu_s_create"] = rss, cpu

    # --- re-adopt after SIGKILL (with --pods: each job's worker pods exist, as for running jobs) ---
    if a.pods:
        make_pods(api, ns_op, names, a.pods, a.threads)
        out["pods"] = a.jobs * a.pods
    op.stop(signal.SIGKILL)
    restarted = op.start()
    wait_for(lambda: op.counter("adopted") + op.counter("unchanged") >= a.jobs, a.timeout, "re-adoption")
    out["readopt_s"] = time.monotonic() - restarted
    rss, cpu = op.usage()
    out["operator_peak_rss_mib"] = max(out["operator_peak_rss_mib"], rss)
    out["operator_cpu_s_readopt"] = cpu
    log(out)

    # --- lost / duplicated ---
    ptjs = custom.list_namespaced_custom_object(*PTJ[:2], ns_op, PTJ[2])["items"]
    per_job: dict[str, list[str]] = {}
    for p in ptjs:
        per_job.setdefault(p["metadata"]["labels"]["llmtrain.dev/job"], []).append(p["metadata"]["name"])
    out["lost"] = sum(1 for n in names if per_job.get(n) != [f"{n}-a1"] and not per_job.get(n))
    out["duplicated"] = sum(1 for n in names if len(per_job.get(n, [])) > 1)
    if not watch.relisted:  # a re-list shows every object as ADDED again: only count without one
        out["duplicated"] += sum(1 for c in watch.added.values() if c > 1)

    # --- clean-up ---
    started = time.monotonic()
    delete_all(custom, (GROUP, VERSION), ns_op, PLURAL)
    wait_for(
        lambda: not custom.list_namespaced_custom_object(*PTJ[:2], ns_op, PTJ[2])["items"],
        a.timeout,
        "garbage collection of every PyTorchJob",
    )
    out["cleanup_s"] = time.monotonic() - started
    watch.stop()
    op.stop()
    for ns in (ns_direct, ns_op):
        client.CoreV1Api(api).delete_namespace(ns)
    return out


# --- on the real chain: simulated p5 nodes, kube-scheduler, training-operator (--nodes N) ----------


def _reached_running(
    rec, names: list[str], created_at: dict[str, float], settle_s: float, timeout: float, capacity: int
) -> dict[str, float]:
    """Wait until min(jobs, capacity) jobs have their pods Running, or no job reached Running for
    ``settle_s`` (the rest cannot fit); {job: create→Running s} for those that did."""
    deadline = time.monotonic() + timeout
    last_count, last_change = -1, time.monotonic()
    while True:
        done = {n: rec.get(n, 1, "pods_running") for n in names}
        done = {n: t - created_at[n] for n, t in done.items() if t is not None}
        if len(done) != last_count:
            last_count, last_change = len(done), time.monotonic()
        if (
            len(done) >= min(len(names), capacity)
            or time.monotonic() - last_change > settle_s
            or time.monotonic() > deadline
        ):
            return done
        time.sleep(0.5)


def chain_phases(a: argparse.Namespace) -> list[tuple[str, Path | None]]:
    """(label, operator tree) per phase: the direct baseline (no operator), then this checkout's
    operator; with ``--baseline-tree`` that tree's and this one's alternate ``--repeat`` times,
    ABBA-ordered (baseline, current, current, baseline, ...) so a drift in the host's speed during
    the run weighs on both alike."""
    phases: list[tuple[str, Path | None]] = [("direct", None)]
    if not a.baseline_tree:
        return [*phases, ("operator", REPO)]
    pair = [("baseline", a.baseline_tree.resolve()), ("current", REPO)]
    for r in range(a.repeat):
        phases += pair if r % 2 == 0 else pair[::-1]
    return phases


def tree_commit(tree: Path) -> str:
    """The tree's commit and subject, or its path when it is not a git checkout (an export); a
    checkout with uncommitted changes to operator/ says so (it is not that commit's operator)."""
    import subprocess

    got = subprocess.run(["git", "-C", str(tree), "log", "-1", "--format=%h %s"], capture_output=True, text=True)
    if got.returncode != 0 or not got.stdout.strip():
        return str(tree)
    dirty = subprocess.run(
        ["git", "-C", str(tree), "status", "--porcelain", "--", "operator"], capture_output=True, text=True
    ).stdout.strip()
    return ("+uncommitted " if dirty else "") + got.stdout.strip()


def run_chain(a: argparse.Namespace, workdir: Path) -> dict:
    """``--nodes N``: the same creates on a chain cluster with N simulated p5.48xlarge nodes, each job
    one node (so at most N run at once). Phases (chain_phases): direct (the rendered PyTorchJobs
    created by the bench threads) and operator (LLMTrainingJobs), each: create→PyTorchJob,
    create→Running for the jobs that reached Running (the real scheduler binds their pods to kwok
    nodes, kwok runs them), how many did, the operator's CPU per job from its first create to the
    last job Running, with ``--readopt`` the time to resume every job after a SIGKILL, and clean-up
    (delete all → no PyTorchJob, no pod). Each operator phase installs its own tree's CRD first."""
    from concurrent.futures import ThreadPoolExecutor

    from kubernetes import client

    from chainbench import ChainRun, Recorder, api_client, job_spec, stats, training_operator_args
    from llmtrain.backends.pytorchjob import render_pytorchjob
    from llmtrain.spec import API_VERSION, GROUP, KIND, PLURAL, VERSION
    from llmtrain.validation import parse_spec

    to_args = training_operator_args(a.training_operator_threads, a.training_operator_qps)
    out: dict = {"jobs": a.jobs, "threads": a.threads, "p5_nodes": a.nodes, "training_operator_args": to_args}
    phases = chain_phases(a)
    if a.baseline_tree:
        out["trees"] = {"baseline": tree_commit(a.baseline_tree), "current": tree_commit(REPO)}
        out["phases"] = []
    started = time.monotonic()
    with ChainRun(workdir / "cluster", a.nodes, to_args, workdir / "operator.log") as run:
        out["cluster_start_s"] = time.monotonic() - started
        cluster = run.cluster
        api = api_client(cluster.kubeconfig, pool=max(32, a.threads * 2))
        custom = client.CustomObjectsApi(api)
        raw = job_spec(nodes=1)
        spec = parse_spec(raw)
        names = [f"job-{i:05d}" for i in range(a.jobs)]
        tag = uuid.uuid4().hex[:6]
        for index, (phase, tree) in enumerate(phases):
            ns = f"bench-{phase}-{index}-{tag}"
            make_namespace(api, ns)
            rec = Recorder(api, ns)
            op = None
            if tree is not None:
                cluster.install_crds([crd_path(tree)])
                op = run.start_operator(ns, ["--progress-interval", "3600"], tree)
                cpu_before = op.usage()[1]
                objs = {
                    n: {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": n}, "spec": raw} for n in names
                }
                gvp = (GROUP, VERSION, PLURAL)
            else:
                objs = {n: render_pytorchjob(spec, n, ns, 1, None, "etcd.bench.svc:2379") for n in names}
                gvp = PTJ
            created_at: dict[str, float] = {}

            # Called (pool.map below) within this iteration only, so the loop variables are current.
            def create(name: str):
                created_at[name] = time.monotonic()  # noqa: B023
                custom.create_namespaced_custom_object(gvp[0], gvp[1], ns, gvp[2], objs[name])  # noqa: B023

            t0 = time.monotonic()
            with ThreadPoolExecutor(a.threads) as pool:
                list(pool.map(create, names))
            wait_for(
                lambda: all(rec.get(n, 1, "ptj_created") for n in names),  # noqa: B023 — waited on here
                a.timeout,
                f"{phase}: every PyTorchJob",
            )
            ptj_lat = [rec.get(n, 1, "ptj_created") - created_at[n] for n in names]
            res = {
                "jobs_per_s": a.jobs / (max(rec.get(n, 1, "ptj_created") for n in names) - t0),
                "create_to_ptj_s": stats(ptj_lat),
            }
            running = _reached_running(rec, names, created_at, a.settle, a.timeout, a.nodes)
            res["reached_running"] = len(running)
            res["create_to_running_s"] = stats(list(running.values()))
            if op is not None:
                res["operator_peak_rss_mib"], cpu = op.usage()
                res["operator_cpu_s"] = cpu - cpu_before
                res["operator_cpu_ms_per_job"] = 1000 * (cpu - cpu_before) / a.jobs
                if a.readopt:
                    op.stop(signal.SIGKILL)
                    restarted = op.start()
                    wait_for(
                        lambda: op.counter("adopted") + op.counter("unchanged") >= a.jobs,  # noqa: B023
                        a.timeout,
                        f"{phase}: re-adoption",
                    )
                    res["readopt_s"] = time.monotonic() - restarted
            log({phase: res})  # before the clean-up, so a failure there loses nothing measured
            res["cleanup_s"] = clean_up(api, ns, gvp, a.timeout)
            rec.stop()
            if a.baseline_tree and tree is not None:
                out["phases"].append({"tree": phase, **res})
            else:
                out[phase] = res
            log(out)
        if a.baseline_tree:
            out["comparison"] = compare_trees(out["phases"])
            out["operator"] = next(p for p in reversed(out["phases"]) if p["tree"] == "current")
        out["throughput_ratio"] = out["operator"]["jobs_per_s"] / out["direct"]["jobs_per_s"]
        out["running_p50_ratio"] = (
            out["operator"]["create_to_running_s"]["p50"] / out["direct"]["create_to_running_s"]["p50"]
        )
    return out


COMPARED = {  # figure: how to read it off a phase
    "create_to_ptj_p99_s": lambda p: p["create_to_ptj_s"]["p99"],
    "jobs_per_s": lambda p: p["jobs_per_s"],
    "operator_cpu_ms_per_job": lambda p: p["operator_cpu_ms_per_job"],
    "create_to_running_p50_s": lambda p: p["create_to_running_s"]["p50"],
    "readopt_s": lambda p: p.get("readopt_s", float("nan")),
}


def compare_trees(phases: list[dict]) -> dict:
    """Per figure: each tree's values in run order, their medians, and current / baseline."""
    import statistics

    out: dict = {}
    for figure, read in COMPARED.items():
        values = {t: [read(p) for p in phases if p["tree"] == t] for t in ("baseline", "current")}
        medians = {t: statistics.median(v) for t, v in values.items()}
        out[figure] = {**values, "median": medians, "current_over_baseline": medians["current"] / medians["baseline"]}
    return out


def print_chain(out: dict) -> None:
    print(
        f"operator_scale on the chain: {out['jobs']} one-node p5 jobs, {out['p5_nodes']} simulated "
        f"p5.48xlarge nodes, {out['threads']} client threads; training-operator "
        f"{' '.join(out['training_operator_args']) or 'defaults'}"
    )
    rows = [("direct", out["direct"])]
    rows += [(p["tree"], p) for p in out["phases"]] if "phases" in out else [("operator", out["operator"])]
    for phase, r in rows:
        p, run = r["create_to_ptj_s"], r["create_to_running_s"]
        extra = f"; CPU {r['operator_cpu_ms_per_job']:.1f} ms/job" if "operator_cpu_ms_per_job" in r else ""
        extra += f"; re-adopt {r['readopt_s']:.1f} s" if "readopt_s" in r else ""
        print(
            f"  {phase:<9} create→PyTorchJob p50/p95/p99 {p['p50']:.2f}/{p['p95']:.2f}/{p['p99']:.2f} s, "
            f"{r['jobs_per_s']:.1f} jobs/s; Running: {r['reached_running']} of {out['jobs']}, "
            f"create→Running p50/p95/p99 {run['p50']:.2f}/{run['p95']:.2f}/{run['p99']:.2f} s; "
            f"clean-up {r['cleanup_s']:.1f} s{extra}"
        )
    for figure, c in out.get("comparison", {}).items():
        print(
            f"  {figure:<24} baseline {c['median']['baseline']:.2f}, current {c['median']['current']:.2f} "
            f"(medians): current/baseline {c['current_over_baseline']:.2f}×"
        )
    print(
        f"  operator vs direct: {out['throughput_ratio']:.2f}× jobs/s, create→Running p50 "
        f"{out['running_p50_ratio']:.2f}×; operator peak RSS {out['operator']['operator_peak_rss_mib']:.0f} MiB"
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--threads", type=int, default=8, help="client threads creating objects")
    p.add_argument("--workers", type=int, default=None, help="operator --workers (default: its own)")
    p.add_argument(
        "--operator-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="a flag for the llmtrain operator, verbatim (repeatable; e.g. --operator-arg=--max-children-untaken=64)",
    )
    p.add_argument("--quick", action="store_true", help="20 jobs, 4 threads")
    p.add_argument("--kubeconfig", type=Path, help="an existing cluster (default: start a light dev cluster)")
    p.add_argument("--running", action="store_true", help="also wait for Running (needs a full chain)")
    p.add_argument(
        "--pods",
        type=int,
        default=0,
        help="before the re-adopt, create this many worker pods per job (labelled as its attempt's, as "
        "the training-operator would; they stay Pending on the light cluster): re-adopting with "
        "the pods of running jobs to watch",
    )
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="run on a chain dev cluster with this many simulated p5.48xlarge nodes (one-node p5 "
        "jobs; direct vs operator, create→Running, clean-up)",
    )
    p.add_argument(
        "--settle",
        type=float,
        default=30.0,
        help="--nodes: stop waiting for more jobs to reach Running after this long without one",
    )
    p.add_argument(
        "--training-operator-threads",
        type=int,
        default=None,
        help="--nodes: training-operator --controller-threads (default: Kubeflow's, 1)",
    )
    p.add_argument(
        "--training-operator-qps",
        type=int,
        default=None,
        help="--nodes: training-operator --kube-api-qps (default: Kubeflow's, 20)",
    )
    p.add_argument(
        "--peer",
        action="store_true",
        help="--nodes: phases of llmtrain (on each backend) and Kubeflow Trainer v2 (TrainJob → JobSet) on the "
        "same cluster, their order alternated (needs `make peer-tools`); see bench/trainer_peer.py",
    )
    p.add_argument(
        "--paths",
        default="llmtrain-jobset,llmtrain-pytorchjob,llmtrain-job,trainer",
        help="--peer: the paths measured, comma-separated: llmtrain-jobset (llmtrain, JobSet backend), "
        "llmtrain-pytorchjob (llmtrain, PyTorchJob backend), llmtrain-job (llmtrain, job backend), trainer "
        "(Kubeflow Trainer v2); default all four",
    )
    p.add_argument("--repeat", type=int, default=2, help="--peer / --baseline-tree: phases of each kind")
    p.add_argument(
        "--baseline-tree",
        type=Path,
        default=None,
        help="--nodes: another checkout of this repo (e.g. `git worktree add /tmp/old COMMIT`) whose operator "
        "alternates with this one's on the same cluster, each with its own CRD (ABBA order, --repeat times)",
    )
    p.add_argument(
        "--operator-tree",
        type=Path,
        default=None,
        help="light cluster: run another checkout's operator (and install its CRD) instead of this one's; "
        "alternate runs with and without it to compare two commits",
    )
    p.add_argument(
        "--readopt",
        action="store_true",
        help="--nodes: after the jobs run, SIGKILL the operator and time until it has resumed every job",
    )
    p.add_argument(
        "--idle-sample",
        type=float,
        default=10.0,
        help="--peer: seconds of each process's idle CPU sampled before each phase",
    )
    p.add_argument(
        "--controller-manager-qps",
        type=int,
        default=None,
        help="--peer: kube-controller-manager's --kube-api-qps, each controller's client (burst 1.5x; "
        "default Kubernetes', 20): the Job controller's pace, shared by every path",
    )
    p.add_argument(
        "--control-plane-nice",
        type=int,
        default=0,
        help="--peer: renice etcd, kube-apiserver, kube-controller-manager and kube-scheduler (every "
        "thread) to this (e.g. -5), as if the control plane had its own machines as on EKS; 0: as started",
    )
    p.add_argument(
        "--quiet",
        type=float,
        default=5.0,
        help="--peer: each phase's CPU window ends once the API server served no write but the nodes' "
        "heartbeats for this long after the last job's pods ran",
    )
    p.add_argument(
        "--direct-floor",
        action="store_true",
        help="--peer: first time the bench creating the rendered PyTorchJobs itself (a floor)",
    )
    a = p.parse_args(argv)
    if a.quick and a.peer:  # a smoke run: one phase of each kind, 3 jobs on 4 nodes (~1 min)
        a.nodes, a.jobs, a.threads, a.repeat, a.idle_sample = 4, 3, 2, 1, 2.0
        a.settle, a.timeout = min(a.settle, 20.0), min(a.timeout, 180.0)
    elif a.quick:
        a.jobs, a.threads = 20, 4
    sys.path[:0] = [str(REPO / "operator"), str(REPO / "devcluster")]
    if a.peer:
        if not a.nodes:
            p.error("--peer needs --nodes N (a chain cluster with N simulated p5 nodes)")
        from trainer_peer import parse_paths, print_peer, run_peer

        try:
            parse_paths(a.paths)
        except ValueError as err:
            p.error(str(err))

        with tempfile.TemporaryDirectory(prefix="operator-scale-peer-") as tmp:
            out = run_peer(a, Path(tmp))
        print_peer(out)
        print(json.dumps(out, sort_keys=True))
        return 0
    if a.baseline_tree and not a.nodes:
        p.error("--baseline-tree needs --nodes N")
    if a.operator_tree and (a.nodes or a.kubeconfig):
        p.error("--operator-tree is for the light cluster (with --nodes: --baseline-tree)")
    if a.nodes:
        with tempfile.TemporaryDirectory(prefix="operator-scale-chain-") as tmp:
            out = run_chain(a, Path(tmp))
        print_chain(out)
        print(json.dumps(out, sort_keys=True))
        return 0
    from kubernetes import client, config

    with tempfile.TemporaryDirectory(prefix="operator-scale-") as tmp:
        workdir = Path(tmp)
        cluster = None
        if a.kubeconfig is None:
            from llmtrain_devcluster import DevCluster

            cluster = DevCluster(workdir / "cluster")
            cluster.up(install_project_crd=a.operator_tree is None)
            if a.operator_tree is not None:  # that tree's own CRD, as its users install it
                cluster.install_crds([crd_path(a.operator_tree)])
            kubeconfig = cluster.kubeconfig
        else:
            kubeconfig = a.kubeconfig
        try:
            cfg = client.Configuration()
            config.load_kube_config(str(kubeconfig), client_configuration=cfg)
            cfg.connection_pool_maxsize = max(16, a.threads * 2)
            api = client.ApiClient(cfg)
            try:
                out = run(
                    a,
                    kubeconfig,
                    api,
                    workdir,
                    {k: p.pid for k, p in cluster._procs.items()} if cluster is not None else None,
                )
            except BaseException:
                print_operator_log_tail(workdir / "operator.log")
                raise
        finally:
            if cluster is not None:
                cluster.down()
    rows = [
        (
            "create→PyTorchJob p50 / p95 / p99 (s)",
            f"{out['create_to_ptj_p50_s']:.2f} / {out['create_to_ptj_p95_s']:.2f} / {out['create_to_ptj_p99_s']:.2f}",
        ),
        (
            "jobs/s: operator vs direct (ratio)",
            f"{out['operator_jobs_per_s']:.1f} vs {out['direct_jobs_per_s']:.1f} ({out['throughput_ratio']:.2f}×)",
        ),
        ("API requests per job", f"{out['api_requests_per_job']:.1f}"),
        (
            "API server requests/s: operator phase vs direct",
            f"{out['operator_api_requests_per_s']:.0f} vs {out['direct_api_requests_per_s']:.0f}",
        ),
        (
            "re-adopt after SIGKILL (s)" + (f", with {out['pods']} pods" if out.get("pods") else ""),
            f"{out['readopt_s']:.1f}",
        ),
        ("operator peak RSS (MiB)", f"{out['operator_peak_rss_mib']:.0f}"),
        (
            "operator CPU (s): create phase / re-adopt",
            f"{out['operator_cpu_s_create']:.1f} / {out['operator_cpu_s_readopt']:.1f}",
        ),
        ("clean-up (s)", f"{out['cleanup_s']:.1f}"),
        ("lost / duplicated", f"{out['lost']} / {out['duplicated']}"),
    ]
    if "create_to_running_p99_s" in out:
        rows.insert(
            1,
            (
                "create→Running p50 / p95 / p99 (s)",
                f"{out['create_to_running_p50_s']:.2f} / "
                f"{out['create_to_running_p95_s']:.2f} / {out['create_to_running_p99_s']:.2f}",
            ),
        )
    print(f"operator_scale: {out['jobs']} jobs, {out['threads']} client threads")
    for k, v in rows:
        print(f"  {k:<46} {v}")
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    exit_on_sigterm()
    sys.exit(main())
