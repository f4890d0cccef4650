"""The backend choice on the real API server (light dev cluster: both backends' CRDs, no
controllers), with the operator as a process scoped to each test's namespace: a job runs on the
backend it names, else its namespace's default, else the platform's, and keeps the one it started
with when the default changes; a backend the platform did not enable, a change of backend and a
backend whose CRD is missing are each refused with the field or the CRD named."""

from __future__ import annotations

import json
import uuid

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from llmtrain.backends import JOBSET, ApiKind
from llmtrain.spec import GROUP, PLURAL, VERSION

from .conftest import OperatorProcess, wait_for


JS = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
TINY = {"model": {"preset": "tiny"}, "cluster": {"instanceType": "cpu", "nodes": 1}, "training": {"maxSteps": 20}}


def _spec(**cluster) -> dict:
    return {**TINY, "cluster": {**TINY["cluster"], **cluster}, "resilience": {"restartBackoffSeconds": 0}}


@pytest.fixture
def start(dev_cluster, trainer_endpoint, tmp_path, namespace):
    """start(*flags): an operator watching only this test's namespace, stopped at the end."""
    running = []

    def go(*flags: str) -> OperatorProcess:
        op = OperatorProcess(
            dev_cluster.kubeconfig,
            tmp_path / f"operator-{len(running)}.log",
            trainer_endpoint[1],
            extra_args=["--namespace", namespace, *flags],
        )
        op.start()
        running.append(op)
        return op

    yield go
    for op in running:
        op.stop()


def _jobsets(kube, ns: str, job: str) -> list[dict]:
    return kube.custom.list_namespaced_custom_object(*JS[:2], ns, JS[2], label_selector=f"llmtrain.dev/job={job}")[
        "items"
    ]


def _names(items) -> set[str]:
    return {i["metadata"]["name"] for i in items if not i["metadata"].get("deletionTimestamp")}


def _set_jobset_status(kube, ns: str, name: str, status: dict) -> None:
    """Write a JobSet's status the way JobSet's controller does (the light cluster runs none)."""
    kube.custom.patch_namespaced_custom_object_status(*JS[:2], ns, JS[2], name, {"status": status})


