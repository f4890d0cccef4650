"""The chart's admission policies for the job backend, in the real kube-apiserver's own admission
(as test_admission_policies_cluster.py does for the other two): the chart is installed with the
JobSet and job backends enabled, and requests are made as the operator's ServiceAccount, as the
JobSet controller, as the Job controller and as a tenant.

What the job backend adds: the operator's token creates batch Jobs (which the Job controller turns
into pods with its own rights) and Services. The policies hold the Jobs to what the renderer makes
and the Services to the Jobs' headless ones; and in a baseline-efa namespace a Job whose pods carry
llmtrain's label (and so the EFA Pod Security exception) comes from the operator, for an
LLMTrainingJob, or from the JobSet controller, for a JobSet: never from a tenant."""

from __future__ import annotations

import copy
import json
import os
import time
import uuid

import pytest
import yaml
from test_admission_policies_cluster import (
    EFA,
    JOB,
    JOB_CONTROLLER,
    JOBSET_CONTROLLER,
    MANAGED_BY,
    _binding,
    _create,
    _denied,
    _new_namespace,
)

from llmtrain.backends import JOB as JOB_BACKEND
from llmtrain.validation import parse_spec

pytestmark = [pytest.mark.infra]

RELEASE = "llmtrain-jobs"


@pytest.fixture(scope="module")
def setup(helm, dev_cluster):
    """The release (bundled etcd on), a tenant namespace (bob: edit and llmtrain-edit) and a
    baseline-efa one where the Job controller, the JobSet controller and bob may write."""
    c = dev_cluster
    release_ns = f"llmtrain-system-vapj-{os.getpid()}"
    c.kubectl("create", "namespace", release_ns)
    ns = _new_namespace(c)
    efa_ns = _new_namespace(
        c, {"pod-security.kubernetes.io/enforce": "privileged", "llmtrain.dev/pod-security": "baseline-efa"}
    )
    made = [release_ns, ns, efa_ns]
    try:
        helm.run(
            "install",
            RELEASE,
            helm.operator_chart,
            "--namespace",
            release_ns,
            "--set",
            "etcd.enabled=true",
            "--set",
            "backends.enabled={jobset,job}",
            "--set",
            "backends.default=job",
            kubeconfig=c.kubeconfig,
        )
        hf = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf"}, "stringData": {"token": "x"}}
        docs = [{**hf, "metadata": {"name": "hf", "namespace": n}} for n in (ns, efa_ns)]
        docs += [_binding(n, user, "edit") for n in (ns, efa_ns) for user in ("bob", JOB_CONTROLLER, JOBSET_CONTROLLER)]
        docs += [_binding(n, "bob", "llmtrain-edit") for n in (ns, efa_ns)]
        c.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
        sa = json.loads(c.kubectl("get", "deployment", "-n", release_ns, "-o", "json").stdout)["items"][0]
        operator = f"system:serviceaccount:{release_ns}:{sa['spec']['template']['spec']['serviceAccountName']}"
        # Readiness of the policies: the API server picks them up asynchronously; until then a
        # Service with a port would be admitted
        probe = _service("probe", "u")
        probe["spec"]["ports"] = [{"port": 22}]
        deadline = time.monotonic() + 60
        while (r := _create(c, probe, ns, operator)).returncode == 0:
            c.kubectl("delete", "service", "probe", "-n", ns, check=False)
            assert time.monotonic() < deadline, "the admission policies never took effect"
            time.sleep(0.5)
        assert "denied request" in r.stderr, r.stderr
        yield {"ns": ns, "efa_ns": efa_ns, "operator": operator}
    finally:
        helm.run("uninstall", RELEASE, "--namespace", release_ns, kubeconfig=c.kubeconfig, check=False)
        for n in made:
            c.kubectl("delete", "namespace", n, "--wait=false", check=False)


