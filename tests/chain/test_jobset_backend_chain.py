"""An LLMTrainingJob on the JobSet backend on the real chain: the operator as a process, the real
JobSet controller (its webhooks served), the Job controller, kube-scheduler and kwok's p5 nodes.
Nothing here writes a JobSet's, Job's or pod's status by hand: the JobSet controller makes the
Job, the Job controller the indexed pods, the scheduler binds them, kwok runs (and, asked, fails or
completes) them.

attempt 1 runs (its JobSet Running once every pod is ready; rank 0 found by completion index and
scraped through the pods' uid chain) → a worker fails on its node (the Job fails at backoffLimit 0,
the JobSet at maxRestarts 0) → attempt 2, the node blamed from the pod watch → the pods complete →
Succeeded. And the job-name limit the operator enforces is exactly where JobSet's own webhook
starts refusing."""

from __future__ import annotations

import copy
import json
import time

import pytest
from kubernetes import client

from llmtrain.backends import JOBSET
from llmtrain.backends.jobset import COMPLETION_INDEX_LABEL, JOBSET_NAME_LABEL
from llmtrain.pod_contract import child_name
from llmtrain.spec import GROUP, PLURAL, VERSION
from llmtrain.validation import parse_spec
from llmtrain_devcluster.chain import COMPLETE_POD_LABEL
from operator_core.conftest import OperatorProcess

from .conftest import p5_job_doc, wait_for

pytestmark = [pytest.mark.slow]  # `cluster` comes from the fixtures (tests/plugins/needs.py)

JS = (JOBSET.child.group, JOBSET.child.version, JOBSET.child.plural)


@pytest.fixture(scope="module")
def jobset_operator(chain_cluster, trainer_endpoint, tmp_path_factory):
    op = OperatorProcess(
        chain_cluster.kubeconfig,
        tmp_path_factory.mktemp("jobset-operator") / "operator.log",
        trainer_endpoint[1],
        extra_args=["--backend", "pytorchjob", "--backend", "jobset", "--default-backend", "jobset"],
    )
    op.start()
    yield op
    op.stop()


