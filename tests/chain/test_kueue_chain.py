"""llmtrain jobs under a real Kueue (v0.19, its webhooks called by the API server) on the real
chain: two p5.48xlarge kwok nodes, a ClusterQueue with quota for exactly those (generated from the
instance catalog), a LocalQueue in the test's namespace, the operator as a process. Nothing writes
a PyTorchJob's suspend flag but Kueue.

- two 2-node p5 jobs, quota for one: one Running, the other Pending/Queued in Kueue's own words,
  no restart spent; when the first goes, the second is admitted and runs;
- a high-priority job preempts a running low-priority one: Preempted, no restart spent, the same
  attempt resumes once the quota is free again;
- Kueue's JobSet integration (the second backend's child kind) on the same cluster: a JobSet is
  suspended by Kueue's webhook, admitted, queued behind quota and admitted when it frees."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from llmtrain.spec import GROUP, PLURAL, VERSION
from llmtrain_devcluster.process import free_port
from operator_core.conftest import OperatorProcess
from plugins.needs import needs

from .conftest import PTJ, delete_namespace_and_its_pods, wait_for

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
QUEUE = "team-a"


@pytest.fixture(scope="module")
@needs("cluster")
def kueue_cluster(tmp_path_factory):
    from llmtrain_devcluster import DevCluster

    with DevCluster(
        tmp_path_factory.mktemp("kueue-cluster"), chain=True, kueue=True, nodes={"p5.48xlarge": 2}
    ) as cluster:
        cluster.kubectl(
            "apply",
            "-f",
            "-",
            input=yaml.safe_dump_all(
                [
                    {
                        "apiVersion": "kueue.x-k8s.io/v1beta2",
                        "kind": "WorkloadPriorityClass",
                        "metadata": {"name": name},
                        "value": value,
                        "description": f"{name} jobs",
                    }
                    for name, value in (("research", 100), ("production", 1000))
                ]
            ),
        )
        yield cluster


@pytest.fixture(scope="module")
def kueue_operator(kueue_cluster, tmp_path_factory):
    # both backends enabled, PyTorchJob the default: a job asks for JobSet with spec.cluster.backend
    op = OperatorProcess(
        kueue_cluster.kubeconfig,
        tmp_path_factory.mktemp("kueue-operator") / "operator.log",
        free_port(),
        extra_args=["--backend", "pytorchjob", "--backend", "jobset"],
    )
    op.start()
    yield op
    op.stop()


@pytest.fixture
def api(kueue_cluster):
    with kueue_cluster.api_client() as api:
        yield api


@pytest.fixture
def queue_ns(kueue_cluster, api):
    name = f"k-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": name}})
    wait_for(lambda: core.read_namespaced_service_account("default", name), 60, f"default ServiceAccount in {name}")
    core.create_namespaced_service_account(name, {"metadata": {"name": "llmtrain-trainer"}})
    kueue_cluster.kueue_local_queue(name, QUEUE)
    try:
        yield name
    finally:
        delete_namespace_and_its_pods(core, name, 90)


def p5_job(name: str, priority: str | None = None) -> dict:
    doc = yaml.safe_load((REPO / "examples" / "llama2-7b-p5.yaml").read_text())
    doc["metadata"] = {"name": name}
    doc["spec"]["cluster"]["queueName"] = QUEUE
    if priority:
        doc["spec"]["cluster"]["workloadPriorityClass"] = priority
    return doc


class Jobs:
    def __init__(self, api, ns):
        self.custom, self.core, self.ns = client.CustomObjectsApi(api), client.CoreV1Api(api), ns

    def create(self, doc: dict) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, doc)

    def delete(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)

    def status(self, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name).get("status") or {}

    def wait(self, name: str, phase: str, reason: str | None = None, timeout: float = 90) -> dict:
        def ok():
            s = self.status(name)
            return s.get("phase") == phase and (reason is None or s.get("reason") == reason) and s

        return wait_for(ok, timeout, f"{name} {phase} {reason or ''}")

    def ptj(self, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(*PTJ[:2], self.ns, PTJ[2], name)

    def events(self, name: str) -> list:
        return [e for e in self.core.list_namespaced_event(self.ns).items if e.involved_object.name == name]


def test_quota_for_one_the_second_waits_queued_then_runs(kueue_cluster, kueue_operator, api, queue_ns):
    jobs = Jobs(api, queue_ns)
    jobs.create(p5_job("first"))
    jobs.wait("first", "Running", timeout=120)
    ptj = jobs.ptj("first-a1")
    # Kueue admitted it: unsuspended, its flavor's node label injected (and left alone by the operator)
    assert ptj["spec"]["runPolicy"]["suspend"] is False
    selector = ptj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["nodeSelector"]
    assert selector["node.kubernetes.io/instance-type"] == "p5.48xlarge"

    jobs.create(p5_job("second"))
    jobs.wait("second", "Pending", "Queued")

    # The first Queued write may come before Kueue has evaluated the Workload ("not admitted yet");
    # the operator looks again every 2 s for a new attempt, so Kueue's words follow within seconds.
    def in_kueues_words():
        s = jobs.status("second")
        return s.get("reason") == "Queued" and "insufficient" in (s.get("message") or "") and s

    queued = wait_for(in_kueues_words, 20, "second's status.message in Kueue's words")
    assert "nvidia.com/gpu" in queued["message"], queued["message"]
    assert (queued["attempt"], queued["restarts"]) == (1, 0)
    assert jobs.ptj("second-a1")["spec"]["runPolicy"]["suspend"] is True
    wait_for(
        lambda: any(e.reason == "Queued" and "insufficient" in e.message for e in jobs.events("second")),
        30,
        "a Queued event in Kueue's words",
    )
    rows = {r.split()[0]: r.split() for r in kueue_cluster.kubectl("get", "llmtj", "-n", queue_ns).stdout.splitlines()}
    reason = rows["NAME"].index("REASON")
    assert (rows["first"][1], rows["second"][1], rows["second"][reason]) == ("Running", "Pending", "Queued")

    jobs.delete("first")  # its PyTorchJob and Workload go with it: the quota is free
    running = jobs.wait("second", "Running", timeout=180)
    assert (running["attempt"], running["restarts"]) == (1, 0) and running["admissionTime"]


def test_a_production_job_preempts_a_research_one_which_resumes_without_a_restart(kueue_operator, api, queue_ns):
    jobs = Jobs(api, queue_ns)
    jobs.create(p5_job("research", "research"))
    jobs.wait("research", "Running", timeout=120)
    assert jobs.ptj("research-a1")["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "research"

    jobs.create(p5_job("urgent", "production"))
    preempted = jobs.wait("research", "Pending", "Preempted", timeout=120)
    assert (preempted["attempt"], preempted["restarts"]) == (1, 0)
    wait_for(
        lambda: any(
            e.reason == "Preempted" and e.type == "Warning" and "Preempted" in e.message
            for e in jobs.events("research")
        ),
        30,
        "a Preempted event in Kueue's words",
    )
    jobs.wait("urgent", "Running", timeout=180)

    jobs.delete("urgent")
    back = jobs.wait("research", "Running", timeout=180)
    # the same attempt, the same PyTorchJob (the same Workload), no restart spent
    assert (back["attempt"], back["restarts"], back["child"]) == (1, 0, "research-a1")


def test_a_missing_queue_or_priority_class_is_said_with_the_field(kueue_operator, api, queue_ns):
    jobs = Jobs(api, queue_ns)
    no_queue = p5_job("no-queue")
    no_queue["spec"]["cluster"]["queueName"] = "nope"
    jobs.create(no_queue)
    jobs.create(p5_job("no-class", "no-such-class"))
    wait_for(
        lambda: "LocalQueue nope doesn't exist" in (jobs.status("no-queue").get("message") or ""),
        90,
        "Kueue's words for a LocalQueue that does not exist",
    )
    status = jobs.status("no-queue")
    assert (status["phase"], status["reason"], status["restarts"]) == ("Pending", "Queued", 0)
    assert "spec.cluster.queueName" in status["message"]
    status = jobs.wait("no-class", "Pending", "Queued")
    assert "spec.cluster.workloadPriorityClass 'no-such-class'" in status["message"], status["message"]


def test_a_failed_attempt_is_a_new_workload_admitted_again_with_free_quota(kueue_operator, api, queue_ns):
    """Restart under Kueue: attempt 2 is a new PyTorchJob, so a new Workload; with the quota free
    (attempt 1's Workload finished) Kueue admits it and it runs. Prints the time from the pod
    failure to attempt 2 Running (the issue's target: < 10 s of control-plane time)."""
    import time

    from .conftest import Chain

    jobs = Jobs(api, queue_ns)
    doc = p5_job("flaky")
    doc["spec"]["resilience"].update(restartBackoffSeconds=0)  # the operator's floor: 1 s here
    jobs.create(doc)
    jobs.wait("flaky", "Running", timeout=120)
    chain = Chain(api)
    pod = chain.wait_pods_running(queue_ns, "training.kubeflow.org/job-name=flaky-a1", 2)[0]
    t0 = time.monotonic()
    chain.fail_pod(queue_ns, pod.metadata.name)
    running = wait_for(
        lambda: (s := jobs.status("flaky")).get("phase") == "Running" and s.get("attempt") == 2 and s,
        120,
        "attempt 2 Running",
    )
    seconds = time.monotonic() - t0
    print(f"\nkueue restart: pod failure -> attempt 2 Running in {seconds:.1f} s")
    assert running["restarts"] == 1 and running["admissionTime"]
    assert jobs.ptj("flaky-a2")["spec"]["runPolicy"]["suspend"] is False  # admitted by Kueue
    assert any(e.reason == "Queued" or e.reason == "Admitted" for e in jobs.events("flaky"))


def _queued_jobset(name: str, pods: int, queue: str = QUEUE) -> dict:
    """A JobSet of ``pods`` training pods, each a whole p5's GPUs, for LocalQueue ``queue``; created
    unsuspended, as a user who trusts Kueue to suspend it would."""
    from llmtrain.render import JOB_LABEL
    from llmtrain_devcluster.jobset import JOBSET

    pod = {
        "metadata": {"labels": {JOB_LABEL: name}},  # a training pod: kwok leaves it Running
        "spec": {
            "restartPolicy": "Never",
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}},
                }
            ],
        },
    }
    return {
        "apiVersion": f"{JOBSET[0]}/{JOBSET[1]}",
        "kind": "JobSet",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": queue}},
        "spec": {
            "failurePolicy": {"maxRestarts": 0},
            "replicatedJobs": [
                {
                    "name": "node",
                    "replicas": 1,
                    "template": {
                        "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0, "template": pod}
                    },
                }
            ],
        },
    }


