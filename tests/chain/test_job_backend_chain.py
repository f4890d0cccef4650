"""An LLMTrainingJob on the job backend on the real chain: the operator as a process, the real Job
controller (kube-controller-manager), the endpoint-slice controller, kube-scheduler and kwok's p5
nodes. Nothing here writes a Job's, Service's or pod's status by hand: the Job controller makes the
indexed pods, the scheduler binds them, kwok runs (and, asked, fails or completes) them.

attempt 1 runs (its Job Running once every index is ready; the pods' hostnames `<job>-<i>` in the
subdomain of the headless Service the operator made, which publishes them before they are Ready;
rank 0 found by completion index and scraped through the pods' owner, the Job) → a worker fails on
its node (the Job fails at backoffLimit 0) → attempt 2, the node blamed from the pod watch, attempt
1's Job deleted and its Service with it (the garbage collector: the Service is the Job's) → the
pods complete → Succeeded. And the job-name limit the operator enforces is exactly where the pods'
hostnames stop being valid."""

from __future__ import annotations

import copy
import time

import pytest
from kubernetes import client

from llmtrain.backends import JOB
from llmtrain.backends.job import COMPLETION_INDEX_LABEL, CONTROLLER_UID_LABEL
from llmtrain.pod_contract import child_name
from llmtrain.spec import GROUP, PLURAL, VERSION
from llmtrain.validation import parse_spec
from llmtrain_devcluster.chain import COMPLETE_POD_LABEL
from operator_core.conftest import OperatorProcess

from .conftest import p5_job_doc, wait_for

pytestmark = [pytest.mark.slow]  # `cluster` comes from the fixtures (tests/plugins/needs.py)


@pytest.fixture(scope="module")
def job_operator(chain_cluster, trainer_endpoint, tmp_path_factory):
    op = OperatorProcess(
        chain_cluster.kubeconfig,
        tmp_path_factory.mktemp("job-operator") / "operator.log",
        trainer_endpoint[1],
        extra_args=["--backend", "jobset", "--backend", "job", "--default-backend", "job"],
    )
    op.start()
    yield op
    op.stop()


def test_a_job_backend_job_runs_fails_over_and_succeeds_on_the_chain(chain, chain_ns, job_operator, trainer_endpoint):
    metrics, _ = trainer_endpoint
    name = "bj-7b"
    doc = p5_job_doc(name)
    chain.core.create_namespaced_service_account(
        chain_ns, {"metadata": {"name": doc["spec"]["cluster"]["serviceAccountName"]}}
    )
    chain.custom.create_namespaced_custom_object(GROUP, VERSION, chain_ns, PLURAL, doc)
    nodes, by_type = doc["spec"]["cluster"]["nodes"], chain.nodes_by_type()
    batch = client.BatchV1Api(chain.core.api_client)
    discovery = client.DiscoveryV1Api(chain.core.api_client)
    log = f"(log: {job_operator.log_path})"

    def status():
        return chain.custom.get_namespaced_custom_object(GROUP, VERSION, chain_ns, PLURAL, name).get("status") or {}

    # --- attempt 1: a Job of 2 indexed pods on the p5 nodes, its Service, Running ----------------------
    a1 = child_name(name, 1)
    pods = chain.wait_pods_running(chain_ns, f"job-name={a1}", nodes, 120)
    assert {by_type[p.spec.node_name] for p in pods} == {"p5.48xlarge"}
    assert sorted(p.spec.hostname for p in pods) == [f"{a1}-0", f"{a1}-1"]
    assert {p.spec.subdomain for p in pods} == {a1}
    job = batch.read_namespaced_job(a1, chain_ns)
    assert (job.spec.backoff_limit, job.spec.completion_mode, job.spec.parallelism) == (0, "Indexed", nodes)
    assert [(r.kind, r.controller) for r in job.metadata.owner_references] == [("LLMTrainingJob", True)]
    svc = chain.core.read_namespaced_service(a1, chain_ns)
    assert svc.spec.cluster_ip == "None" and svc.spec.publish_not_ready_addresses is True
    assert svc.spec.selector == {CONTROLLER_UID_LABEL: job.metadata.uid}
    assert [(r.kind, r.name, r.uid) for r in svc.metadata.owner_references] == [("Job", a1, job.metadata.uid)]

    # both pods are in the Service's endpoints under their hostnames (what DNS serves as
    # <hostname>.<subdomain>: worker 0's is the c10d host)
    def endpoint_hostnames():
        slices = discovery.list_namespaced_endpoint_slice(chain_ns, label_selector=f"kubernetes.io/service-name={a1}")
        return sorted(e.hostname for s in slices.items for e in s.endpoints or [])

    wait_for(lambda: endpoint_hostnames() == [f"{a1}-0", f"{a1}-1"], 60, f"{a1}'s endpoints")
    assert JOB.c10d_host(a1) == f"{a1}-0.{a1}"

    st = wait_for(lambda: (s := status()).get("phase") == "Running" and s, 90, f"{name} Running {log}")
    assert (st["backend"], st["child"], st["attempt"]) == ("job", a1, 1)
    assert st["message"] == f"Job {a1} is Running"

    # rank 0 is completion index 0; the operator scrapes it, having trusted the pod by its Job's uid
    (rank0,) = [p for p in pods if p.metadata.labels.get(COMPLETION_INDEX_LABEL) == "0"]
    metrics.step.set(12)
    metrics.heartbeat_timestamp_seconds.set(time.time())
    chain.serve_pod_here(chain_ns, rank0.metadata.name)
    wait_for(lambda: (status().get("progress") or {}).get("step") == 12, 30, f"status.progress.step from rank 0 {log}")

    # --- a worker fails on its node: the Job fails (backoffLimit 0) --------------------------------
    victim = next(p for p in pods if p.metadata.labels.get(COMPLETION_INDEX_LABEL) == "1")
    chain.fail_pod_and_watch(chain_ns, victim.metadata.name, exit_code=137)
    st = wait_for(lambda: (s := status()).get("attempt") == 2 and s, 90, f"{name} attempt 2 {log}")
    assert st["restarts"] == 1 and st["reason"] == "Failed"
    assert [b["node"] for b in st.get("badNodes") or []] == [victim.spec.node_name], st.get("badNodes")
    a2 = child_name(name, 2)
    pods2 = chain.wait_pods_running(chain_ns, f"job-name={a2}", nodes, 120)
    assert {p.spec.subdomain for p in pods2} == {a2}
    wait_for(lambda: status().get("phase") == "Running", 90, f"{name} Running again {log}")

    # exactly one live attempt: attempt 1's Job deleted by the operator, its Service by the
    # garbage collector; attempt 2's Service there
    def live(items):
        return sorted(i.metadata.name for i in items if not i.metadata.deletion_timestamp)

    wait_for(lambda: live(batch.list_namespaced_job(chain_ns).items) == [a2], 60, "attempt 1's Job gone")
    wait_for(lambda: live(chain.core.list_namespaced_service(chain_ns).items) == [a2], 60, "attempt 1's Service gone")

    # --- the run finishes: every pod exits 0 → Job Complete → Succeeded ------------------------------
    for p in pods2:
        chain.core.patch_namespaced_pod(
            p.metadata.name, chain_ns, {"metadata": {"labels": {COMPLETE_POD_LABEL: "true"}}}
        )
    st = wait_for(lambda: (s := status()).get("phase") == "Succeeded" and s, 90, f"{name} Succeeded {log}")
    assert (st["attempt"], st["restarts"], st["child"]) == (2, 1, a2)
    conditions = batch.read_namespaced_job(a2, chain_ns).status.conditions
    assert any(c.type == "Complete" and c.status == "True" for c in conditions)


