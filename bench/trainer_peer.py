"""llmtrain on its three backends against its peer, Kubeflow Trainer v2, in one run on one chain dev
cluster: ``bench/operator_scale.py --nodes N --peer`` (see :func:`run_peer`).

Four paths (``--paths``, all by default), from one object a user writes to the same pod on a
simulated p5 node:

* ``llmtrain-jobset``: ``LLMTrainingJob`` (``spec.cluster.backend: jobset``) → the operator renders
  a JobSet → the JobSet controller its Job → the job controller its pod;
* ``llmtrain-pytorchjob``: ``LLMTrainingJob`` → the operator renders a PyTorchJob → the
  training-operator v1 its pod;
* ``llmtrain-job``: ``LLMTrainingJob`` (``spec.cluster.backend: job``) → the operator renders an
  Indexed Job (and its headless Service) → the job controller its pod;
* ``trainer``: an equivalent ``TrainJob`` → the Trainer applies a JobSet → Job → pod, against a
  ``ClusterTrainingRuntime`` made from the very pod template llmtrain renders (same image,
  resources, node selector, tolerations, env: :func:`torch_runtime`).

The operator of an llmtrain phase runs with only that phase's backend enabled. Per phase (its own
namespace; the order of the phases is :func:`phase_order`'s, mirrored across repeats):

* ``--jobs`` one-node p5 jobs created by ``--threads`` client threads;
* per job: create → first child (PyTorchJob / JobSet), create → pods created, create → all pods
  Running (p50/p95/p99); jobs/s to the last first child and to the last Running; each stage on the
  way (:func:`stage_breakdown`: child → Job → pods → bound → Running);
* CPU per job of every process (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok,
  training-operator, the llmtrain operator, jobset-controller, trainer-controller-manager, this bench),
  from /proc over the phase (create → all Running), and the same less each process's idle rate
  sampled for ``--idle-sample`` s before the phase (a longer phase accrues more idle CPU; the
  previous phase's namespace is gone by then); each controller's peak RSS; API requests per job
  (the API server's own counters) and the operator's reconciles per job;
* lost (no child, no pods, or fewer jobs Running than the nodes hold) and duplicated (a child or a
  pod created twice) jobs, and training pods seen Succeeded or Failed (kwok must leave them
  Running on every path). With ``--jobs`` above ``--nodes`` (each one-node job takes a whole p5),
  the jobs beyond the nodes' capacity stay Pending on every path: the Running figures are over the
  jobs that fit;
* clean-up: delete all → no child and no pod left, then the namespace gone.
Then, per figure, the median over each path's phases, the ratios of llmtrain-jobset against
Trainer v2 and against llmtrain-pytorchjob, of llmtrain-job against llmtrain-jobset and Trainer v2,
and issue 28's targets (:func:`targets`).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

from chainbench import (
    PTJ,
    ChainRun,
    ResumingWatches,
    api_client,
    clean_up,
    job_spec,
    llmtrain_operator_args,
    log,
    make_namespace,
    qps_args,
    request_counts,
    stats,
    training_operator_args,
    wait_for,
)
from llmtrain_devcluster.jobset import JOBSET

RUNTIME_NAME = "llmtrain-bench-torch"
TRAINER_STAGE_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"


def torch_runtime(rendered_ptj: dict, name: str = RUNTIME_NAME) -> dict:
    """A torch ``ClusterTrainingRuntime`` whose one trainer node runs exactly the pod llmtrain renders
    for the job (``rendered_ptj``'s Worker template: image, command, resources, node selector,
    tolerations, env, security context), with Trainer's torch policy, whose processes per node
    default to the GPUs the container requests (8 on p5, as llmtrain's ``nprocPerNode``). The
    container is renamed ``node``: the name Trainer's torch plugin looks for. Its pods carry the
    training label, so kwok keeps them Running as it does llmtrain's (chain.scoped_pod_complete)."""
    from llmtrain.render import JOB_LABEL

    worker = rendered_ptj["spec"]["pytorchReplicaSpecs"]["Worker"]
    pod = copy.deepcopy(worker["template"]["spec"])
    (container,) = [c for c in pod["containers"] if c["name"] == "pytorch"]
    container["name"] = "node"
    pod["restartPolicy"] = worker.get("restartPolicy", "Never")
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name, "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {
            "mlPolicy": {"numNodes": worker.get("replicas", 1), "torch": {}},
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {
                                "metadata": {"labels": {TRAINER_STAGE_LABEL: "trainer"}},
                                "spec": {
                                    "backoffLimit": rendered_ptj["spec"].get("runPolicy", {}).get("backoffLimit", 0),
                                    "template": {
                                        "metadata": {
                                            # The training label (and only it: the operator's pod
                                            # watches also need the attempt label) keeps kwok's
                                            # pod-complete off these pods, as off llmtrain's.
                                            "labels": {JOB_LABEL: worker["template"]["metadata"]["labels"][JOB_LABEL]},
                                            "annotations": dict(
                                                worker["template"]["metadata"].get("annotations") or {}
                                            ),
                                        },
                                        "spec": pod,
                                    },
                                },
                            },
                        }
                    ]
                }
            },
        },
    }


