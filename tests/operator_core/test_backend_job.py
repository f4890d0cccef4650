"""The job backend without a cluster (llmtrain/backends/job.py): the Indexed Job around the one
shared pod template, its headless Service, the names the Job controller gives pods and the job-name
limit they imply, the Job's state in decide's words, and which batch Jobs are an attempt's. The
Kubernetes facts the expected values come from (Kubernetes 1.31+: the Job controller's pod
hostnames `<job>-<index>`, its `batch.kubernetes.io/*` pod labels, its conditions Complete, Failed,
SuccessCriteriaMet, FailureTarget and Suspended, status.ready) are written out here; the chain test
(tests/chain/test_job_backend_chain.py) holds them against the real Job controller."""

from __future__ import annotations

import copy

import pytest

from llmtrain.backends import JOB, JOBSET, PYTORCHJOB
from llmtrain.controller import rbac
from llmtrain.controller.adapters.owners import PodOwners
from llmtrain.controller.policy.child_status import pod_summary
from llmtrain.controller.policy.snapshot import Child

from .test_backends import _flag, _spec


def _render(backend, spec=None, name="job", attempt=2):
    return backend.render(spec or _spec(), name, "team", attempt, "0123456789abcdef", "etcd.infra:2379")


# --- the render ---------------------------------------------------------------------------------


