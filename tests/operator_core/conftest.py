"""Fixtures for the operator against the real dev cluster: the operator as a real process, a rank-0
trainer metrics endpoint served by the trainer's own TrainerMetrics, and polling helpers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import ClassVar

import pytest
import yaml
from kubernetes import client
from prometheus_client import start_http_server

from llmtrain.backends import get as get_backend
from llmtrain.backends.jobset import COMPLETION_INDEX_LABEL
from llmtrain.backends.pytorchjob import REPLICA_INDEX_LABEL
from llmtrain.spec import API_VERSION, GROUP, KIND, PLURAL, VERSION
from llmtrain_devcluster.process import free_port, log_tail, wait_until
from llmtrain_devcluster.standins import jobset_status, pytorchjob_conditions, worker0_pod

PTJ = ("kubeflow.org", "v1", "pytorchjobs")
JS = ("jobset.x-k8s.io", "v1alpha2", "jobsets")


def _kind(backend: str) -> tuple[str, str, str]:
    """(group, version, plural) of the backend's child kind."""
    k = get_backend(backend).child
    return k.group, k.version, k.plural


def batch_job_status(state: str, message: str = "", started: str | None = None) -> dict:
    """The status the Job controller (Kubernetes 1.36) leaves a finished Job in, as the API server's
    status validation accepts it: FailureTarget before Failed, SuccessCriteriaMet before Complete,
    a start time (`started`: the one the controller set, immutable), no active pods."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ends = {
        "Failed": (("FailureTarget", "Failed"), "BackoffLimitExceeded", {"failed": 1}),
        "Succeeded": (
            ("SuccessCriteriaMet", "Complete"),
            "CompletionsReached",
            {"succeeded": 1, "completionTime": now},
        ),
    }
    types, reason, counts = ends[state]
    conditions = [
        {"type": t, "status": "True", "reason": reason, "message": message, "lastTransitionTime": now} for t in types
    ]
    return {"status": {"startTime": started or now, "active": 0, "ready": 0, "conditions": conditions, **counts}}


def wait_for(fn, timeout: float = 30, what: str = "condition"):
    """Poll `fn` until it returns something truthy (a 404 meanwhile is "not yet"); fail the test
    with `what` after `timeout` seconds."""
    return wait_until(fn, timeout=timeout, what=what, on_fail=AssertionError)


def _flag_values(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]


class OperatorProcess:
    """`llmtrain-operator` run as a real process against the dev cluster's kubeconfig.

    Two of them never act on the same namespace of one cluster at once, unless both contend for
    the same leader Lease (start() refuses): the other one would act on this test's jobs too, so a
    test of what one operator does (fails over, survives a restart, keeps serving under an attack)
    would pass on the other's work, or fail on it (one not serving the job's backend fails the job).
    A module's shared operator watches every namespace: a test that runs its own goes in a module
    without one, and scopes its own to its namespace (--namespace)."""

    running: ClassVar[list[OperatorProcess]] = []  # started and not stopped, in this test process

    def __init__(self, kubeconfig: Path, log: Path, trainer_metrics_port: int, extra_args=()):
        self.kubeconfig, self.log_path = kubeconfig, log
        self.liveness_port, self.metrics_port = free_port(), free_port()
        self.trainer_metrics_port = trainer_metrics_port
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen | None = None

    @property
    def watches(self) -> set[str] | None:
        """The namespaces it acts on (--namespace); None: all of them."""
        return set(_flag_values(self.extra_args, "--namespace")) or None

    @property
    def lease(self) -> tuple[str, str] | None:
        """(namespace, name) of the leader Lease it contends for (--leader-elect), else None."""
        if "--leader-elect" not in self.extra_args:
            return None
        ns = _flag_values(self.extra_args, "--leader-election-namespace") or ["default"]
        name = _flag_values(self.extra_args, "--leader-election-name") or ["llmtrain-operator"]
        return ns[-1], name[-1]

    def overlaps(self, other: OperatorProcess) -> bool:
        """Whether both could act on one job at the same time."""
        if Path(self.kubeconfig).resolve() != Path(other.kubeconfig).resolve():
            return False  # another cluster
        if self.lease is not None and self.lease == other.lease:
            return False  # one leader at a time
        mine, theirs = self.watches, other.watches
        return mine is None or theirs is None or bool(mine & theirs)

    def _refuse_overlaps(self) -> None:
        OperatorProcess.running[:] = [
            op for op in OperatorProcess.running if op.proc is not None and op.proc.poll() is None
        ]
        for other in OperatorProcess.running:
            if other is not self and self.overlaps(other):
                where = "every namespace" if other.watches is None else ", ".join(sorted(other.watches))
                raise AssertionError(
                    f"another operator (log: {other.log_path}) already acts on {where} of this cluster: "
                    f"it would act on the jobs of this one (log: {self.log_path}) too. Run the test that "
                    "starts its own operator in a module without a shared one, with --namespace"
                )

    def start(self) -> None:
        self._refuse_overlaps()
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        cmd = [
            sys.executable,
            "-m",
            "llmtrain.controller",
            "--bind-address",
            "127.0.0.1",
            "--liveness-port",
            str(self.liveness_port),
            "--metrics-port",
            str(self.metrics_port),
            "--trainer-metrics-port",
            str(self.trainer_metrics_port),
            "--progress-interval",
            "0.5",
            "--default-etcd-endpoint",
            "etcd.test.svc:2379",
            # the tests' jobs restart after 1 s (TINY); the product's floor is 5 s
            "--min-restart-backoff-seconds",
            "1",
            *self.extra_args,
        ]
        self.log = open(self.log_path, "a")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        if self not in OperatorProcess.running:
            OperatorProcess.running.append(self)
        wait_for(self.healthy, 60, f"operator health (log: {self.log_path})")

    def healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"operator exited {self.proc.returncode}:\n{log_tail(self.log_path)}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def stop(self, sig=signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self in OperatorProcess.running:
            OperatorProcess.running.remove(self)
        self.log.close()

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()


@pytest.fixture(scope="module")
def trainer_endpoint():
    """A rank-0 metrics endpoint made of the trainer's real TrainerMetrics on a free loopback port."""
    from llmtrain_trainer.metrics.prometheus import TrainerMetrics

    metrics = TrainerMetrics(job="progress", rank=0)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=metrics.registry)
    yield metrics, port
    server.shutdown()
    thread.join(5)