def _owner(c, ns: str) -> str:
    if c.kubectl("get", "llmtj", "owner", "-n", ns, check=False).returncode != 0:
        doc = {"apiVersion": "llmtrain.dev/v1alpha1", "kind": "LLMTrainingJob", "metadata": {"name": "owner"}}
        doc["spec"] = copy.deepcopy(JOB)
        assert _create(c, doc, ns, "bob").returncode == 0
    return json.loads(c.kubectl("get", "llmtj", "owner", "-n", ns, "-o", "json").stdout)["metadata"]["uid"]


def _rendered(c, ns: str, attempt: int, spec_over: dict | None = None, **kw) -> dict:
    raw = copy.deepcopy(JOB)
    raw.pop("suspend")
    for k, v in (spec_over or {}).items():
        raw[k] = {**raw.get(k, {}), **v}
    return JOB_BACKEND.render(parse_spec(raw), "owner", ns, attempt, _owner(c, ns), "etcd.x.svc:2379", **kw)


def _service(name: str, job_uid: str, owner: str | None = None) -> dict:
    """The Service the operator creates beside Job `name` (JobBackend.companions), the Job's uid given."""
    job = {"metadata": {"name": owner or name, "namespace": "x", "uid": job_uid, "labels": {}}}
    (svc,) = JOB_BACKEND.companions(job)
    svc["metadata"]["name"] = name
    del svc["metadata"]["namespace"]
    return svc


def _made(c, ns: str, job: dict, user: str) -> dict:
    r = _create(c, job, ns, user)
    assert r.returncode == 0, r.stderr
    return json.loads(c.kubectl("get", "job", job["metadata"]["name"], "-n", ns, "-o", "json").stdout)


def test_the_operator_may_create_the_jobs_and_services_it_renders(setup, dev_cluster):
    c, ns, op = dev_cluster, setup["ns"], setup["operator"]
    for attempt, over, kw in ((1, {}, {}), (2, EFA, {"rendezvous_credentials": True})):
        job = _rendered(c, ns, attempt, over, **kw)
        job["spec"]["suspend"] = True  # nothing needs to run
        made = _made(c, ns, job, op)
        (svc,) = JOB_BACKEND.companions(made)
        r = _create(c, svc, ns, op)
        assert r.returncode == 0, r.stderr


# What only a batch Job could do besides its pods: retry, run other than one pod per index, hand
# itself to another controller, outlive a failed worker, or choose its own pods.
BAD_JOB = {
    "retries": lambda j: j["spec"].update(backoffLimit=6),
    "not indexed": lambda j: j["spec"].update(completionMode="NonIndexed"),
    "fewer pods than indexes": lambda j: j["spec"].update(parallelism=1, completions=2),
    "another controller": lambda j: j["spec"].update(managedBy="example.com/other"),
    "a pod failure policy": lambda j: j["spec"].update(
        podFailurePolicy={"rules": [{"action": "Ignore", "onExitCodes": {"operator": "In", "values": [1]}}]}
    ),
    "retries per index": lambda j: j["spec"].update(backoffLimitPerIndex=3, maxFailedIndexes=1, backoffLimit=None),
    "a privileged container": lambda j: j["spec"]["template"]["spec"]["containers"][0]["securityContext"].update(
        privileged=True, allowPrivilegeEscalation=True
    ),
    "a hostPath volume": lambda j: j["spec"]["template"]["spec"]["volumes"].append(
        {"name": "host", "hostPath": {"path": "/"}}
    ),
    "another command": lambda j: j["spec"]["template"]["spec"]["containers"][0].update(command=["sh", "-c", "x"]),
    "no owner": lambda j: j["metadata"].pop("ownerReferences"),
}


@pytest.mark.parametrize("what", sorted(BAD_JOB))
def test_the_operators_token_creates_no_other_job(setup, dev_cluster, what):
    c, ns = dev_cluster, setup["ns"]
    job = _rendered(c, ns, 100 + sorted(BAD_JOB).index(what), {"cluster": {"nodes": 2}})
    job["spec"]["suspend"] = True
    BAD_JOB[what](job)
    job["spec"] = {k: v for k, v in job["spec"].items() if v is not None}
    r = _create(c, job, ns, setup["operator"])
    assert _denied(r), f"{what}: {r.stderr or 'admitted'}"