def test_the_job_name_limit_is_where_the_pods_hostnames_stop_being_valid(chain, chain_ns):
    """Rendered Jobs created as an admin, past the operator's validation: a job name at the
    operator's limit makes a Job whose last pod the Job controller creates (its hostname fits), one
    more character a Job whose last pod it cannot create (or that the API server refuses), for the
    longest attempt number the operator checks."""
    nodes = 2
    limit = JOB.max_job_name(nodes)
    spec = parse_spec({"model": {"preset": "tiny"}, "cluster": {"instanceType": "cpu", "nodes": nodes}})
    batch = client.BatchV1Api(chain.core.api_client)

    def create(name: str):
        job = copy.deepcopy(JOB.render(spec, name, chain_ns, 9999, None, "etcd.x.svc:2379"))
        # nothing needs to run or be placed: a pod is made whether or not it can be scheduled
        job["spec"]["template"]["spec"]["nodeSelector"] = {"llmtrain.dev/nowhere": "true"}
        return batch.create_namespaced_job(chain_ns, job)

    def last_pod(job: str):
        return chain.core.list_namespaced_pod(
            chain_ns, label_selector=f"job-name={job},{COMPLETION_INDEX_LABEL}={nodes - 1}"
        ).items

    fits = create("j" * limit).metadata.name
    assert len(fits) == limit + len("-a9999")
    (pod,) = wait_for(lambda: last_pod(fits), 60, f"{fits}'s pod {nodes - 1}")
    assert pod.spec.hostname == f"{fits}-{nodes - 1}" and len(pod.spec.hostname) == 63

    try:
        over = create("k" * (limit + 1)).metadata.name
    except client.ApiException as err:  # refused by the API server's own Job validation
        assert err.status == 422, err.body
        return

    def refused():
        events = chain.core.list_namespaced_event(chain_ns, field_selector=f"involvedObject.name={over}").items
        return [e for e in events if e.reason == "FailedCreate"]

    (event, *_) = wait_for(refused, 60, f"the Job controller failing to create {over}'s pods")
    assert "hostname" in event.message or "63" in event.message, event.message
    assert not last_pod(over)
