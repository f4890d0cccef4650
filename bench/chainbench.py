"""What the benchmarks on the real chain share: a dev cluster with kube-scheduler, kwok p5 nodes and
the Kubeflow training-operator; the operator as a process; and one watch per kind that records when
each job's attempt reached each stage (PyTorchJob created / Failed, pods created / scheduled /
Running / Failed, the job's status.attempt), as seen by this process's clock.

Also the cluster chores the benches on it repeat: a namespace, the API server's request counts,
deleting every object of a kind and waiting until its children and pods are gone, and each figure
logged as soon as it is measured.

Used by ``recovery.py --control-plane``, ``operator_scale.py``, ``trainer_peer.py``,
``crd_write_cost.py`` and ``readopt_abba.py``; it imports none of them (tests/bench/test_bench_imports.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [p for p in (str(REPO / "operator"), str(REPO / "devcluster")) if p not in sys.path]

PTJ = ("kubeflow.org", "v1", "pytorchjobs")
P5 = "p5.48xlarge"


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    values = sorted(values)
    k = min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))
    return values[k]


def stats(values: list[float]) -> dict:
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "max": max(values) if values else float("nan"),
    }


def free_port() -> int:
    from llmtrain_devcluster.process import free_port as fp

    return fp()


def wait_for(fn, timeout: float, what: str, interval: float = 0.1):
    """Poll ``fn`` until it returns something truthy; SystemExit naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def print_operator_log_tail(log_path: Path, tail: int = 6000) -> None:
    """For a bench that failed: the tail of the operator's log (its tempdir is gone afterwards)."""
    if log_path.exists():
        print("--- operator log (tail) ---\n" + log_path.read_text()[-tail:], file=sys.stderr)


def exit_on_sigterm() -> None:
    """`kill` (SIGTERM) a bench like Ctrl-C: unwind through its `finally`s, so the cluster it
    started (kube-apiserver, etcd, kwok, ...) is stopped rather than left running as orphans."""
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))


def chain_cluster(state_dir: Path, p5_nodes: int, training_operator_args=(), controller_manager_args=()):
    """A started chain dev cluster with ``p5_nodes`` simulated p5.48xlarge nodes (nothing else)."""
    from llmtrain_devcluster import DevCluster

    return DevCluster(
        state_dir,
        chain=True,
        nodes={P5: p5_nodes},
        training_operator_args=training_operator_args,
        controller_manager_args=controller_manager_args,
    ).up(timeout=600)


def qps_args(qps: int | None) -> list[str]:
    """client-go's --kube-api-qps and --kube-api-burst (1.5x, the ratio of Kubernetes' 20/30)."""
    return [f"--kube-api-qps={qps}", f"--kube-api-burst={qps * 3 // 2}"] if qps else []


def llmtrain_operator_args(workers: int | None, extra: list[str] | None) -> list[str]:
    """Flags for the llmtrain operator a bench starts: --workers, then the --operator-arg ones verbatim."""
    return (["--workers", str(workers)] if workers else []) + list(extra or [])


def training_operator_args(threads: int | None, qps: int | None) -> list[str]:
    """Flags for the training-operator; None keeps Kubeflow's default (1 thread, 20 QPS, burst 30)."""
    args = []
    if threads:
        args.append(f"--controller-threads={threads}")
    return args + qps_args(qps)


def api_client(kubeconfig: Path, pool: int = 32):
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(str(kubeconfig), client_configuration=cfg)
    cfg.connection_pool_maxsize = pool
    return client.ApiClient(cfg)


def make_namespace(api, name: str) -> None:
    from kubernetes import client

    client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})


def request_counts(api) -> dict[str, float]:
    """The API server's own count of requests served (all clients), by verb and resource."""
    method, url, headers, body, post = api.param_serialize("GET", "/metrics", auth_settings=["BearerToken"])
    response = api.call_api(method, url, headers, body, post)
    response.read()
    data = response.data.decode()
    from prometheus_client.parser import text_string_to_metric_families

    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(data):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                key = f"{sample.labels.get('verb')} {sample.labels.get('resource')}" + (
                    f"/{sample.labels['subresource']}" if sample.labels.get("subresource") else ""
                )
                counts[key] = counts.get(key, 0) + sample.value
    return counts


def delete_all(custom, group_version, namespace: str, plural: str) -> None:
    """Delete every object of a kind in a namespace. A large deletecollection can time out at the
    API server (504) after deleting part of the set: issue it again until it completes."""
    from kubernetes.client.exceptions import ApiException

    for _ in range(20):
        try:
            custom.delete_collection_namespaced_custom_object(
                *group_version, namespace, plural, propagation_policy="Background"
            )
            return
        except ApiException as err:
            if err.status not in (500, 504):
                raise


