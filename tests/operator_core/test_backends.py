"""The backend seam without a cluster (llmtrain/backends): the JobSet render around the one shared
pod template, the names JobSet gives an attempt's objects and the job-name limit they imply, the
child's state in decide's words, which pods are trusted, and how a job's backend is chosen. The
JobSet facts the expected values come from are JobSet v0.12.0's (its controller's GenJobName /
GenPodName and webhook checks, its conditions and replicatedJobsStatus), written out here."""

from __future__ import annotations

import copy
import json

import pytest

from llmtrain import backends
from llmtrain.backends import JOBSET, PYTORCHJOB, choose
from llmtrain.controller.adapters.owners import PodOwners, trusted
from llmtrain.controller.policy.snapshot import Child
from llmtrain.validation import InvalidJob, parse_spec, validate

from .decide_world import jobset_status


def _spec(**over):
    raw = {
        "model": {"preset": "llama2-7b"},
        "data": {"uri": "s3://b/tokens/", "seqLen": 4096},
        "cluster": {"instanceType": "p5.48xlarge", "nodes": 4},
        "training": {"globalBatchTokens": 4096 * 32 * 4},
    }
    for k, v in over.items():
        raw[k] = {**raw.get(k, {}), **v}
    return parse_spec(raw)


def _render(backend, spec=None, name="job", attempt=2, **kw):
    kw.setdefault("default_etcd_endpoint", "etcd.infra:2379")
    return backend.render(spec or _spec(), name, "team", attempt, "0123456789abcdef", **kw)


def _pod(obj):
    if obj["kind"] == "JobSet":
        return obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    return obj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]


def _flag(args, name):
    return next(a.split("=", 1)[1] for a in args if a.startswith(f"--{name}="))


# --- the JobSet render ------------------------------------------------------------------------