def test_kueue_queues_and_admits_jobsets_through_its_jobset_integration(kueue_cluster, api, queue_ns):
    from llmtrain_devcluster.jobset import JOBSET, JOBSET_NAME_LABEL

    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)

    def create(doc: dict) -> dict:
        return custom.create_namespaced_custom_object(JOBSET[0], JOBSET[1], queue_ns, JOBSET[2], doc)

    def running_pods(name: str) -> list:
        pods = core.list_namespaced_pod(queue_ns, label_selector=f"{JOBSET_NAME_LABEL}={name}").items
        return [p for p in pods if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]

    def workload(name: str) -> dict | None:
        items = custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", queue_ns, "workloads")["items"]
        owned = [
            w
            for w in items
            if any(o["kind"] == "JobSet" and o["name"] == name for o in w["metadata"].get("ownerReferences") or [])
        ]
        return owned[0] if owned else None

    # Kueue's validating webhook for JobSets: a queue name that cannot name a LocalQueue.
    with pytest.raises(client.ApiException) as e:
        create(_queued_jobset("bad", 1, queue="Not_A_Queue"))
    assert e.value.status == 403 and "denied the request" in e.value.body, e.value.body
    assert "kueue.x-k8s.io/queue-name" in e.value.body, e.value.body

    # Its mutating webhook suspends a queued JobSet at creation; admission unsuspends it.
    made = create(_queued_jobset("whole", 2))
    assert made["spec"]["suspend"] is True
    pods = wait_for(lambda: len(running_pods("whole")) == 2 and running_pods("whole"), 120, "whole's 2 pods Running")
    assert {p.spec.node_selector.get("node.kubernetes.io/instance-type") for p in pods} == {"p5.48xlarge"}

    # The quota is spent: the next one waits, suspended, its Workload without a reservation.
    create(_queued_jobset("next", 1))

    def waiting():
        w = workload("next")
        conds = {c["type"]: c for c in ((w or {}).get("status") or {}).get("conditions") or []}
        q = conds.get("QuotaReserved")
        return q is not None and q["status"] == "False" and "insufficient" in q["message"] and q

    wait_for(waiting, 60, "next's Workload without quota, in Kueue's words")
    js = custom.get_namespaced_custom_object(JOBSET[0], JOBSET[1], queue_ns, JOBSET[2], "next")
    assert (
        js["spec"]["suspend"] is True
        and not core.list_namespaced_pod(queue_ns, label_selector=f"{JOBSET_NAME_LABEL}=next").items
    )

    custom.delete_namespaced_custom_object(
        JOBSET[0], JOBSET[1], queue_ns, JOBSET[2], "whole", propagation_policy="Foreground"
    )
    wait_for(lambda: len(running_pods("next")) == 1, 180, "next admitted and its pod Running once the quota is free")