# (each still a valid Service: the API server's own validation would refuse it first otherwise)
BAD_SERVICE = {
    "a load balancer": lambda s: s["spec"].update(type="LoadBalancer", clusterIP=None, ports=[{"port": 80}]),
    "a port": lambda s: s["spec"].update(ports=[{"port": 22}]),
    "an external IP": lambda s: s["spec"].update(externalIPs=["203.0.113.7"], clusterIP=None, ports=[{"port": 80}]),
    "another selector": lambda s: s["spec"].update(selector={"app": "database"}),
    "owned by an LLMTrainingJob": lambda s: s["metadata"]["ownerReferences"][0].update(
        apiVersion="llmtrain.dev/v1alpha1", kind="LLMTrainingJob"
    ),
    "named other than its Job": lambda s: s["metadata"].update(name="kube-dns-look-alike"),
    "no owner": lambda s: s["metadata"].pop("ownerReferences"),
}


@pytest.mark.parametrize("what", sorted(BAD_SERVICE))
def test_the_operators_token_creates_no_other_service(setup, dev_cluster, what):
    c, ns = dev_cluster, setup["ns"]
    svc = _service(f"owner-a{uuid.uuid4().int % 10**6}", str(uuid.uuid4()))
    BAD_SERVICE[what](svc)
    svc["spec"] = {k: v for k, v in svc["spec"].items() if v is not None}
    assert _denied(_create(c, svc, ns, setup["operator"]), "headless"), f"{what}: admitted"


def test_only_the_operator_and_the_jobset_controller_make_jobs_whose_pods_get_the_exception(setup, dev_cluster):
    """In a baseline-efa namespace: the operator's Job of an EFA attempt is admitted, and the real Job
    controller's pods of it get IPC_LOCK; a tenant's copy of it, or one made as the JobSet controller
    but owned by an LLMTrainingJob, is refused, and so is a tenant's pod that names the Job."""
    c, ns, op = dev_cluster, setup["efa_ns"], setup["operator"]
    job = _rendered(c, ns, 1, EFA, rendezvous_credentials=True)
    made = _made(c, ns, job, op)

    def pods(name: str) -> list:
        out = c.kubectl("get", "pods", "-n", ns, "-l", f"job-name={name}", "-o", "json").stdout
        return json.loads(out)["items"]

    def refusal(name: str) -> str:
        selector = f"involvedObject.name={name},reason=FailedCreate"
        out = c.kubectl("get", "events", "-n", ns, "--field-selector", selector, "-o", "json").stdout
        return " ".join(e["message"] for e in json.loads(out)["items"])

    deadline = time.monotonic() + 60
    while not pods(made["metadata"]["name"]):
        assert time.monotonic() < deadline, f"the Job controller made no pod: {refusal(made['metadata']['name'])}"
        time.sleep(0.5)
    pod = pods(made["metadata"]["name"])[0]
    assert pod["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    assert pod["metadata"]["labels"][MANAGED_BY] == "llmtrain-operator"

    copy_of = copy.deepcopy(job)
    copy_of["metadata"]["name"] = "owner-a2"
    for user in ("bob", JOBSET_CONTROLLER):
        r = _create(c, copy_of, ns, user)
        assert _denied(r, "only", "creates Jobs whose pods are labelled"), f"{user}: {r.stderr or 'admitted'}"
    # a tenant's pod dressed as that Job's, by the Job's uid: the exception is the Job controller's only
    fake = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            **copy.deepcopy(job["spec"]["template"]["metadata"]),
            "name": "owner-a1-fake",
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": "owner-a1", "uid": made["metadata"]["uid"]}
                | {"controller": True}
            ],
        },
        "spec": copy.deepcopy(job["spec"]["template"]["spec"]),
    }
    assert _denied(_create(c, fake, ns, "bob"), "baseline"), "admitted"