@pytest.fixture(scope="module")
def operator(dev_cluster, trainer_endpoint, tmp_path_factory):
    op = OperatorProcess(
        dev_cluster.kubeconfig, tmp_path_factory.mktemp("operator") / "operator.log", trainer_endpoint[1]
    )
    op.start()
    yield op
    op.stop()


@pytest.fixture
def kube(dev_cluster):
    with dev_cluster.api_client() as api:
        yield Kube(api, dev_cluster)


class Kube:
    def __init__(self, api, cluster):
        self.api, self.cluster = api, cluster
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)

    def job_doc(self, name: str, spec: dict) -> dict:
        return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": spec}

    def apply(self, namespace: str, doc: dict, check: bool = True) -> subprocess.CompletedProcess:
        return self.cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc), check=check)

    def job(self, namespace: str, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)

    def status(self, namespace: str, name: str) -> dict:
        return self.job(namespace, name).get("status") or {}

    def wait_phase(self, namespace: str, name: str, phase: str, timeout: float = 30) -> dict:
        return wait_for(
            lambda: (s := self.status(namespace, name)).get("phase") == phase and s, timeout, f"{name} phase {phase}"
        )

    def ptj(self, namespace: str, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(*PTJ[:2], namespace, PTJ[2], name)

    def wait_ptj(self, namespace: str, name: str, timeout: float = 30) -> dict:
        return wait_for(lambda: self.ptj(namespace, name), timeout, f"PyTorchJob {name}")

    def ptjs(self, namespace: str, job: str) -> list[dict]:
        return self.custom.list_namespaced_custom_object(
            *PTJ[:2], namespace, PTJ[2], label_selector=f"llmtrain.dev/job={job}"
        )["items"]

    def set_ptj_condition(self, namespace: str, name: str, ctype: str, message: str = "") -> None:
        """Write the PyTorchJob's status the way Kubeflow's training-operator does."""
        current = (self.ptj(namespace, name).get("status") or {}).get("conditions") or []
        conds = pytorchjob_conditions(current, ctype, name, message)
        self.custom.patch_namespaced_custom_object_status(
            *PTJ[:2], namespace, PTJ[2], name, {"status": {"conditions": conds}}
        )

    def set_child_state(self, backend: str, namespace: str, name: str, state: str, message: str = "") -> None:
        """Write the attempt's child's status the way its controller does: the training-operator's
        PyTorchJob condition `state`, JobSet's controller's status for `state` (Running, Failed,
        Succeeded), or the Job controller's for a finished Job (Failed, Succeeded)."""
        if backend == "pytorchjob":
            self.set_ptj_condition(namespace, name, state, message)
            return
        group, version, plural = _kind(backend)
        if backend == "job":
            current = self.custom.get_namespaced_custom_object(group, version, namespace, plural, name)
            status = batch_job_status(state, message, (current.get("status") or {}).get("startTime"))
        else:
            status = jobset_status(state, message)
        self.custom.patch_namespaced_custom_object_status(group, version, namespace, plural, name, status)

    def wait_child(self, backend: str, namespace: str, name: str, timeout: float = 30) -> dict:
        kind = _kind(backend)
        return wait_for(
            lambda: self.custom.get_namespaced_custom_object(kind[0], kind[1], namespace, kind[2], name),
            timeout,
            f"{backend} child {name}",
        )

    def worker_pod(self, backend: str, namespace: str, child: dict, index: int, image: str) -> dict:
        """Worker `index`'s pod of attempt `child` (as read from the API), owned as its controller
        owns it: by the PyTorchJob, or the batch Job (job backend); on JobSet by the JobSet's Job,
        which the light cluster's test makes as JobSet's controller would (`spec.managedBy` a
        stand-in, so the Job controller leaves it alone), once per attempt."""
        job, attempt = (
            child["metadata"]["labels"]["llmtrain.dev/job"],
            int(child["metadata"]["name"].rsplit("-a", 1)[1]),
        )
        pod = worker0_pod(job, attempt, image, owner=child if backend == "pytorchjob" else None)
        pod["metadata"]["name"] = f"{child['metadata']['name']}-worker-{index}"
        if backend == "pytorchjob":
            return pod
        labels = pod["metadata"]["labels"]
        labels.pop(REPLICA_INDEX_LABEL, None)
        labels[COMPLETION_INDEX_LABEL] = str(index)
        if backend == "job":  # the Job's own pod (not its selector's: the Job controller leaves it be)
            ref = {"apiVersion": "batch/v1", "kind": "Job", "name": child["metadata"]["name"]}
            pod["metadata"]["ownerReferences"] = [{**ref, "uid": child["metadata"]["uid"], "controller": True}]
            return pod
        name = f"{child['metadata']['name']}-worker-0"
        batch = client.BatchV1Api(self.api)
        try:
            owner = batch.read_namespaced_job(name, namespace)
        except client.ApiException as err:
            if err.status != 404:
                raise
            meta = child["metadata"]
            ref = {"apiVersion": f"{JS[0]}/{JS[1]}", "kind": "JobSet", "name": meta["name"], "uid": meta["uid"]}
            owner = batch.create_namespaced_job(
                namespace,
                {
                    "metadata": {"name": name, "ownerReferences": [{**ref, "controller": True}]},
                    "spec": {
                        "managedBy": "llmtrain.dev/test-stand-in",
                        "completionMode": "Indexed",
                        "completions": 1,
                        "parallelism": 1,
                        "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}},
                    },
                },
            )
        pod["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": name,
                "uid": owner.metadata.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        return pod

    def children(self, backend: str, namespace: str, job: str) -> list[dict]:
        """The job's children of `backend`'s kind (the renderer's job label)."""
        kind = _kind(backend)
        return self.custom.list_namespaced_custom_object(
            kind[0], kind[1], namespace, kind[2], label_selector=f"llmtrain.dev/job={job}"
        )["items"]

    def events(self, namespace: str, name: str) -> list:
        return [e for e in self.core.list_namespaced_event(namespace).items if e.involved_object.name == name]