def test_jobset_jobs_queue_in_kueue_and_the_admitted_one_runs_to_succeeded(kueue_operator, api, queue_ns):
    """The JobSet backend under Kueue (its jobset.x-k8s.io/jobset integration): the operator creates
    each attempt's JobSet suspended with the queue label; with quota for one 2-node job, the first is
    admitted and runs, the second waits Queued in Kueue's words with no restart spent and its JobSet
    suspended; when the first goes, Kueue admits the second, which runs and, its pods done, succeeds."""
    from llmtrain.backends.jobset import JOBSET_NAME_LABEL
    from llmtrain_devcluster.chain import COMPLETE_POD_LABEL
    from llmtrain_devcluster.jobset import JOBSET

    from .conftest import Chain

    jobs, chain = Jobs(api, queue_ns), Chain(api)

    def jobset(name: str) -> dict:
        return jobs.custom.get_namespaced_custom_object(JOBSET[0], JOBSET[1], queue_ns, JOBSET[2], name)

    for name in ("js-first", "js-second"):
        doc = p5_job(name)
        doc["spec"]["cluster"]["backend"] = "jobset"
        jobs.create(doc)
    first = jobs.wait("js-first", "Running", timeout=150)
    assert (first["backend"], first["child"], first["admissionTime"] is not None) == ("jobset", "js-first-a1", True)
    admitted = jobset("js-first-a1")
    assert admitted["spec"]["suspend"] is False and admitted["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == QUEUE
    # created suspended by the operator, unsuspended by Kueue alone: the flag is no longer the creator's
    fields = [m for m in admitted["metadata"]["managedFields"] if not m.get("subresource")]
    creator = {m["manager"] for m in fields if m["operation"] == "Create"}
    suspend_writers = {
        m["manager"] for m in fields if "f:suspend" in json.dumps((m.get("fieldsV1") or {}).get("f:spec", {}))
    }
    assert suspend_writers and not suspend_writers & creator, (creator, suspend_writers)

    def in_kueues_words():
        s = jobs.status("js-second")
        return s.get("reason") == "Queued" and "insufficient" in (s.get("message") or "") and s

    queued = wait_for(in_kueues_words, 60, "js-second queued in Kueue's words")
    assert (queued["phase"], queued["attempt"], queued["restarts"]) == ("Pending", 1, 0)
    assert jobset("js-second-a1")["spec"]["suspend"] is True
    assert not chain.pods(queue_ns, f"{JOBSET_NAME_LABEL}=js-second-a1")

    jobs.delete("js-first")  # its JobSet and Workload go with it: the quota is free
    running = jobs.wait("js-second", "Running", timeout=180)
    assert (running["attempt"], running["restarts"]) == (1, 0) and running["admissionTime"]
    pods = chain.wait_pods_running(queue_ns, f"{JOBSET_NAME_LABEL}=js-second-a1", 2, 120)
    for p in pods:
        chain.core.patch_namespaced_pod(
            p.metadata.name, queue_ns, {"metadata": {"labels": {COMPLETE_POD_LABEL: "true"}}}
        )
    done = jobs.wait("js-second", "Succeeded", timeout=120)
    assert (done["attempt"], done["restarts"]) == (1, 0)