def clean_up(
    api, namespace: str, group_version_plural: tuple[str, str, str], timeout: float, child: tuple[str, str, str] = PTJ
) -> float:
    """Delete every object of a kind in ``namespace``; seconds until no ``child`` (PyTorchJob, or
    the peer's JobSet) and no pod is left."""
    import urllib3
    from kubernetes import client

    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    started = time.monotonic()
    for _attempt in range(20):
        # A deletecollection of 1,000 objects on a busy server can outlive the request: the server
        # then drops the connection (measured) or answers 5xx after deleting part. Issue it again.
        try:
            delete_all(custom, group_version_plural[:2], namespace, group_version_plural[2])
            break
        except urllib3.exceptions.HTTPError as err:
            print(f"deletecollection again after {err!r}", file=sys.stderr)
    wait_for(
        lambda: (
            not custom.list_namespaced_custom_object(*child[:2], namespace, child[2], limit=1)["items"]
            and not core.list_namespaced_pod(namespace, limit=1).items
        ),
        timeout,
        f"every {child[2]} and pod in {namespace} gone",
    )
    return time.monotonic() - started


def log(out: dict) -> None:
    """Each figure as soon as it is measured (stderr), so a late failure loses nothing."""
    print(json.dumps(out, sort_keys=True), file=sys.stderr, flush=True)