def trainjob(name: str, runtime: str = RUNTIME_NAME) -> dict:
    """The TrainJob a user writes for that runtime: a name and the runtime's reference."""
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {"runtimeRef": {"name": runtime, "apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime"}},
    }


class BenchPath(NamedTuple):
    """One path the bench measures: who renders the child, what the child is, which label groups a
    job's Jobs and pods."""

    name: str
    backend: str | None  # llmtrain's spec.cluster.backend (the operator runs with only it enabled); None: Trainer v2
    child: tuple[str, str, str]  # the first object made for the job: PyTorchJob, JobSet or batch Job
    has_jobs: bool  # batch Jobs between the child and the pods (JobSet's)


PATHS: dict[str, BenchPath] = {
    p.name: p
    for p in (
        BenchPath("llmtrain-jobset", "jobset", JOBSET, True),
        BenchPath("llmtrain-pytorchjob", "pytorchjob", PTJ, False),
        BenchPath("llmtrain-job", "job", ("batch", "v1", "jobs"), False),
        BenchPath("trainer", None, JOBSET, True),
    )
}
TARGET_PATH = "llmtrain-jobset"  # the path issue 28's targets are about


def parse_paths(flag: str) -> list[str]:
    """``--paths`` as a list, or ValueError naming the flag, the bad entry and what is accepted."""
    paths = [p.strip() for p in flag.split(",") if p.strip()]
    bad = [p for p in paths if p not in PATHS]
    if bad or not paths:
        raise ValueError(
            f"--paths {flag!r}: {', '.join(map(repr, bad)) or 'no path'} is not a path; "
            f"a comma-separated list of {', '.join(PATHS)}"
        )
    if len(set(paths)) != len(paths):
        raise ValueError(f"--paths {flag!r}: a path is named twice")
    return paths