def test_one_jobset_per_attempt_whose_every_restart_is_the_operators():
    js = _render(JOBSET)
    assert (js["apiVersion"], js["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    assert js["metadata"]["name"] == "job-a2" and js["metadata"]["namespace"] == "team"
    (owner,) = js["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("LLMTrainingJob", "0123456789abcdef", True)
    spec = js["spec"]
    assert spec["failurePolicy"] == {"maxRestarts": 0} and spec["successPolicy"] == {"operator": "All"}
    assert spec["network"] == {"enableDNSHostnames": True, "publishNotReadyAddresses": True}
    assert "suspend" not in spec and "managedBy" not in spec
    (rjob,) = spec["replicatedJobs"]
    assert (rjob["name"], rjob["replicas"]) == ("worker", 1)
    job = rjob["template"]["spec"]
    assert (job["parallelism"], job["completions"], job["completionMode"], job["backoffLimit"]) == (4, 4, "Indexed", 0)
    assert job["template"]["spec"]["restartPolicy"] == "Never"


def test_the_pod_template_is_the_one_the_pytorchjob_carries():
    """One shared piece: the JobSet's pod is the PyTorchJob's, but for what the training-operator
    set on its own (restartPolicy, PYTHONUNBUFFERED) and worker 0's DNS name for c10d."""
    for spec in (_spec(), _spec(rendezvous={"backend": "c10d"}, cluster={"queueName": "q", "minNodes": 2})):
        js, ptj = _pod(_render(JOBSET, spec)), _pod(_render(PYTORCHJOB, spec))
        js, ptj = copy.deepcopy(js), copy.deepcopy(ptj)
        assert js["spec"].pop("restartPolicy") == "Never" and "restartPolicy" not in ptj["spec"]
        (jc,), (pc,) = js["spec"]["containers"], ptj["spec"]["containers"]
        assert {"name": "PYTHONUNBUFFERED", "value": "1"} in jc["env"]
        jc["env"].remove({"name": "PYTHONUNBUFFERED", "value": "1"})
        endpoints = _flag(jc["args"], "rdzv-endpoint"), _flag(pc["args"], "rdzv-endpoint")
        jc["args"] = [a for a in jc["args"] if not a.startswith("--rdzv-endpoint=")]
        pc["args"] = [a for a in pc["args"] if not a.startswith("--rdzv-endpoint=")]
        assert js == ptj
        if spec.rendezvous.backend == "c10d":
            # JobSet: pod 0 of Job <jobset>-worker-0 in the headless Service named after the JobSet
            assert endpoints == ("job-a2-worker-0-0.job-a2:29400", "job-a2-worker-0:29400")
        else:  # etcd rendezvous does not change with the backend
            assert endpoints[0] == endpoints[1] == "etcd.infra:2379"


def test_torchrun_gets_node_count_and_rendezvous_from_its_arguments_not_the_environment():
    """The training-operator injected PET_NNODES, PET_RDZV_* and PET_NPROC_PER_NODE; nothing
    injects them under JobSet, so the arguments must say it all (an elastic rendezvous gives the
    node rank): the node range, processes per node, backend, endpoint and a per-attempt id."""
    js = _render(JOBSET, _spec(cluster={"minNodes": 2}))
    (c,) = _pod(js)["spec"]["containers"]
    assert not [e for e in c["env"] if e["name"].startswith("PET_") or e["name"] in ("RANK", "MASTER_ADDR")]
    assert _flag(c["args"], "nnodes") == "2:4" and _flag(c["args"], "nproc-per-node") == "8"
    assert _flag(c["args"], "rdzv-backend") == "etcd-v2" and _flag(c["args"], "rdzv-endpoint") == "etcd.infra:2379"
    assert _flag(c["args"], "rdzv-id") == js["metadata"]["annotations"]["llmtrain.dev/rendezvous-id"]
    assert c["args"][-2:] == ["-m", "llmtrain_trainer"]


def test_under_kueue_the_jobset_is_created_suspended_with_the_queue_label_its_jobs_without():
    js = _render(JOBSET, _spec(cluster={"queueName": "team-a", "workloadPriorityClass": "prod"}))
    assert js["spec"]["suspend"] is True
    labels = js["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "team-a" and labels["kueue.x-k8s.io/priority-class"] == "prod"
    # the Job is the JobSet's part, not a second Workload for Kueue
    job_labels = js["spec"]["replicatedJobs"][0]["template"]["metadata"]["labels"]
    assert not [k for k in job_labels if k.startswith("kueue.x-k8s.io/")]
    assert job_labels["llmtrain.dev/job"] == "job" and job_labels["llmtrain.dev/attempt"] == "2"


def test_topology_annotations_reach_the_jobsets_pod_template():
    js = _render(
        JOBSET, _spec(cluster={"queueName": "q", "topology": {"mode": "required", "level": "kubernetes.io/hostname"}})
    )
    assert _pod(js)["metadata"]["annotations"]["kueue.x-k8s.io/podset-required-topology"] == "kubernetes.io/hostname"


def test_the_jobset_skeleton_is_parsed_once_per_shape_and_equals_parsing_the_whole_yaml(monkeypatch):
    """The operator's CPU per job: the JobSet template is parsed as YAML once per shape (as the
    PyTorchJob's), and the cheap path builds exactly what parsing the whole text would."""
    import llmtrain.render as render

    render._skeleton.cache_clear()
    for n in ("j-1", "j-2", "j-3"):
        _render(JOBSET, name=n)
    assert render._skeleton.cache_info()[:2] == (2, 1)  # (hits, misses)
    plain = render._template
    for spec in (_spec(), _spec(cluster={"queueName": "q", "env": {"A": 'x"\n  injected: true'}})):
        got = _render(JOBSET, spec)
        with monkeypatch.context() as m:
            m.setattr(render, "_template", lambda name: plain(name, slots=False))
            want = _render(JOBSET, spec)
        assert json.dumps(got) == json.dumps(want)


# --- names ------------------------------------------------------------------------------------


@pytest.mark.parametrize("nodes", [1, 10, 11, 100, 101, 4096])
def test_the_job_name_limit_is_what_jobsets_pod_names_allow(nodes):
    """JobSet names Job `<jobset>-<rjob>-<jobIndex>` and its pods `<job>-<podIndex>-<5 random>`,
    and its webhook refuses a JobSet whose longest pod name is no DNS-1035 label (63). Here the
    JobSet is `<job>-a<attempt>` (attempts up to 9999), the replicated Job `worker`, one Job."""
    fixed = len("-a9999") + len("-worker-0-") + len(str(nodes - 1)) + len("-abcde")
    limit = 63 - fixed
    assert JOBSET.max_job_name(nodes) == limit
    assert JOBSET.name_problem("j" * limit, nodes) is None
    why, accepted = JOBSET.name_problem("j" * (limit + 1), nodes)
    pod = "j" * (limit + 1) + f"-a9999-worker-0-{nodes - 1}-abcde"
    assert repr(pod) in why and "64 characters" in why and f"≤ {limit}" in accepted


def test_a_name_too_long_for_its_backend_is_a_clear_error_naming_the_field():
    raw = {"model": {"preset": "tiny"}, "cluster": {"instanceType": "cpu", "nodes": 1}}
    name = "n" * 41  # fine for PyTorchJobs (45), too long for JobSet's pod names (40)
    validate(raw, name, "etcd:2379", backend="pytorchjob")
    with pytest.raises(InvalidJob) as err:
        validate(raw, name, "etcd:2379", backend="jobset")
    (p,) = err.value.problems
    assert p.field == "metadata.name" and "backend jobset" in p.reason and "≤ 40" in p.accepted
    with pytest.raises(InvalidJob, match=r"metadata\.name"):
        validate({**raw, "cluster": {**raw["cluster"], "backend": "jobset"}}, name, "etcd:2379")


def test_a_backend_the_platform_did_not_enable_is_a_clear_error_naming_the_field():
    raw = {"model": {"preset": "tiny"}, "cluster": {"instanceType": "cpu", "backend": "jobset"}}
    with pytest.raises(InvalidJob) as err:
        validate(raw, "j", "etcd:2379", backend="jobset", enabled=("pytorchjob",))
    (p,) = err.value.problems
    assert p.field == "spec.cluster.backend" and "'jobset'" in p.reason and "not enabled" in p.reason
    assert "backends.enabled" in p.accepted and "JobSet" in p.accepted
    # the default chosen for a job that names none is refused the same way, and says it was the default
    with pytest.raises(InvalidJob, match="the default chosen for the job"):
        validate(
            {**raw, "cluster": {"instanceType": "cpu"}}, "j", "etcd:2379", backend="jobset", enabled=("pytorchjob",)
        )
    validate(raw, "j", "etcd:2379", backend="jobset", enabled=("pytorchjob", "jobset"))


def test_an_unknown_backend_is_refused_naming_the_field_and_the_choices():
    with pytest.raises(InvalidJob) as err:
        validate({"model": {"preset": "tiny"}, "cluster": {"instanceType": "cpu", "backend": "trainjob"}}, "j", "e:1")
    (p,) = err.value.problems
    assert (p.field, p.accepted) == ("spec.cluster.backend", "pytorchjob | jobset | job") and "trainjob" in p.reason


# --- state ------------------------------------------------------------------------------------


def _js(state, *, suspended=False, message=""):
    obj = {"spec": {"replicatedJobs": [{"name": "worker", "replicas": 1}]}, "status": jobset_status(state, message)}
    if suspended:
        obj["spec"]["suspend"] = True
    return obj


def test_the_jobset_state_in_decides_words():
    assert JOBSET.state(_js(None)).state == "Created"  # just created: no status yet
    assert JOBSET.state(_js("Created")).state == "Created"  # Jobs active, pods not all ready
    assert JOBSET.state(_js("Running")).state == "Running"  # every Job ready
    done = JOBSET.state(_js("Succeeded"))
    assert (done.state, done.failure_message) == ("Succeeded", "")
    failed = JOBSET.state(_js("Failed", message="jobset failed due to reaching max number of restarts"))
    assert (failed.state, failed.failure_message) == ("Failed", "jobset failed due to reaching max number of restarts")
    queued = JOBSET.state(_js(None, suspended=True))
    assert (queued.state, queued.suspended) == ("Suspended", True)
    # preempted: Kueue set suspend while the pods still counted ready
    assert JOBSET.state(_js("Running", suspended=True)).suspended is True
    # hostile or broken counters never read as Running
    bad = _js("Running")
    bad["status"]["replicatedJobsStatus"][0]["ready"] = "1"
    assert JOBSET.state(bad).state == "Created"


# --- which pods are the attempt's ---------------------------------------------------------------


class _Kube:
    def __init__(self, jobs):
        self.jobs, self.reads = jobs, []

    def get_owner(self, kind, namespace, name):
        self.reads.append((kind.kind, namespace, name))
        return copy.deepcopy(self.jobs.get(name))


def _job(name, uid, controller):
    return {"metadata": {"name": name, "uid": uid, "ownerReferences": [{"uid": controller, "controller": True}]}}


def test_a_jobsets_pods_are_trusted_through_its_job_read_once_and_by_uid():
    child = Child("j-a1", 1, owned=True, uid="js-uid")
    kube = _Kube({"j-a1-worker-0": _job("j-a1-worker-0", "job-uid", "js-uid")})
    owners = PodOwners(kube)
    assert owners.cached(JOBSET, "ns", child) is None
    assert owners.of(JOBSET, "ns", child) == {"job-uid"}
    assert owners.of(JOBSET, "ns", child) == {"job-uid"} and len(kube.reads) == 1  # kept per JobSet
    pods = [
        {"name": "j-a1-worker-0-0-abcde", "owner": "job-uid"},
        {"name": "forged", "owner": "a-job-of-their-own"},  # labelled like a worker by a tenant
        {"name": "bare", "owner": None},
    ]
    assert [p["name"] for p in trusted(pods, owners.of(JOBSET, "ns", child))] == ["j-a1-worker-0-0-abcde"]
    # a Job of that name the JobSet does not control (someone else's) makes no pod trusted
    other = PodOwners(_Kube({"j-a1-worker-0": _job("j-a1-worker-0", "job-uid", "someone-else")}))
    assert other.of(JOBSET, "ns", child) == frozenset()
    # no Job yet: nothing trusted, nothing remembered (read again next time)
    empty = _Kube({})
    not_yet = PodOwners(empty)
    assert not_yet.of(JOBSET, "ns", child) == frozenset() and not_yet.of(JOBSET, "ns", child) == frozenset()
    assert len(empty.reads) == 2


def test_a_pytorchjobs_pods_are_trusted_by_its_own_uid_without_a_read():
    kube = _Kube({})
    child = Child("j-a1", 1, owned=True, uid="ptj-uid")
    assert PodOwners(kube).of(PYTORCHJOB, "ns", child) == {"ptj-uid"} and kube.reads == []


def test_pod_summaries_know_both_backends_controllers_and_rank_labels():
    from llmtrain.controller.policy.child_status import pod_summary

    def pod(owner_kind, api_version, labels):
        ref = {"apiVersion": api_version, "kind": owner_kind, "uid": "u", "controller": True}
        return {"metadata": {"name": "p", "labels": labels, "ownerReferences": [ref]}, "status": {}}

    ptj = pod_summary(pod("PyTorchJob", "kubeflow.org/v1", {"training.kubeflow.org/replica-index": "0"}))
    js = pod_summary(pod("Job", "batch/v1", {"batch.kubernetes.io/job-completion-index": "0"}))
    assert (ptj["owner"], ptj["index"]) == ("u", "0") and (js["owner"], js["index"]) == ("u", "0")
    assert pod_summary(pod("ReplicaSet", "apps/v1", {}))["owner"] is None


# --- the choice -------------------------------------------------------------------------------


def test_a_jobs_backend_is_decided_once():
    ns_defaults = {"team-a": "jobset"}
    # a new job: its own choice, else its namespace's default, else the platform's
    assert choose(None, False, "pytorchjob", "team-a", "jobset", ns_defaults) == "pytorchjob"
    assert choose(None, False, None, "team-a", "pytorchjob", ns_defaults) == "jobset"
    assert choose(None, False, None, "team-b", "pytorchjob", ns_defaults) == "pytorchjob"
    # once recorded in status.backend, no default moves it
    assert choose("pytorchjob", True, None, "team-a", "jobset", ns_defaults) == "pytorchjob"
    # a job an operator without backends started (a phase, no status.backend) runs PyTorchJobs
    assert choose(None, True, None, "team-a", "jobset", ns_defaults) == "pytorchjob"


def test_every_backend_module_is_named_in_the_spec():
    from llmtrain.spec import BACKENDS, DEFAULT_BACKEND

    assert tuple(backends.BACKENDS) == BACKENDS and DEFAULT_BACKEND in BACKENDS
    for name, b in backends.BACKENDS.items():
        assert b.name == name and b.kueue_framework.endswith("/" + b.child.kind.lower())


def test_the_cli_renders_the_backend_the_job_or_the_platform_chooses(tmp_path, capsys):
    import yaml

    from llmtrain.cli import main

    doc = {
        "apiVersion": "llmtrain.dev/v1alpha1",
        "kind": "LLMTrainingJob",
        "metadata": {"name": "j"},
        "spec": {"model": {"preset": "tiny"}, "cluster": {"instanceType": "cpu"}},
    }
    path = tmp_path / "j.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["render", str(path)]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["kind"] == "PyTorchJob"
    assert main(["render", str(path), "--backend", "jobset"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["kind"] == "JobSet"
    doc["spec"]["cluster"]["backend"] = "jobset"
    path.write_text(yaml.safe_dump(doc))
    assert main(["render", str(path), "--backend", "pytorchjob"]) == 0  # the job's own choice wins
    assert yaml.safe_load(capsys.readouterr().out)["kind"] == "JobSet"