def job_spec(nodes: int = 1, max_restarts: int = 1000) -> dict:
    """A p5 job of ``nodes`` nodes whose pods the simulated cluster can run (no ServiceAccount,
    no S3 access needed: nothing runs in the pods). Every restart-backoff field the spec has is
    set to 0: what is measured is the control plane's own speed, not a deliberate wait."""
    spec = {
        "model": {"preset": "llama2-7b"},
        "data": {"uri": "synthetic", "seqLen": 4096},
        "cluster": {"instanceType": P5, "nodes": nodes},
        "fsdp": {"shardingStrategy": "FULL_SHARD", "mixedPrecision": "bf16"},
        "training": {"maxSteps": 10000, "globalBatchTokens": 4194304 // 2 * nodes},
        "checkpoint": {"uri": "s3://bench-bucket/checkpoints/", "intervalMinutes": 60},
        "resilience": {"maxRestarts": max_restarts, **zero_backoff()},
    }
    return spec


def zero_backoff() -> dict:
    """``{field: 0}`` for every numeric ``spec.resilience`` field about backoff (restart backoff is
    being added; whatever its fields are called, the bench turns the deliberate delay off), and
    nested objects' numeric fields likewise."""
    from llmtrain.spec import LLMTrainingJobSpec

    schema = LLMTrainingJobSpec.model_json_schema(by_alias=True)
    defs = schema.get("$defs", {})

    def resolve(s: dict) -> dict:
        while "$ref" in s:
            s = defs[s["$ref"].rsplit("/", 1)[-1]]
        for alt in s.get("anyOf", []):
            if alt.get("type") != "null":
                return resolve(alt)
        return s

    out: dict = {}
    resilience = resolve(schema["properties"]["resilience"])
    for name, prop in resilience.get("properties", {}).items():
        if "backoff" not in name.lower():
            continue
        prop = resolve(prop)
        if prop.get("type") in ("integer", "number"):
            out[name] = 0
        elif prop.get("type") == "object":
            out[name] = {
                k: 0 for k, v in prop.get("properties", {}).items() if resolve(v).get("type") in ("integer", "number")
            }
    return out


class OperatorProcess:
    """``python -m llmtrain.controller`` watching one namespace, output to a log file. ``tree``: the
    checkout whose ``operator/`` it runs (default this one; another commit's worktree to compare
    two operators on one cluster)."""

    def __init__(self, kubeconfig: Path, namespace: str, log: Path, extra_args: list[str] = (), tree: Path = REPO):
        self.kubeconfig, self.namespace, self.log_path = kubeconfig, namespace, log
        self.extra_args, self.tree = list(extra_args), tree
        self.proc: subprocess.Popen | None = None
        self.metrics_port = self.liveness_port = 0

    def start(self) -> float:
        self.metrics_port, self.liveness_port = free_port(), free_port()
        cmd = [
            sys.executable,
            "-m",
            "llmtrain.controller",
            "--namespace",
            self.namespace,
            "--bind-address",
            "127.0.0.1",
            "--metrics-port",
            str(self.metrics_port),
            "--liveness-port",
            str(self.liveness_port),
            "--default-etcd-endpoint",
            "etcd.bench.svc:2379",
            *self.extra_args,
        ]
        started = time.monotonic()
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "PYTHONPATH": os.pathsep.join([str(self.tree / "operator"), os.environ.get("PYTHONPATH", "")]),
        }
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)

        def healthy() -> bool:
            if self.proc.poll() is not None:
                raise SystemExit(f"operator exited ({self.proc.returncode}); see {self.log_path}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=1):
                    return True
            except OSError:
                return False

        wait_for(healthy, 120, "operator /healthz")
        return started

    def counter(self, outcome: str) -> float:
        """llmtrain_operator_reconciles_total for one outcome, from the operator's /metrics. Only that
        family (``name[]``): the full page has a few series per job (goodput, badput by kind), and
        rendering it for 1,000 jobs at the bench's poll rate cost the operator more CPU than the
        re-adoption it timed."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics?name[]=llmtrain_operator_reconciles_total"
        with urllib.request.urlopen(url, timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(f'llmtrain_operator_reconciles_total{{outcome="{outcome}"}}'):
                    return float(line.split()[-1])
        return 0.0

    def reconciles(self) -> dict[str, float]:
        """llmtrain_operator_reconciles_total by outcome (that family only, as ``counter``)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics?name[]=llmtrain_operator_reconciles_total"
        out = {}
        with urllib.request.urlopen(url, timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith('llmtrain_operator_reconciles_total{outcome="'):
                    out[line.split('"')[1]] = float(line.split()[-1])
        return out

    def usage(self) -> tuple[float, float]:
        """(peak RSS MiB, CPU seconds) of the operator process, from /proc."""
        rss = 0.0
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                rss = int(line.split()[1]) / 1024
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return rss, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self, sig=signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class ChainRun:
    """A chain cluster for one benchmark run, and the operator the run starts on it. Leaving the
    ``with`` block stops the operator and brings the cluster down however the run ended; after a
    failure the tail of the operator's log is printed first (its tempdir is gone afterwards)."""

    def __init__(
        self,
        state_dir: Path,
        p5_nodes: int,
        training_operator_args,
        operator_log: Path,
        log_tail: int = 6000,
        controller_manager_args=(),
    ):
        self.cluster = chain_cluster(state_dir, p5_nodes, training_operator_args, controller_manager_args)
        self.operator_log, self.log_tail = operator_log, log_tail
        self.operator: OperatorProcess | None = None

    def start_operator(self, namespace: str, extra_args: list[str] = (), tree: Path = REPO) -> OperatorProcess:
        """Start an operator on ``namespace`` (stopping the one this run started before, if any)."""
        if self.operator is not None:
            self.operator.stop()
        self.operator = OperatorProcess(self.cluster.kubeconfig, namespace, self.operator_log, extra_args, tree)
        self.operator.start()
        return self.operator

    def __enter__(self) -> ChainRun:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            if exc_type is not None:
                print_operator_log_tail(self.operator_log, self.log_tail)
        finally:
            if self.operator is not None:
                self.operator.stop()
            self.cluster.down()
        return False


class ResumingWatches:
    """Watch threads that resume where they were after a watch ends (a server timeout, a dropped
    connection) and list again after an error such as 410 Gone (``relisted`` then says so: every
    object is seen ADDED once more). Subclasses call ``_watch(list_fn, args, handle)``; ``handle(kind,
    obj, t)`` gets each event with its ``time.monotonic()``."""

    def __init__(self) -> None:
        self.relisted, self._stopped = False, False
        self._watches: list = []

    def _watch(self, list_fn, args, handle) -> None:
        threading.Thread(target=self._run, args=(list_fn, args, handle), daemon=True).start()

    def _run(self, list_fn, args, handle) -> None:
        from kubernetes import watch

        version = None
        while not self._stopped:
            w = watch.Watch()
            self._watches.append(w)
            try:  # a watch ends (server timeout, a dropped connection): resume it where it was
                for ev in w.stream(list_fn, *args, timeout_seconds=300, resource_version=version):
                    obj = ev["object"]
                    meta = obj["metadata"] if isinstance(obj, dict) else obj.metadata
                    version = (
                        meta.get("resourceVersion") if isinstance(meta, dict) else meta.resource_version
                    ) or version
                    handle(ev["type"], obj, time.monotonic())
            except Exception as err:  # noqa: BLE001
                if self._stopped:
                    return
                print(f"watch restarted: {err!r}", file=sys.stderr)
                # 410 Gone and friends: list again (first-seen times are kept)
                version, self.relisted = None, True

    def _mark(self, key, stage: str, t: float) -> None:
        """The first time `key` reached `stage` (in the subclass's ``times``; callers hold its lock)."""
        self.times.setdefault(key, {}).setdefault(stage, t)

    def stop(self) -> None:
        self._stopped = True
        for w in self._watches:
            w.stop()


class Recorder(ResumingWatches):
    """Watches the pods, PyTorchJobs and LLMTrainingJobs of one namespace and records, per
    ``(job, attempt)``, the first time (``time.monotonic()``) each stage was seen:

    ``ptj_created``, ``ptj_failed`` (Failed condition True), ``pod_failed`` (a pod phase Failed),
    ``pods_created`` / ``pods_scheduled`` / ``pods_running`` (all ``nodes`` pods of the attempt
    exist / have a node / are Running), ``status_attempt`` (the job's status.attempt first showed
    this attempt) and ``job_running`` (phase Running at this attempt).
    Failed pods are gone within milliseconds (the training-operator deletes a failed job's pods),
    so this is a watch, not a poll."""

    STAGES = (
        "pod_failed",
        "ptj_failed",
        "status_attempt",
        "ptj_created",
        "pods_created",
        "pods_scheduled",
        "pods_running",
        "job_running",
    )

    def __init__(self, api, namespace: str, nodes_per_job: int = 1):
        super().__init__()
        from kubernetes import client

        from llmtrain.render import ATTEMPT_LABEL, JOB_LABEL
        from llmtrain.spec import GROUP, PLURAL, VERSION

        self.namespace, self.nodes = namespace, nodes_per_job
        self.job_label, self.attempt_label = JOB_LABEL, ATTEMPT_LABEL
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        self.lock = threading.Lock()
        self.times: dict[tuple[str, int], dict[str, float]] = {}
        self._pods: dict[tuple[str, int], dict[str, tuple[str | None, str | None]]] = {}
        self.pod_nodes: dict[tuple[str, int], set[str]] = {}
        self.phase: dict[str, tuple[int, str | None]] = {}  # job -> (attempt, phase), latest seen
        self._watch(core.list_namespaced_pod, (namespace,), self._pod)
        self._watch(custom.list_namespaced_custom_object, (*PTJ[:2], namespace, PTJ[2]), self._ptj)
        self._watch(custom.list_namespaced_custom_object, (GROUP, VERSION, namespace, PLURAL), self._job)

    def _key(self, labels) -> tuple[str, int] | None:
        labels = labels or {}
        try:
            return labels[self.job_label], int(labels[self.attempt_label])
        except (KeyError, ValueError):
            return None

    def _pod(self, kind: str, pod, t: float) -> None:
        key = self._key(pod.metadata.labels)
        if key is None:
            return
        with self.lock:
            pods = self._pods.setdefault(key, {})
            if kind == "DELETED":
                pods.pop(pod.metadata.name, None)
                return
            pods[pod.metadata.name] = (pod.spec.node_name, pod.status.phase)
            if pod.spec.node_name:
                self.pod_nodes.setdefault(key, set()).add(pod.spec.node_name)
            if pod.status.phase == "Failed":
                self._mark(key, "pod_failed", t)
            if len(pods) >= self.nodes:
                self._mark(key, "pods_created", t)
            if sum(1 for n, _ in pods.values() if n) >= self.nodes:
                self._mark(key, "pods_scheduled", t)
            if sum(1 for _, ph in pods.values() if ph == "Running") >= self.nodes:
                self._mark(key, "pods_running", t)

    def _ptj(self, kind: str, ptj: dict, t: float) -> None:
        key = self._key(ptj["metadata"].get("labels"))
        if key is None or kind == "DELETED":
            return
        with self.lock:
            self._mark(key, "ptj_created", t)
            conds = (ptj.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Failed" and c.get("status") == "True" for c in conds):
                self._mark(key, "ptj_failed", t)

    def _job(self, kind: str, job: dict, t: float) -> None:
        status = job.get("status") or {}
        if kind == "DELETED" or not status:
            return
        key = (job["metadata"]["name"], int(status.get("attempt") or 1))
        with self.lock:
            self._mark(key, "status_attempt", t)
            if status.get("phase") == "Running":
                self._mark(key, "job_running", t)
            self.phase[job["metadata"]["name"]] = (key[1], status.get("phase"))

    def get(self, job: str, attempt: int, stage: str) -> float | None:
        with self.lock:
            return self.times.get((job, attempt), {}).get(stage)