def phase_order(paths: list[str], repeat: int) -> list[str]:
    """Each path ``repeat`` times: in the given order, then reversed, then the next rotation of the
    list, reversed again, ... With an even ``repeat`` every path's mean position in the run is the
    same, so a steady drift of the host's load favours none."""
    out: list[str] = []
    for r in range(repeat):
        k = (r // 2) % len(paths)
        order = paths[k:] + paths[:k]
        out += order if r % 2 == 0 else order[::-1]
    return out


class StageRecorder(ResumingWatches):
    """Watches a namespace's children (PyTorchJobs or JobSets), batch Jobs and pods; per job the
    first time each stage was seen: ``child_created``, ``jobs_created`` (the JobSet's Job),
    ``pods_created``, ``pods_scheduled`` (bound to a node), ``pods_running``; how often its child
    was ADDED, every pod name it ever had, and the pods seen Succeeded or Failed (none should be:
    kwok's pod-complete stage leaves training pods Running, and nothing here ends them).

    A job is keyed by llmtrain's job label on llmtrain's paths (child, Jobs and pods carry it), and
    by the JobSet's name on Trainer v2's (the TrainJob's JobSet is named after it; its Jobs and pods
    carry ``jobset.sigs.k8s.io/jobset-name``)."""

    def __init__(self, api, namespace: str, path: BenchPath, nodes_per_job: int = 1):
        super().__init__()
        from kubernetes import client

        from llmtrain.render import JOB_LABEL
        from llmtrain_devcluster.jobset import JOBSET_NAME_LABEL

        self.nodes, self.path = nodes_per_job, path
        self.label = JOB_LABEL if path.backend else JOBSET_NAME_LABEL
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        self.lock = threading.Lock()
        self.times: dict[str, dict[str, float]] = {}
        self.added: dict[str, int] = {}
        self.pod_names: dict[str, set[str]] = {}
        self.ended_pods: set[str] = set()
        self._pods: dict[str, dict[str, tuple[str | None, str | None]]] = {}
        self._watch(core.list_namespaced_pod, (namespace,), self._pod)
        self._watch(custom.list_namespaced_custom_object, (*path.child[:2], namespace, path.child[2]), self._child)
        if path.has_jobs:
            self._watch(client.BatchV1Api(api).list_namespaced_job, (namespace,), self._job)

    def _child(self, kind: str, obj: dict, t: float) -> None:
        meta = obj["metadata"]
        key = (meta.get("labels") or {}).get(self.label) if self.path.backend else meta["name"]
        if kind != "ADDED" or key is None:
            return
        with self.lock:
            self._mark(key, "child_created", t)
            self.added[key] = self.added.get(key, 0) + 1

    def _job(self, kind: str, job, t: float) -> None:
        key = (job.metadata.labels or {}).get(self.label)
        if kind == "ADDED" and key is not None:
            with self.lock:
                self._mark(key, "jobs_created", t)

    def _pod(self, kind: str, pod, t: float) -> None:
        key = (pod.metadata.labels or {}).get(self.label)
        if key is None:
            return
        with self.lock:
            pods = self._pods.setdefault(key, {})
            if kind == "DELETED":
                pods.pop(pod.metadata.name, None)
                return
            self.pod_names.setdefault(key, set()).add(pod.metadata.name)
            pods[pod.metadata.name] = (pod.spec.node_name, pod.status.phase)
            if pod.status.phase in ("Succeeded", "Failed"):
                self.ended_pods.add(pod.metadata.name)
            if len(pods) >= self.nodes:
                self._mark(key, "pods_created", t)
            if sum(1 for n, _ in pods.values() if n) >= self.nodes:
                self._mark(key, "pods_scheduled", t)
            if sum(1 for _, ph in pods.values() if ph == "Running") >= self.nodes:
                self._mark(key, "pods_running", t)

    def get(self, job: str, stage: str) -> float | None:
        with self.lock:
            return self.times.get(job, {}).get(stage)


def proc_usage(pid: int) -> tuple[float, float] | None:
    """(CPU seconds user+system, peak RSS MiB) of a process, from /proc; None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    hwm = next((int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith("VmHWM:")), 0.0)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), hwm


def _usage(pids: dict[str, int]) -> dict[str, tuple[float, float]]:
    return {n: u for n, p in pids.items() if (u := proc_usage(p)) is not None}


def _wait_stage(
    view, names: list[str], stage: str, timeout: float, settle_s: float, want: int | None = None
) -> dict[str, float]:
    """Until ``want`` jobs (all by default) reached ``stage``, or none did for ``settle_s``, or
    ``timeout``: {job: time}."""
    want = len(names) if want is None else want
    deadline = time.monotonic() + timeout
    last, last_change = -1, time.monotonic()
    while True:
        done = {n: t for n in names if (t := view.get(n, stage)) is not None}
        if len(done) != last:
            last, last_change = len(done), time.monotonic()
        if len(done) >= want or time.monotonic() - last_change > settle_s or time.monotonic() > deadline:
            return done
        time.sleep(0.2)


def made_per_bucket(made: dict[str, list[str]], width: int) -> dict[str, dict[str, int]]:
    """Objects made per ``width``-second bucket of their creationTimestamps, per kind, counted from the
    first child's: ``{"jobs": {"0": 7, "5": 6, ...}}`` (buckets with none left out)."""
    from llmtrain.controller.policy.child_status import parse_time

    def seconds(stamp: str) -> float:
        return parse_time(stamp).timestamp()

    if not made.get("child"):
        return {}
    t0 = min(seconds(s) for s in made["child"])
    out = {}
    for kind, stamps in made.items():
        counts = Counter(int((seconds(s) - t0) // width) * width for s in stamps)
        out[kind] = {str(k): v for k, v in sorted(counts.items())}
    return out


def run_phase(
    path: BenchPath,
    api,
    run: ChainRun,
    names: list[str],
    a: argparse.Namespace,
    tag: str,
    index: int,
    base_pids: dict[str, int],
) -> dict:
    """One phase of ``path``: create ``names``, measure, clean up."""
    from kubernetes import client

    from llmtrain.spec import API_VERSION, GROUP, KIND, PLURAL, VERSION
    from llmtrain_devcluster.trainer_v2 import TRAINJOB

    custom = client.CustomObjectsApi(api)
    ns = f"bench-{path.name}-{index}-{tag}"
    make_namespace(api, ns)
    pids = dict(base_pids, bench=os.getpid())
    op = None
    view = StageRecorder(api, ns, path)
    if path.backend:
        # Only this path's backend enabled: the operator watches and creates that one kind.
        flags = llmtrain_operator_args(a.workers, a.operator_arg)
        op = run.start_operator(ns, ["--progress-interval", "3600", "--backend", path.backend, *flags])
        pids["llmtrain-operator"] = op.proc.pid
        raw = job_spec(nodes=1)
        raw["cluster"]["backend"] = path.backend
        gvp = (GROUP, VERSION, PLURAL)
        objs = {n: {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": n}, "spec": raw} for n in names}
    else:
        gvp = TRAINJOB
        objs = {n: trainjob(n) for n in names}
    created_at: dict[str, float] = {}
    answered_at: dict[str, float] = {}

    def create(name: str) -> None:
        created_at[name] = time.monotonic()
        custom.create_namespaced_custom_object(gvp[0], gvp[1], ns, gvp[2], objs[name])
        answered_at[name] = time.monotonic()

    # Each process's idle CPU rate just before the phase (kwok's node heartbeats, leases, the API
    # server's own loops): a longer phase accrues more of it, which is not a cost of its jobs.
    idle0, i0 = _usage(pids), time.monotonic()
    time.sleep(a.idle_sample)  # a measurement window, not a wait for readiness
    idle1, idle_s = _usage(pids), time.monotonic() - i0
    idle_rate = {n: (idle1[n][0] - idle0[n][0]) / idle_s for n in idle1 if n in idle0}
    loadavg0 = os.getloadavg()
    requests0 = request_counts(api)
    before = _usage(pids)
    t0 = time.monotonic()
    with ThreadPoolExecutor(a.threads) as pool:
        list(pool.map(create, names))
    children = _wait_stage(view, names, "child_created", a.timeout, a.settle)
    pods = _wait_stage(view, names, "pods_created", a.timeout, a.settle)
    fit = min(len(names), a.nodes)  # one-node jobs, one whole p5 each
    running = _wait_stage(view, names, "pods_running", a.timeout, a.settle, want=fit)
    phase_s = time.monotonic() - t0
    # The CPU and request window runs on until the controllers have written what they write after
    # the pods run (llmtrain's Running status, the PyTorchJob's, JobSet's and the Jobs' status):
    # ended at the last pod Running, it cut off each path's trailing work by a different amount
    # (measured at 200 jobs: 1.05 status writes per job on PyTorchJob, whose Running comes after
    # the training-operator's, against 1.42 on JobSet).
    requests, late_writes = quiesce(api, a.quiet, a.settle)
    span = time.monotonic() - t0
    after = _usage(pids)
    res: dict = {
        "kind": path.name,
        "namespace": ns,
        "jobs": len(names),
        "loadavg_start": [round(x, 2) for x in loadavg0],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }
    # The user's create itself (admission, TrainJob's webhooks included, and the write).
    res["create_call_s"] = stats([answered_at[n] - created_at[n] for n in names])
    res["create_to_child_s"] = stats([children[n] - created_at[n] for n in children])
    res["create_to_pods_created_s"] = stats([pods[n] - created_at[n] for n in pods])
    res["create_to_running_s"] = stats([running[n] - created_at[n] for n in running])
    # The stage after the child: the training-operator v1 (PyTorchJob → pods) or JobSet + job controller.
    res["child_to_pods_created_s"] = stats([pods[n] - children[n] for n in pods if n in children])
    res["child_to_running_s"] = stats([running[n] - children[n] for n in running if n in children])
    res["stages_s"] = stage_breakdown(view, path, names, created_at)
    res["jobs_per_s_child"] = len(children) / (max(children.values()) - t0) if children else 0.0
    res["jobs_per_s_running"] = len(running) / (max(running.values()) - t0) if running else 0.0
    res["reached_running"] = len(running)
    res["phase_s"] = phase_s
    res["cpu_window_s"] = span
    # False: something still wrote at the cap (phase_s + settle); the window is then that long
    res["cpu_window_quiet"] = span - phase_s < a.settle
    res["writes_after_running"] = late_writes
    res["cpu_ms_per_job"] = {
        n: round(1000 * (after[n][0] - before[n][0]) / len(names), 2) for n in after if n in before
    }
    res["cpu_ms_per_job_total"] = round(sum(res["cpu_ms_per_job"].values()), 2)
    res["idle_cpu_ms_per_s"] = {n: round(1000 * r, 2) for n, r in idle_rate.items()}
    res["cpu_ms_per_job_above_idle"] = {
        n: round(1000 * (after[n][0] - before[n][0] - idle_rate.get(n, 0.0) * span) / len(names), 2)
        for n in after
        if n in before
    }
    res["cpu_ms_per_job_above_idle_total"] = round(sum(res["cpu_ms_per_job_above_idle"].values()), 2)
    res["peak_rss_mib"] = {n: round(u[1], 1) for n, u in after.items() if n != "bench"}
    # What every client asked of the API server per job over the phase (the bench's creates and
    # watches included; the kinds of at least one request per 10 jobs).
    delta = {k: v - requests0.get(k, 0.0) for k, v in requests.items()}
    res["api_requests_per_job"] = round(sum(delta.values()) / len(names), 2)
    res["api_requests_per_job_by_kind"] = {
        k: round(v / len(names), 2) for k, v in sorted(delta.items(), key=lambda kv: -kv[1]) if v >= len(names) / 10
    }
    if op is not None:  # the operator's reconciles that acted (created, updated, ...), per job, by outcome
        res["operator_reconciles_per_job"] = {k: round(v / len(names), 2) for k, v in op.reconciles().items()}
    # Lost: no child, or not every pod Running. Duplicated: a child or a pod created twice.
    res["capacity"] = fit
    res["lost"] = sum(1 for n in names if n not in children or n not in pods) + max(0, fit - len(running))
    items = custom.list_namespaced_custom_object(*path.child[:2], ns, path.child[2])["items"]
    per_job: dict[str, int] = {}
    for c in items:
        key = (c["metadata"].get("labels") or {}).get(view.label) if path.backend else c["metadata"]["name"]
        per_job[key] = per_job.get(key, 0) + 1
    res["duplicated"] = sum(
        1
        for n in names
        if per_job.get(n, 0) > 1
        or (not view.relisted and view.added.get(n, 0) > 1)
        or len(view.pod_names.get(n, ())) > 1
    )
    # When each stage's objects were made, by the API server's clock (creationTimestamp, 1-s
    # resolution), independent of the bench's watches: whether a controller kept up with its input
    # or made its objects in a rush after the creates stopped.
    made = {"child": [c["metadata"]["creationTimestamp"] for c in items]}
    if path.has_jobs:
        jobs = client.BatchV1Api(api).list_namespaced_job(ns, _preload_content=False)
        made["jobs"] = [j["metadata"]["creationTimestamp"] for j in json.loads(jobs.data)["items"]]
    pods_now = client.CoreV1Api(api).list_namespaced_pod(ns, _preload_content=False)
    made["pods"] = [p["metadata"]["creationTimestamp"] for p in json.loads(pods_now.data)["items"]]
    res["made_per_5s_from_first_child"] = made_per_bucket(made, 5)
    # kwok's pod-complete must leave training pods Running on every path (Job-owned or not): a pod
    # that ended would free its node for a job beyond the capacity, and the paths would not compare.
    res["pods_ended"] = len(view.ended_pods)
    if op is not None:
        op.stop()
        run.operator = None
    res["cleanup_s"] = clean_up(api, ns, gvp, a.timeout, path.child)
    view.stop()
    res["namespace_gone_s"] = delete_namespace(api, ns, a.timeout)
    return res


WRITES = ("POST", "PUT", "PATCH", "DELETE", "APPLY")
# Written all the time whatever the phase does: kwok's node heartbeats.
BACKGROUND = ("leases", "nodes", "nodes/status")


def quiesce(api, quiet_s: float, timeout: float) -> tuple[dict[str, float], dict[str, float]]:
    """Wait until the API server has served no write (but the nodes' heartbeats) for ``quiet_s``
    seconds, or at most ``timeout``; its request counts then, and the writes served while waiting,
    by kind (what each path's controllers still wrote after the last pod ran)."""

    def writes(counts: dict[str, float]) -> dict[str, float]:
        return {k: v for k, v in counts.items() if k.split()[0] in WRITES and k.split()[-1] not in BACKGROUND}

    deadline = time.monotonic() + timeout
    counts = request_counts(api)
    first = last = writes(counts)
    last_change = time.monotonic()
    while time.monotonic() - last_change < quiet_s and time.monotonic() < deadline:
        time.sleep(0.5)
        counts = request_counts(api)
        if (w := writes(counts)) != last:
            last, last_change = w, time.monotonic()
    late = {k: v - first.get(k, 0.0) for k, v in last.items() if v != first.get(k, 0.0)}
    return counts, late


def delete_namespace(api, ns: str, timeout: float) -> float:
    """Delete ``ns`` and wait until it is gone: the namespace controller's deletion of what is left
    (the jobs' events, services, ...) costs etcd and the API server for tens of seconds, and would
    fall in the next phase's idle sample, which is subtracted from that phase's CPU (measured: etcd
    idle 30 ms/s before the first phase, 120-134 ms/s before the next ones)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api)
    started = time.monotonic()
    core.delete_namespace(ns)

    def gone() -> bool:
        try:
            core.read_namespace(ns)
        except ApiException as err:
            if err.status == 404:
                return True
            raise
        return False

    wait_for(gone, timeout, f"namespace {ns} deleted", interval=0.5)
    return time.monotonic() - started


def stage_breakdown(view: StageRecorder, path: BenchPath, names: list[str], created_at: dict[str, float]) -> dict:
    """Where each job's time went, stage by stage (p50/p95/p99 over the jobs that reached both ends):
    the controller that renders the child (llmtrain's operator or Trainer v2), the JobSet controller
    (JobSet → Job), the Job controller or the training-operator (→ pods), kube-scheduler (→ bound),
    kwok (→ Running)."""
    chain = ["child_created", *(["jobs_created"] if path.has_jobs else []), "pods_created"]
    chain += ["pods_scheduled", "pods_running"]
    out = {}
    prev = None
    for stage in chain:
        lat = []
        for n in names:
            t1 = view.get(n, stage)
            t0 = created_at.get(n) if prev is None else view.get(n, prev)
            if t0 is not None and t1 is not None:
                lat.append(t1 - t0)
        out[f"{prev or 'create'}→{stage}"] = stats(lat)
        prev = stage
    return out


FIGURES = (  # (name, path into a phase result, higher is better)
    ("the user's create call p50 (s)", ("create_call_s", "p50"), False),
    ("the user's create call p99 (s)", ("create_call_s", "p99"), False),
    ("jobs/s to the last first child", ("jobs_per_s_child",), True),
    ("jobs/s to the last all-Running", ("jobs_per_s_running",), True),
    ("create→first child p50 (s)", ("create_to_child_s", "p50"), False),
    ("create→first child p99 (s)", ("create_to_child_s", "p99"), False),
    ("create→pods created p50 (s)", ("create_to_pods_created_s", "p50"), False),
    ("create→pods created p99 (s)", ("create_to_pods_created_s", "p99"), False),
    ("create→all Running p50 (s)", ("create_to_running_s", "p50"), False),
    ("create→all Running p99 (s)", ("create_to_running_s", "p99"), False),
    ("CPU per job, all processes (ms)", ("cpu_ms_per_job_total",), False),
    ("CPU per job above idle, all processes (ms)", ("cpu_ms_per_job_above_idle_total",), False),
    ("llmtrain operator CPU per job (ms)", ("cpu_ms_per_job", "llmtrain-operator"), False),
    ("llmtrain operator CPU per job above idle (ms)", ("cpu_ms_per_job_above_idle", "llmtrain-operator"), False),
)
# The ratios printed: the target path over each of the others.
RATIOS = (
    ("llmtrain-jobset", "trainer"),
    ("llmtrain-jobset", "llmtrain-pytorchjob"),
    ("llmtrain-pytorchjob", "trainer"),
    ("llmtrain-job", "llmtrain-jobset"),
    ("llmtrain-job", "trainer"),
)


def _get(res: dict, path: tuple[str, ...]) -> float | None:
    v: Any = res
    for p in path:
        if not isinstance(v, dict) or p not in v:
            return None  # e.g. the operator's CPU on Trainer v2's path
        v = v[p]
    return float(v)


def _median(values) -> float | None:
    import statistics

    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(phases: list[dict]) -> dict:
    """Per path, each figure's median over that path's phases; the ratios of RATIOS; the targets."""
    out: dict = {}
    kinds = list(dict.fromkeys(p["kind"] for p in phases))
    by_kind = {k: [p for p in phases if p["kind"] == k] for k in kinds}
    for name, path, _ in FIGURES:
        row: dict = {}
        for k, ps in by_kind.items():
            if (m := _median(_get(p, path) for p in ps)) is not None:
                row[k] = m
        for num, den in RATIOS:
            if row.get(num) is not None and row.get(den):
                row[f"{num} / {den}"] = round(row[num] / row[den], 3)
        out[name] = row
    for key in ("cpu_ms_per_job", "cpu_ms_per_job_above_idle"):
        cpu: dict[str, dict[str, float]] = {}
        for k, ps in by_kind.items():
            procs = {n for p in ps for n in p[key]}
            cpu[k] = {n: _median(p[key].get(n, 0.0) for p in ps) for n in sorted(procs)}
        out[f"{key}_by_process"] = cpu
    out["peak_rss_mib"] = {
        k: {n: max(p["peak_rss_mib"].get(n, 0) for p in ps) for n in sorted({n for p in ps for n in p["peak_rss_mib"]})}
        for k, ps in by_kind.items()
    }
    out["stages_s"] = {
        k: {
            stage: {q: _median(p["stages_s"][stage][q] for p in ps) for q in ("p50", "p99")}
            for stage in ps[0]["stages_s"]
        }
        for k, ps in by_kind.items()
    }
    for key in ("lost", "duplicated", "pods_ended"):
        out[key] = {k: sum(p[key] for p in ps) for k, ps in by_kind.items()}
    out["targets"] = targets(out)
    return out


def targets(summary: dict) -> list[dict]:
    """Issue 28's three targets for llmtrain with JobSet, each with its numbers and verdict (medians
    over each path's phases); a target whose paths were not run is left out."""
    rows = (
        ("p99 create→all Running ≤ Trainer v2's", "create→all Running p99 (s)", "trainer", "le"),
        ("jobs/s to Running ≥ Trainer v2's", "jobs/s to the last all-Running", "trainer", "ge"),
        (
            "llmtrain operator CPU per job above idle, JobSet ≤ PyTorchJob",
            "llmtrain operator CPU per job above idle (ms)",
            "llmtrain-pytorchjob",
            "le",
        ),
    )
    out = []
    for target, figure, against, op in rows:
        ours, theirs = summary[figure].get(TARGET_PATH), summary[figure].get(against)
        if ours is None or theirs is None:
            continue
        ok = ours <= theirs if op == "le" else ours >= theirs
        out.append(
            {
                "target": target,
                TARGET_PATH: ours,
                against: theirs,
                "verdict": "PASS" if ok else "FAIL",
                "figure": figure,
            }
        )
    return out


def direct_floor(api, names: list[str], a: argparse.Namespace, tag: str) -> dict:
    """The rendered PyTorchJobs created by the bench threads themselves: what the API server and etcd
    sustain for these objects with no controller in front (a floor for any operator's latency, not a
    target: an operator path makes more writes per job than one create)."""
    from kubernetes import client

    from llmtrain.backends.pytorchjob import render_pytorchjob
    from llmtrain.validation import parse_spec

    custom = client.CustomObjectsApi(api)
    ns = f"bench-direct-{tag}"
    make_namespace(api, ns)
    spec = parse_spec(job_spec(nodes=1))
    objs = [render_pytorchjob(spec, n, ns, 1, None, "etcd.bench.svc:2379") for n in names]
    # Only the creates are timed (the training-operator's pods for them are not waited for).
    t0 = time.monotonic()
    with ThreadPoolExecutor(a.threads) as pool:
        list(pool.map(lambda o: custom.create_namespaced_custom_object(*PTJ[:2], ns, PTJ[2], o), objs))
    rate = len(names) / (time.monotonic() - t0)
    cleanup = clean_up(api, ns, PTJ, a.timeout)
    delete_namespace(api, ns, a.timeout)
    return {"jobs_per_s": rate, "cleanup_s": cleanup}


CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")


def renice(pids: dict[str, int], nice: int) -> dict[str, int]:
    """Every thread of each process to ``nice`` (Linux nice values are per thread; threads a process
    starts later inherit its creator's). Returns the threads changed per process."""
    changed = {}
    for name, pid in pids.items():
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        for tid in tids:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        changed[name] = len(tids)
    return changed


def run_peer(a: argparse.Namespace, workdir: Path) -> dict:
    """``--nodes N --peer``: phases of ``--paths`` (``--repeat`` of each, order per phase_order) on
    one chain cluster with N simulated p5 nodes (with ``--jobs`` above N, the N that fit run)."""
    from llmtrain.backends.pytorchjob import render_pytorchjob
    from llmtrain.validation import parse_spec
    from llmtrain_devcluster.trainer_v2 import TrainerV2

    to_args = training_operator_args(a.training_operator_threads, a.training_operator_qps)
    paths = parse_paths(a.paths)
    out: dict = {
        "jobs_per_phase": a.jobs,
        "threads": a.threads,
        "p5_nodes": a.nodes,
        "repeat": a.repeat,
        "paths": paths,
        "training_operator_args": to_args,
        "llmtrain_operator_args": llmtrain_operator_args(a.workers, a.operator_arg),
        "cpus": os.cpu_count(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }
    started = time.monotonic()
    cm_args = qps_args(a.controller_manager_qps)
    out["controller_manager_args"] = cm_args
    with ChainRun(
        workdir / "cluster", a.nodes, to_args, workdir / "operator.log", controller_manager_args=cm_args
    ) as run:
        cluster = run.cluster
        peer = TrainerV2(cluster) if "trainer" in paths else None
        try:
            if peer is not None:
                peer.start()
                out["peer_versions"] = peer.versions().splitlines()
            out["cluster_start_s"] = time.monotonic() - started
            api = api_client(cluster.kubeconfig, pool=max(32, a.threads * 2))
            names = [f"job-{i:05d}" for i in range(a.jobs)]
            tag = uuid.uuid4().hex[:6]
            base = {k: p.pid for k, p in cluster._procs.items()}
            if a.control_plane_nice:
                out["control_plane_nice"] = renice(
                    {k: base[k] for k in CONTROL_PLANE if k in base}, a.control_plane_nice
                )
            if peer is not None:
                rendered = render_pytorchjob(
                    parse_spec(job_spec(nodes=1)), names[0], "ns", 1, None, "etcd.bench.svc:2379"
                )
                peer.install_runtime(torch_runtime(rendered))
                base.update(peer.pids)
            if a.direct_floor:
                out["direct_floor"] = direct_floor(api, names, a, tag)
                log({"direct_floor": out["direct_floor"]})
            phases: list[dict] = []
            for name in phase_order(paths, a.repeat):
                res = run_phase(PATHS[name], api, run, names, a, tag, len(phases), base)
                log({"phase": res})
                phases.append(res)
            out["phases"] = phases
            out["summary"] = summarize(phases)
        finally:
            if peer is not None:
                peer.stop()
    out["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    out["run_s"] = time.monotonic() - started
    return out


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def print_peer(out: dict) -> None:
    s, paths = out["summary"], out["paths"]
    ratios = [(n, d) for n, d in RATIOS if n in paths and d in paths]
    print(
        f"operator_scale --peer: {out['jobs_per_phase']} one-node p5 jobs per phase, {out['repeat']}× each of "
        f"{', '.join(paths)} (order: {', '.join(p['kind'] for p in out['phases'])}), {out['p5_nodes']} simulated "
        f"p5.48xlarge nodes, {out['threads']} client threads; loadavg {out['loadavg_start']} → {out['loadavg_end']}"
    )
    head = "".join(f"{p:>21}" for p in paths) + "".join(f"{n + ' / ' + d:>40}" for n, d in ratios)
    print(f"  {'figure (median over phases)':<48}{head}")
    for name, _, _ in FIGURES:
        r = s[name]
        cells = "".join(f"{_fmt(r.get(p)):>21}" for p in paths)
        cells += "".join(f"{_fmt(r.get(f'{n} / {d}')):>40}" for n, d in ratios)
        print(f"  {name:<48}{cells}")
    for kind, stages in s["stages_s"].items():
        print(
            f"  stages p50/p99 (s), {kind}: "
            + ", ".join(f"{st} {_fmt(v['p50'])}/{_fmt(v['p99'])}" for st, v in stages.items())
        )
    for kind, procs in s["cpu_ms_per_job_above_idle_by_process"].items():
        print(f"  CPU ms/job above idle, {kind}: " + ", ".join(f"{n} {v:.1f}" for n, v in procs.items()))
    for kind, procs in s["peak_rss_mib"].items():
        print(f"  peak RSS MiB, {kind}: " + ", ".join(f"{n} {v:.0f}" for n, v in procs.items()))
    print(f"  lost {s['lost']}, duplicated {s['duplicated']}, training pods ended {s['pods_ended']}")
    for t in s["targets"]:
        nums = ", ".join(f"{k} {v:.2f}" for k, v in t.items() if isinstance(v, float))
        print(f"  target: {t['target']}: {t['verdict']} ({nums})")
    if "direct_floor" in out:
        print(f"  floor: the bench creating the rendered PyTorchJobs itself, {out['direct_floor']['jobs_per_s']:.1f}/s")


__all__ = ["PATHS", "parse_paths", "phase_order", "print_peer", "run_peer", "summarize", "torch_runtime", "trainjob"]
