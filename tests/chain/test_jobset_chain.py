"""The chain's JobSet controller (llmtrain_devcluster.jobset), the second training backend's child:
its webhooks are really served and its Jobs' pods run on kwok nodes; and kwok's own pod-complete
stage, which completes a Job-owned pod right after it runs, leaves training pods (those carrying
``llmtrain.dev/job``) Running until llmtrain's own complete stage is asked for."""

from __future__ import annotations

import copy

import pytest

from llmtrain.render import JOB_LABEL
from llmtrain_devcluster.chain import COMPLETE_POD_LABEL
from llmtrain_devcluster.jobset import JOBSET, JOBSET_NAME_LABEL

from .conftest import wait_for

pytestmark = [pytest.mark.slow]


def _jobset(name: str, *, pod_labels: dict[str, str] | None = None, nodes: int = 2) -> dict:
    """One replicated Job of ``nodes`` indexed pods that fit on any kwok node (each tolerates the
    GPU and EFA taints and asks for a tenth of a CPU)."""
    pod = {
        "metadata": {"labels": dict(pod_labels or {})},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"type": "kwok"},
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "100m"}}}],
        },
    }
    return {
        "apiVersion": f"{JOBSET[0]}/{JOBSET[1]}",
        "kind": "JobSet",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": {"maxRestarts": 0},
            "replicatedJobs": [
                {
                    "name": "node",
                    "replicas": 1,
                    "template": {
                        "spec": {"parallelism": nodes, "completions": nodes, "backoffLimit": 0, "template": pod}
                    },
                }
            ],
        },
    }


def _create(chain, ns: str, body: dict) -> dict:
    return chain.custom.create_namespaced_custom_object(JOBSET[0], JOBSET[1], ns, JOBSET[2], body)


def _condition(chain, ns: str, name: str, ctype: str) -> bool:
    js = chain.custom.get_namespaced_custom_object(JOBSET[0], JOBSET[1], ns, JOBSET[2], name)
    return any(c["type"] == ctype and c["status"] == "True" for c in (js.get("status") or {}).get("conditions") or [])


def test_jobset_webhooks_are_served_and_its_pods_run_on_kwok_nodes(chain, chain_ns):
    from kubernetes import client

    # Validating webhook: a failure-policy rule naming a replicated job the JobSet lacks (the CRD's
    # schema cannot see that; JobSet's ValidateCreate does).
    bad = _jobset("bad")
    bad["spec"]["failurePolicy"]["rules"] = [{"name": "r", "action": "FailJobSet", "targetReplicatedJobs": ["nope"]}]
    with pytest.raises(client.ApiException) as e:
        _create(chain, chain_ns, bad)
    assert e.value.status in (400, 422) and "does not appear in .spec.ReplicatedJobs" in e.value.body, e.value.body

    # Mutating webhook: only JobSet's Default() turns on DNS hostnames (the CRD has no default).
    made = _create(chain, chain_ns, _jobset("good", pod_labels={JOB_LABEL: "good"}))
    assert made["spec"]["network"]["enableDNSHostnames"] is True
    assert made["spec"]["replicatedJobs"][0]["template"]["spec"]["completionMode"] == "Indexed"
    pods = chain.wait_pods_running(chain_ns, f"{JOBSET_NAME_LABEL}=good", 2)
    assert {p.spec.node_name for p in pods} <= set(chain.nodes_by_type())
    # The headless Service that gives the pods stable names (c10d rendezvous on this backend).
    svc = wait_for(lambda: chain.core.read_namespaced_service("good", chain_ns), 30, "JobSet's headless Service")
    assert svc.spec.cluster_ip == "None"
    assert {p.spec.subdomain for p in pods} == {"good"}


def test_kwok_completes_a_plain_job_pod_but_leaves_training_pods_running(chain, chain_ns):
    training = _jobset("train", pod_labels={JOB_LABEL: "train"})
    _create(chain, chain_ns, training)
    running = chain.wait_pods_running(chain_ns, f"{JOBSET_NAME_LABEL}=train", 2)

    # The same JobSet without the training label: kwok's pod-complete ends its pods, so it Completes.
    plain = copy.deepcopy(training)
    plain["metadata"]["name"] = "plain"
    plain["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]["labels"] = {}
    _create(chain, chain_ns, plain)
    wait_for(lambda: _condition(chain, chain_ns, "plain", "Completed"), 90, "the unlabelled JobSet Completed")

    # By then kwok has played its stages on the training pods for as long: still Running, same pods.
    now = chain.pods(chain_ns, f"{JOBSET_NAME_LABEL}=train")
    assert {p.metadata.name for p in now} == {p.metadata.name for p in running}
    assert [p.status.phase for p in now] == ["Running", "Running"], [p.status.phase for p in now]
    assert not _condition(chain, chain_ns, "train", "Completed")

    # llmtrain's own stage ends them when asked, as a finished training run.
    for p in now:
        chain.core.patch_namespaced_pod(
            p.metadata.name, chain_ns, {"metadata": {"labels": {COMPLETE_POD_LABEL: "true"}}}
        )
    wait_for(lambda: _condition(chain, chain_ns, "train", "Completed"), 90, "the training JobSet Completed")