def test_a_jobset_job_runs_fails_over_and_succeeds_on_the_chain(chain, chain_ns, jobset_operator, trainer_endpoint):
    metrics, _ = trainer_endpoint
    name = "js-7b"
    doc = p5_job_doc(name)
    chain.core.create_namespaced_service_account(
        chain_ns, {"metadata": {"name": doc["spec"]["cluster"]["serviceAccountName"]}}
    )
    chain.custom.create_namespaced_custom_object(GROUP, VERSION, chain_ns, PLURAL, doc)
    nodes, by_type = doc["spec"]["cluster"]["nodes"], chain.nodes_by_type()
    log = f"(log: {jobset_operator.log_path})"

    def status():
        return chain.custom.get_namespaced_custom_object(GROUP, VERSION, chain_ns, PLURAL, name).get("status") or {}

    def jobset(attempt: int) -> dict:
        return chain.custom.get_namespaced_custom_object(*JS[:2], chain_ns, JS[2], child_name(name, attempt))

    # --- attempt 1: JobSet → Job → 2 indexed pods on the p5 nodes, Running --------------------------
    a1 = child_name(name, 1)
    pods = chain.wait_pods_running(chain_ns, f"{JOBSET_NAME_LABEL}={a1}", nodes, 120)
    assert {by_type[p.spec.node_name] for p in pods} == {"p5.48xlarge"}
    assert sorted(p.spec.hostname for p in pods) == [f"{a1}-worker-0-0", f"{a1}-worker-0-1"]
    assert {p.spec.subdomain for p in pods} == {a1}  # the JobSet's headless Service
    assert chain.core.read_namespaced_service(a1, chain_ns).spec.cluster_ip == "None"
    (job,) = (
        client.BatchV1Api(chain.core.api_client)
        .list_namespaced_job(chain_ns, label_selector=f"{JOBSET_NAME_LABEL}={a1}")
        .items
    )
    assert (job.metadata.name, job.spec.backoff_limit, job.spec.completion_mode) == (f"{a1}-worker-0", 0, "Indexed")
    st = wait_for(lambda: (s := status()).get("phase") == "Running" and s, 90, f"{name} Running {log}")
    assert (st["backend"], st["child"], st["attempt"]) == ("jobset", a1, 1)
    assert st["message"] == f"JobSet {a1} is Running"
    assert not chain.custom.list_namespaced_custom_object("kubeflow.org", "v1", chain_ns, "pytorchjobs")["items"]

    # rank 0 is completion index 0; the operator scrapes it, having trusted the pod through its Job
    (rank0,) = [p for p in pods if p.metadata.labels.get(COMPLETION_INDEX_LABEL) == "0"]
    now = time.time()
    metrics.step.set(12)
    metrics.heartbeat_timestamp_seconds.set(now)
    chain.serve_pod_here(chain_ns, rank0.metadata.name)
    wait_for(lambda: (status().get("progress") or {}).get("step") == 12, 30, f"status.progress.step from rank 0 {log}")

    # --- a worker fails on its node: Job failed (backoffLimit 0), JobSet failed (maxRestarts 0) ------
    victim = next(p for p in pods if p.metadata.labels.get(COMPLETION_INDEX_LABEL) == "1")
    chain.fail_pod_and_watch(chain_ns, victim.metadata.name, exit_code=137)
    st = wait_for(lambda: (s := status()).get("attempt") == 2 and s, 90, f"{name} attempt 2 {log}")
    assert st["restarts"] == 1 and st["reason"] == "Failed"
    assert [b["node"] for b in st.get("badNodes") or []] == [victim.spec.node_name], st.get("badNodes")
    a2 = child_name(name, 2)
    pods2 = chain.wait_pods_running(chain_ns, f"{JOBSET_NAME_LABEL}={a2}", nodes, 120)
    wait_for(lambda: status().get("phase") == "Running", 90, f"{name} Running again {log}")
    # exactly one live attempt: attempt 1's JobSet deleted by the operator
    wait_for(
        lambda: (
            [
                j["metadata"]["name"]
                for j in chain.custom.list_namespaced_custom_object(*JS[:2], chain_ns, JS[2])["items"]
                if not j["metadata"].get("deletionTimestamp")
            ]
            == [a2]
        ),
        60,
        "attempt 1's JobSet gone",
    )

    # --- the run finishes: every pod exits 0 → Job complete → JobSet Completed → Succeeded -----------
    for p in pods2:
        chain.core.patch_namespaced_pod(
            p.metadata.name, chain_ns, {"metadata": {"labels": {COMPLETE_POD_LABEL: "true"}}}
        )
    st = wait_for(lambda: (s := status()).get("phase") == "Succeeded" and s, 90, f"{name} Succeeded {log}")
    assert (st["attempt"], st["restarts"], st["child"]) == (2, 1, a2)
    assert any(c["type"] == "Completed" and c["status"] == "True" for c in jobset(2)["status"]["conditions"])


def test_the_job_name_limit_is_where_jobsets_webhook_starts_refusing(chain, chain_ns):
    """Rendered JobSets created as an admin, past the operator's validation: a job name at the
    operator's limit makes a JobSet that JobSet's webhook admits (its pods' names fit), one more
    character one it refuses, for the longest attempt number the operator checks."""
    nodes = 2
    limit = JOBSET.max_job_name(nodes)
    spec = parse_spec({"model": {"preset": "tiny"}, "cluster": {"instanceType": "p5.48xlarge", "nodes": nodes}})

    def create(name: str):
        js = JOBSET.render(spec, name, chain_ns, 9999, None, "etcd.x.svc:2379")
        js = copy.deepcopy(js)
        js["spec"]["suspend"] = True  # nothing needs to run
        return chain.custom.create_namespaced_custom_object(*JS[:2], chain_ns, JS[2], js)

    made = create("j" * limit)
    assert len(made["metadata"]["name"]) == limit + len("-a9999")
    with pytest.raises(client.ApiException) as err:
        create("k" * (limit + 1))
    body = json.loads(err.value.body)
    assert err.value.status in (400, 422) and "pod names generated for this JobSet will exceed 63" in body["message"], (
        body
    )
