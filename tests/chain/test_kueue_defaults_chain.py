"""The chain's Kueue started with the pinned release's DEFAULT integrations
(``kueue_frameworks=release_default_frameworks()``, ``--kueue-integrations release-default``): what
a platform team gets from a default install of Kueue v0.19. Its JobSet integration queues and
admits a JobSet; a PyTorchJob with a queue name, created suspended as the operator creates one, gets
no Workload at all: nothing will ever admit it. The pod, Deployment and StatefulSet integrations
are on too, so their webhooks must be served for any pod to be created."""

from __future__ import annotations

import uuid

import pytest
from kubernetes import client

from plugins.needs import needs

from .conftest import PTJ, wait_for
from .test_kueue_chain import QUEUE, _queued_jobset

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
@needs("cluster")
def default_kueue_cluster(tmp_path_factory):
    from llmtrain_devcluster import DevCluster
    from llmtrain_devcluster.kueue import release_default_frameworks

    with DevCluster(
        tmp_path_factory.mktemp("kueue-defaults"),
        chain=True,
        kueue=True,
        kueue_frameworks=release_default_frameworks(),
        nodes={"p5.48xlarge": 1},
    ) as cluster:
        yield cluster


def _suspended_pytorchjob(name: str) -> dict:
    pod = {
        "spec": {
            "restartPolicy": "Never",
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "pytorch", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}],
        }
    }
    return {
        "apiVersion": f"{PTJ[0]}/{PTJ[1]}",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": QUEUE}},
        "spec": {
            "runPolicy": {"suspend": True},
            "pytorchReplicaSpecs": {"Worker": {"replicas": 1, "restartPolicy": "Never", "template": pod}},
        },
    }


def test_release_defaults_admit_a_jobset_but_never_see_a_pytorchjob(default_kueue_cluster):
    from llmtrain_devcluster.jobset import JOBSET, JOBSET_NAME_LABEL

    cluster = default_kueue_cluster
    assert "kubeflow.org/pytorchjob" not in cluster.kueue_frameworks and "pod" in cluster.kueue_frameworks
    ns = f"d-{uuid.uuid4().hex[:10]}"
    with cluster.api_client() as api:
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        core.create_namespace({"metadata": {"name": ns}})
        wait_for(lambda: core.read_namespaced_service_account("default", ns), 60, f"default ServiceAccount in {ns}")
        cluster.kueue_local_queue(ns, QUEUE)

        def workloads(kind: str, name: str) -> list:
            items = custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", ns, "workloads")["items"]
            return [
                w
                for w in items
                if any(o["kind"] == kind and o["name"] == name for o in w["metadata"].get("ownerReferences") or [])
            ]

        custom.create_namespaced_custom_object(*PTJ[:2], ns, PTJ[2], _suspended_pytorchjob("ptj"))
        made = custom.create_namespaced_custom_object(JOBSET[0], JOBSET[1], ns, JOBSET[2], _queued_jobset("js", 1))
        assert made["spec"]["suspend"] is True  # Kueue's JobSet webhook
        # Admitted, and its pod created through Kueue's (served) pod webhooks, then Running.
        wait_for(
            lambda: [
                p
                for p in core.list_namespaced_pod(ns, label_selector=f"{JOBSET_NAME_LABEL}=js").items
                if p.status.phase == "Running"
            ],
            120,
            "the JobSet admitted and its pod Running",
        )
        assert len(workloads("JobSet", "js")) == 1
        # By now Kueue has long reconciled the earlier PyTorchJob, had it watched one: it has no
        # Workload and stays suspended, with no pod.
        assert workloads("PyTorchJob", "ptj") == []
        assert custom.get_namespaced_custom_object(*PTJ[:2], ns, PTJ[2], "ptj")["spec"]["runPolicy"]["suspend"] is True
        assert not core.list_namespaced_pod(ns, label_selector="training.kubeflow.org/job-name=ptj").items
        core.delete_namespace(ns)


def test_the_operator_says_kueue_does_not_manage_its_pytorchjobs_and_a_jobset_job_runs(default_kueue_cluster, tmp_path):
    """Issue 28's defect on Kueue's default integrations: a PyTorchJob-backend job under a queue
    used to wait Queued forever, silently. Now, once the wait for a Workload is over, it says Kueue
    does not manage PyTorchJobs and which setting to change (reason NoKueueWorkload, a Warning
    event), without spending a restart; the same job on the JobSet backend is admitted and runs."""
    import yaml

    from llmtrain.spec import GROUP, PLURAL, VERSION
    from llmtrain_devcluster.process import free_port
    from operator_core.conftest import OperatorProcess

    cluster = default_kueue_cluster
    ns = f"o-{uuid.uuid4().hex[:10]}"
    op = OperatorProcess(
        cluster.kubeconfig,
        tmp_path / "operator.log",
        free_port(),
        extra_args=[
            "--namespace",
            ns,
            "--backend",
            "pytorchjob",
            "--backend",
            "jobset",
            "--kueue-workload-wait-seconds",
            "5",
        ],
    )
    with cluster.api_client() as api:
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        core.create_namespace({"metadata": {"name": ns}})
        wait_for(lambda: core.read_namespaced_service_account("default", ns), 60, f"default ServiceAccount in {ns}")
        cluster.kueue_local_queue(ns, QUEUE)
        op.start()
        try:
            spec = {
                "model": {"preset": "tiny"},
                "cluster": {"instanceType": "p5.48xlarge", "nodes": 1, "queueName": QUEUE},
            }
            for name, backend in (("ptj-job", "pytorchjob"), ("js-job", "jobset")):
                doc = {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "LLMTrainingJob",
                    "metadata": {"name": name},
                    "spec": {**spec, "cluster": {**spec["cluster"], "backend": backend}},
                }
                cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))

            def status(name: str) -> dict:
                return custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name).get("status") or {}

            said = wait_for(
                lambda: (s := status("ptj-job")).get("reason") == "NoKueueWorkload" and s,
                60,
                f"ptj-job NoKueueWorkload (log: {op.log_path})",
            )
            assert (said["phase"], said["attempt"], said["restarts"]) == ("Pending", 1, 0)
            assert "kubeflow.org/pytorchjob" in said["message"] and "integrations.frameworks" in said["message"]
            assert custom.get_namespaced_custom_object(*PTJ[:2], ns, PTJ[2], "ptj-job-a1")["spec"]["runPolicy"][
                "suspend"
            ]
            wait_for(
                lambda: [
                    e
                    for e in core.list_namespaced_event(ns).items
                    if e.involved_object.name == "ptj-job" and e.reason == "NoKueueWorkload" and e.type == "Warning"
                ],
                30,
                "a NoKueueWorkload warning",
            )
            running = wait_for(
                lambda: (s := status("js-job")).get("phase") == "Running" and s,
                120,
                f"js-job Running (log: {op.log_path})",
            )
            assert running["admissionTime"] and running["backend"] == "jobset"
        finally:
            op.stop()
            core.delete_namespace(ns)