def test_the_namespace_default_puts_a_job_on_jobset_and_it_runs_to_succeeded(start, kube, namespace):
    start("--backend", "pytorchjob", "--backend", "jobset", f"--namespace-backend={namespace}=jobset")
    kube.apply(namespace, kube.job_doc("js", _spec()))
    js = wait_for(lambda: kube.custom.get_namespaced_custom_object(*JS[:2], namespace, JS[2], "js-a1"), 30, "JobSet")
    job = kube.job(namespace, "js")
    (owner,) = js["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("LLMTrainingJob", job["metadata"]["uid"], True)
    assert js["spec"]["replicatedJobs"][0]["template"]["spec"]["backoffLimit"] == 0
    status = kube.wait_phase(namespace, "js", "Pending")
    assert (status["backend"], status["child"]) == ("jobset", "js-a1") and not kube.ptjs(namespace, "js")
    # the JobSet controller's view: every Job ready, then all completed
    ready = {
        "replicatedJobsStatus": [
            {"name": "worker", "ready": 1, "succeeded": 0, "failed": 0, "active": 1, "suspended": 0}
        ]
    }
    _set_jobset_status(kube, namespace, "js-a1", ready)
    assert kube.wait_phase(namespace, "js", "Running")["message"] == "JobSet js-a1 is Running"
    done = {
        "conditions": [
            {
                "type": "Completed",
                "status": "True",
                "reason": "AllJobsCompleted",
                "message": "jobset completed successfully",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
        "terminalState": "Completed",
        "replicatedJobsStatus": [
            {"name": "worker", "ready": 0, "succeeded": 1, "failed": 0, "active": 0, "suspended": 0}
        ],
    }
    _set_jobset_status(kube, namespace, "js-a1", done)
    kube.wait_phase(namespace, "js", "Succeeded")


def test_a_job_names_its_backend_and_keeps_it_when_the_default_changes(start, kube, namespace):
    first = start("--backend", "pytorchjob", "--backend", "jobset", "--default-backend", "pytorchjob")
    kube.apply(namespace, kube.job_doc("stays", _spec()))
    kube.apply(namespace, kube.job_doc("own", _spec(backend="jobset")))
    kube.wait_ptj(namespace, "stays-a1")
    wait_for(lambda: _names(_jobsets(kube, namespace, "own")) == {"own-a1"}, 30, "own's JobSet")
    assert kube.wait_phase(namespace, "stays", "Pending")["backend"] == "pytorchjob"
    # The platform flips its default to JobSet; the running job's next attempt is a PyTorchJob still.
    first.stop()
    start("--backend", "pytorchjob", "--backend", "jobset", "--default-backend", "jobset")
    kube.set_ptj_condition(namespace, "stays-a1", "Failed", "replica worker failed")
    kube.wait_ptj(namespace, "stays-a2")
    status = wait_for(lambda: (s := kube.status(namespace, "stays")).get("attempt") == 2 and s, 30, "attempt 2")
    assert (status["backend"], status["child"]) == ("pytorchjob", "stays-a2")
    assert not _jobsets(kube, namespace, "stays")
    # a new job takes the new default
    kube.apply(namespace, kube.job_doc("new", _spec()))
    wait_for(lambda: _names(_jobsets(kube, namespace, "new")) == {"new-a1"}, 30, "new's JobSet")


def _gauge(operator, name: str) -> float | None:
    for family in text_string_to_metric_families(operator.metrics()):
        if family.name == name:
            return family.samples[0].value
    return None


def test_jobset_creates_wait_for_the_controller_to_take_up_earlier_ones_first_come_first_served(start, kube, namespace):
    # At most two JobSets that JobSet's controller has not taken up (its first status write): the
    # third and fourth jobs wait, with no JobSet and no status, and get theirs in the order they came
    # as the controller (here, its status writes by hand) takes the earlier ones up.
    op = start("--backend", "jobset", "--max-children-untaken", "2")
    all_sets = (
        lambda: _names(  # noqa: E731
            kube.custom.list_namespaced_custom_object(*JS[:2], namespace, JS[2], label_selector="llmtrain.dev/job")[
                "items"
            ]
        )
    )
    for job in ("p0", "p1"):
        kube.apply(namespace, kube.job_doc(job, _spec()))
    wait_for(lambda: all_sets() == {"p0-a1", "p1-a1"}, 30, "the first two JobSets")
    for held, n in (("p2", 1), ("p3", 2)):
        kube.apply(namespace, kube.job_doc(held, _spec()))
        wait_for(lambda n=n: _gauge(op, "llmtrain_operator_creates_held") == n, 30, f"{held} held")
    assert all_sets() == {"p0-a1", "p1-a1"}
    assert _gauge(op, "llmtrain_operator_children_untaken") == 2
    assert not kube.job(namespace, "p3").get("status"), "a held job is written nothing"
    taken = {
        "replicatedJobsStatus": [
            {"name": "worker", "ready": 0, "succeeded": 0, "failed": 0, "active": 1, "suspended": 0}
        ]
    }
    _set_jobset_status(kube, namespace, "p0-a1", taken)
    wait_for(lambda: all_sets() == {"p0-a1", "p1-a1", "p2-a1"}, 30, "p2's JobSet, first in line")
    kube.wait_phase(namespace, "p2", "Pending")
    assert _gauge(op, "llmtrain_operator_creates_held") == 1 and not kube.job(namespace, "p3").get("status")
    _set_jobset_status(kube, namespace, "p1-a1", taken)
    wait_for(lambda: "p3-a1" in all_sets(), 30, "p3's JobSet")
    wait_for(lambda: _gauge(op, "llmtrain_operator_creates_held") == 0, 30, "no job held")


def test_a_backend_the_platform_did_not_enable_fails_the_job_naming_the_field(start, kube, namespace):
    start("--backend", "pytorchjob")
    kube.apply(namespace, kube.job_doc("nope", _spec(backend="jobset")))
    status = kube.wait_phase(namespace, "nope", "Failed")
    assert status["reason"] == "InvalidSpec"
    assert "spec.cluster.backend: backend 'jobset' is not enabled on this platform" in status["message"]
    assert not _jobsets(kube, namespace, "nope") and not kube.ptjs(namespace, "nope")


def test_the_api_server_refuses_a_change_of_backend_naming_the_field(kube, namespace):
    kube.apply(namespace, kube.job_doc("fixed", _spec()))
    for patch in ({"backend": "jobset"}, {"backend": "pytorchjob"}):
        with pytest.raises(client.ApiException) as err:
            kube.custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, "fixed", {"spec": {"cluster": patch}}
            )
        assert err.value.status == 422
        assert "spec.cluster.backend is immutable once the job exists" in json.loads(err.value.body)["message"]
    kube.apply(namespace, kube.job_doc("named", _spec(backend="jobset")))
    with pytest.raises(client.ApiException, match=r"spec\.cluster\.backend is immutable"):
        kube.custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "named", {"spec": {"cluster": {"backend": None}}}
        )


def test_a_backend_whose_crd_is_not_installed_fails_the_job_naming_the_crd(dev_cluster, kube, namespace, monkeypatch):
    """The operator's own code path against the real API server, in this process: the JobSet
    backend pointed at a kind nothing serves. Its create is a 404, API discovery confirms the kind
    is not served, and the job is Failed, BackendNotInstalled, naming the CRD and the chart value."""
    import kubernetes
    from prometheus_client import CollectorRegistry

    from llmtrain.backends.jobset import JobSetBackend
    from llmtrain.controller.adapters import kube as opkube
    from llmtrain.controller.adapters.metrics import OperatorMetrics
    from llmtrain.controller.operator import Operator
    from llmtrain.controller.policy.config import OperatorConfig
    from llmtrain.controller.reconciler import Run

    api = kubernetes.config.new_client_from_config(config_file=str(dev_cluster.kubeconfig))
    monkeypatch.setattr(opkube, "_client", lambda: api)
    try:
        assert opkube.served(JOBSET.child)  # installed in every dev cluster
        absent = ApiKind(f"absent-{uuid.uuid4().hex[:6]}.llmtrain.dev", "v1", "nothings", "Nothing")
        assert not opkube.served(absent)
        monkeypatch.setattr(JobSetBackend, "child", absent)
        kube.apply(namespace, kube.job_doc("lost", _spec(backend="jobset")))
        cfg = OperatorConfig(default_etcd_endpoint="etcd.test.svc:2379", backends=("pytorchjob", "jobset"))
        op = Operator(cfg, OperatorMetrics(CollectorRegistry()), kube=opkube)
        Run(op, namespace, "lost", first_sight=False).run(kube.job(namespace, "lost"))
        status = kube.status(namespace, "lost")
        assert (status["phase"], status["reason"]) == ("Failed", "BackendNotInstalled")
        assert f"nothings.{absent.group}" in status["message"] and "backends.enabled" in status["message"]
        assert "spec.cluster.backend is jobset" in status["message"]
    finally:
        api.close()


def _controller(obj: dict, api_version: str, kind: str) -> dict:
    meta = obj["metadata"]
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _indexed_pod(name: str, job: str, owner: dict | None) -> dict:
    """Pod 0 of attempt 1, labelled as the renderer and the Job controller label it, with `owner`
    (a batch Job) as its controller; without, what a tenant could make by hand."""
    meta: dict = {
        "name": name,
        "labels": {
            "llmtrain.dev/job": job,
            "llmtrain.dev/attempt": "1",
            "batch.kubernetes.io/job-completion-index": "0",
        },
    }
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": "pytorch", "image": "x"}]},
    }