def test_one_indexed_job_per_attempt_whose_every_restart_is_the_operators():
    job = _render(JOB)
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
    assert job["metadata"]["name"] == "job-a2" and job["metadata"]["namespace"] == "team"
    (owner,) = job["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("LLMTrainingJob", "0123456789abcdef", True)
    spec = job["spec"]
    assert (spec["parallelism"], spec["completions"], spec["completionMode"], spec["backoffLimit"]) == (
        4,
        4,
        "Indexed",
        0,
    )
    assert "suspend" not in spec and "podFailurePolicy" not in spec and "ttlSecondsAfterFinished" not in spec
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    # the pods' DNS names: <job>-<index>.<subdomain>, the subdomain the Service named after the Job
    assert spec["template"]["spec"]["subdomain"] == "job-a2"


def test_the_pod_template_is_the_jobsets_but_for_the_subdomain_and_the_c10d_host():
    """One shared piece: the Job's pod is the JobSet's Job's pod, but for the subdomain (JobSet's
    controller sets it itself) and worker 0's DNS name for c10d."""
    for spec in (_spec(), _spec(rendezvous={"backend": "c10d"}, cluster={"queueName": "q", "minNodes": 2})):
        job = copy.deepcopy(_render(JOB, spec)["spec"]["template"])
        js = copy.deepcopy(_render(JOBSET, spec)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"])
        assert job["spec"].pop("subdomain") == "job-a2" and "subdomain" not in js["spec"]
        (jc,), (sc,) = job["spec"]["containers"], js["spec"]["containers"]
        endpoints = _flag(jc["args"], "rdzv-endpoint"), _flag(sc["args"], "rdzv-endpoint")
        jc["args"] = [a for a in jc["args"] if not a.startswith("--rdzv-endpoint=")]
        sc["args"] = [a for a in sc["args"] if not a.startswith("--rdzv-endpoint=")]
        assert job == js
        if spec.rendezvous.backend == "c10d":
            assert endpoints == ("job-a2-0.job-a2:29400", "job-a2-worker-0-0.job-a2:29400")
        else:
            assert endpoints[0] == endpoints[1] == "etcd.infra:2379"


def test_the_other_backends_pods_have_no_subdomain_of_ours():
    """No behaviour change for the two other backends: their controllers name the pods' DNS."""
    assert "subdomain" not in _render(PYTORCHJOB)["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert "subdomain" not in _render(JOBSET)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def test_under_kueue_the_job_is_created_suspended_with_the_queue_label():
    """Kueue's batch/job integration reads the queue and priority labels off the Job itself."""
    job = _render(JOB, _spec(cluster={"queueName": "team-a", "workloadPriorityClass": "prod"}))
    assert job["spec"]["suspend"] is True
    labels = job["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "team-a" and labels["kueue.x-k8s.io/priority-class"] == "prod"


# --- the Service ----------------------------------------------------------------------------------


def _created(job: dict, uid="job-uid") -> dict:
    """The Job as the API server returns it from the create: its uid set."""
    job = copy.deepcopy(job)
    job["metadata"]["uid"] = uid
    return job


def test_the_headless_service_selects_the_jobs_pods_by_uid_and_is_owned_by_the_job():
    (svc,) = JOB.companions(_created(_render(JOB, _spec(cluster={"queueName": "q"}))))
    assert (svc["apiVersion"], svc["kind"]) == ("v1", "Service")
    assert (svc["metadata"]["name"], svc["metadata"]["namespace"]) == ("job-a2", "team")
    assert svc["spec"] == {
        "clusterIP": "None",
        # the Job controller's label on every pod it makes, with the Job's uid: no other pod
        # (another attempt's, a tenant's labelled like a worker) joins the names of this one
        "selector": {"batch.kubernetes.io/controller-uid": "job-uid"},
        # worker 0 resolves before it is Ready: the c10d store starts in it before readiness
        "publishNotReadyAddresses": True,
    }
    (ref,) = svc["metadata"]["ownerReferences"]
    assert ref == {"apiVersion": "batch/v1", "kind": "Job", "name": "job-a2", "uid": "job-uid", "controller": True}
    labels = svc["metadata"]["labels"]
    assert labels["llmtrain.dev/job"] == "job" and labels["llmtrain.dev/attempt"] == "2"
    assert not [k for k in labels if k.startswith("kueue.x-k8s.io/")]  # Kueue manages the Job only


def test_only_the_job_backend_has_companions_and_they_are_services():
    assert JOB.companion_kinds and all(k.kind == "Service" and k.group == "" for k in JOB.companion_kinds)
    assert not JOBSET.companion_kinds and not PYTORCHJOB.companion_kinds
    assert JOBSET.companions(_created(_render(JOBSET))) == [] and PYTORCHJOB.companions(_render(PYTORCHJOB)) == []


def test_the_job_backends_permissions_are_its_jobs_and_creating_services():
    assert rbac.BACKEND_RULES["job"] == {
        ("batch", "jobs"): frozenset({"get", "list", "watch", "create", "delete"}),
        ("", "services"): frozenset({"create"}),
    }


# --- names ------------------------------------------------------------------------------------


@pytest.mark.parametrize("nodes", [1, 10, 11, 100, 4096])
def test_the_job_name_limit_is_what_the_pods_hostnames_allow(nodes):
    """Pod i's hostname is `<job>-<i>` (a DNS-1123 label: 63), the Job `<name>-a<attempt>`
    (attempts up to 9999); the Service is named like the Job, which the hostnames already bound."""
    limit = 63 - len("-a9999") - len("-") - len(str(nodes - 1))
    assert JOB.max_job_name(nodes) == limit
    assert JOB.name_problem("j" * limit, nodes) is None
    why, accepted = JOB.name_problem("j" * (limit + 1), nodes)
    assert repr("j" * (limit + 1) + f"-a9999-{nodes - 1}") in why and "64 characters" in why
    assert f"≤ {limit}" in accepted and "on job" in accepted


# --- the state --------------------------------------------------------------------------------


def _job(conditions=(), suspend=False, ready=None, succeeded=None, completions=4):
    status = {"conditions": [{"type": t, "status": s, "message": f"{t} says so"} for t, s in conditions]}
    for key, value in (("ready", ready), ("succeeded", succeeded)):
        if value is not None:
            status[key] = value
    return {
        "metadata": {"annotations": {"llmtrain.dev/rendezvous-id": "rid"}},
        "spec": {"completions": completions, "suspend": suspend},
        "status": status,
    }


@pytest.mark.parametrize(
    ("job", "state", "suspended", "failure"),
    [
        (_job(), "Created", False, ""),
        (_job(ready=3), "Created", False, ""),
        (_job(ready=4), "Running", False, ""),
        (_job(ready=2, succeeded=2), "Running", False, ""),
        (_job(ready=True, succeeded=True), "Created", False, ""),  # not counts
        (_job(suspend=True), "Suspended", True, ""),
        # Kueue unsuspended it, the controller has not caught up with its condition yet
        (_job(conditions=[("Suspended", "True")]), "Suspended", False, ""),
        (_job(conditions=[("Suspended", "False")], ready=4), "Running", False, ""),
        # doomed: the remaining pods are being terminated, the next attempt need not wait for them
        (_job(conditions=[("FailureTarget", "True")], ready=3), "Failed", False, "FailureTarget says so"),
        (_job(conditions=[("FailureTarget", "True"), ("Failed", "True")]), "Failed", False, "Failed says so"),
        (_job(conditions=[("SuccessCriteriaMet", "True")]), "Succeeded", False, ""),
        (_job(conditions=[("SuccessCriteriaMet", "True"), ("Complete", "True")], succeeded=4), "Succeeded", False, ""),
        (_job(conditions=[("Failed", "False")], ready=4), "Running", False, ""),
        # Kueue preempts a running Job: suspended again, its pods deleted, not failed
        (_job(conditions=[("Suspended", "True")], suspend=True, ready=4), "Suspended", True, ""),
    ],
)
def test_the_jobs_state_in_decides_words(job, state, suspended, failure):
    got = JOB.state(job)
    assert (got.state, got.suspended, got.failure_message, got.rendezvous_id) == (state, suspended, failure, "rid")


def test_a_new_job_is_not_taken_up_until_its_controller_wrote_a_status():
    assert not JOB.taken_up({"metadata": {}, "spec": {}}) and not JOB.taken_up({"status": {}})
    assert JOB.taken_up({"status": {"active": 2}})


# --- whose ------------------------------------------------------------------------------------


def _ref(api_version, kind):
    return {"apiVersion": api_version, "kind": kind, "name": "x", "uid": "u", "controller": True}


def test_a_jobsets_batch_jobs_are_not_the_job_backends_children():
    """A watch of batch Jobs also sees a JobSet's (labelled with the job and attempt); only a Job
    an LLMTrainingJob controls, or one nobody controls (a hand-made one, judged by uid where it
    matters), is one of the job backend's."""
    jobset_job = {"metadata": {"ownerReferences": [_ref("jobset.x-k8s.io/v1alpha2", "JobSet")]}}
    ours = {"metadata": {"ownerReferences": [_ref("llmtrain.dev/v1alpha1", "LLMTrainingJob")]}}
    cronjob = {"metadata": {"ownerReferences": [_ref("batch/v1", "CronJob")]}}
    assert not JOB.is_child(jobset_job) and not JOB.is_child(cronjob)
    assert JOB.is_child(ours) and JOB.is_child({"metadata": {}})
    # a non-controller reference to another object does not make it someone else's
    shared = {"metadata": {"ownerReferences": [{**_ref("v1", "ConfigMap"), "controller": False}]}}
    assert JOB.is_child(shared)
    assert JOBSET.is_child(jobset_job) and PYTORCHJOB.is_child({"metadata": {}})


def test_a_jobs_pods_are_trusted_by_the_jobs_own_uid_without_a_read():
    class NoReads:
        def get_owner(self, *a):
            raise AssertionError("the Job's pods need no read")

    child = Child("j-a1", 1, owned=True, uid="job-uid")
    assert PodOwners(NoReads()).of(JOB, "ns", child) == {"job-uid"}
    pod = {
        "metadata": {
            "name": "j-a1-0-abcde",
            "labels": {"batch.kubernetes.io/job-completion-index": "0"},
            "ownerReferences": [{**_ref("batch/v1", "Job"), "uid": "job-uid"}],
        },
        "status": {},
    }
    summary = pod_summary(pod)
    assert (summary["owner"], summary["index"]) == ("job-uid", "0")