def test_only_the_pods_of_the_jobsets_own_job_are_scraped(start, kube, namespace, trainer_endpoint):
    """On the JobSet backend a pod's controller is a batch Job: the operator trusts a pod only
    when its Job's uid is one the JobSet controls. A tenant's pod with rank 0's labels whose
    controller is a Job of the tenant's own and whose name sorts first is never scraped (it
    serves step 7); the pod of the JobSet's own Job is (step 5).
    The light cluster runs no JobSet controller: its Job, pods and status are written as it would
    (the Jobs managed by no controller here, `spec.managedBy`, so the Job controller leaves them)."""
    from kubernetes.client import BatchV1Api

    from llmtrain_devcluster.standins import running_at

    from .test_hostile_tenant import hostile_server

    metrics, port = trainer_endpoint
    metrics.step.set(5)
    import time as _time

    metrics.heartbeat_timestamp_seconds.set(_time.time())
    start("--backend", "jobset")
    kube.apply(namespace, kube.job_doc("own", _spec()))
    js = wait_for(lambda: kube.custom.get_namespaced_custom_object(*JS[:2], namespace, JS[2], "own-a1"), 30, "JobSet")
    batch = BatchV1Api(kube.api)

    def job(name: str, owner: dict | None) -> dict:
        body = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, **({"ownerReferences": [owner]} if owner else {})},
            "spec": {
                "managedBy": "llmtrain.dev/test-stand-in",
                "completionMode": "Indexed",
                "completions": 1,
                "parallelism": 1,
                "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}},
            },
        }
        return batch.create_namespaced_job(namespace, body).to_dict()

    real = job("own-a1-worker-0", _controller(js, "jobset.x-k8s.io/v1alpha2", "JobSet"))
    theirs = job("their-job", None)
    real_ref = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": "own-a1-worker-0",
        "uid": real["metadata"]["uid"],
        "controller": True,
    }
    theirs_ref = {**real_ref, "name": "their-job", "uid": theirs["metadata"]["uid"]}
    # (a reference naming the JobSet's Job with another uid the garbage collector deletes at once)
    kube.core.create_namespaced_pod(namespace, _indexed_pod("aaa-0", "own", theirs_ref))
    kube.core.patch_namespaced_pod_status("aaa-0", namespace, running_at("127.0.0.2"))
    with hostile_server("good", host="127.0.0.2", port=port):  # says step 7
        kube.core.create_namespaced_pod(namespace, _indexed_pod("own-a1-worker-0-0-xxxxx", "own", real_ref))
        kube.core.patch_namespaced_pod_status("own-a1-worker-0-0-xxxxx", namespace, running_at("127.0.0.1"))
        ready = {
            "replicatedJobsStatus": [
                {"name": "worker", "ready": 1, "succeeded": 0, "failed": 0, "active": 1, "suspended": 0}
            ]
        }
        _set_jobset_status(kube, namespace, "own-a1", ready)
        progress = wait_for(lambda: kube.status(namespace, "own").get("progress"), 30, "progress in status")
    assert progress["step"] == 5, progress
