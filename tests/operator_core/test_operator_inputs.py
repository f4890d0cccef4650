"""Bad input and a job's pods' state against the module's shared operator, on the real apiserver: a
child the API server refuses ends Failed with the policy's words, a spec larger than the annotation
limit still runs, checkpoint.uri is fixed, a model's dims show in a column, Pending shows the pods'
own reasons and restarts after the start-up deadline.

These run on one operator watching every namespace (the `operator` fixture); the tests that start
their own (restarts, failover) are in test_operator_consistency.py, where none is shared."""

from __future__ import annotations

import signal

import pytest
from kubernetes import client

from llmtrain.spec import GROUP, PLURAL, VERSION

from .conftest import wait_for
from .test_operator_cluster import tiny
from .test_operator_consistency import _create

# --- bad input ends Failed with its reason (defect 4), checkpoint.uri is fixed (defect 5) ----------


def test_a_pytorchjob_the_api_server_refuses_fails_the_job_with_its_reason(operator, kube, namespace):
    # A cluster policy (a real ValidatingAdmissionPolicy, enforced by the API server) refuses the
    # rendered PyTorchJob: the job must end Failed with the policy's words, not retry blank forever.
    adm = client.AdmissionregistrationV1Api(kube.api)
    policy = f"no-forbidden-images-{namespace}"
    adm.create_validating_admission_policy(
        {
            "metadata": {"name": policy},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": ["kubeflow.org"],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pytorchjobs"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": "object.spec.pytorchReplicaSpecs.Worker.template.spec.containers"
                        ".all(c, !c.image.endsWith(':forbidden'))",
                        "message": "images tagged :forbidden are not allowed here",
                    }
                ],
            },
        }
    )
    adm.create_validating_admission_policy_binding(
        {
            "metadata": {"name": policy},
            "spec": {
                "policyName": policy,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}},
            },
        }
    )
    try:
        spec = tiny(cluster={"image": "llmtrain-trainer:forbidden"})

        def refused() -> bool:  # the policy takes effect once the API server has loaded it
            probe = render_probe(kube, namespace, spec)
            return probe.returncode != 0 and "forbidden are not allowed" in probe.stderr

        wait_for(refused, 30, "the admission policy to be enforced")
        _create(kube, namespace, "refused", spec)
        status = kube.wait_phase(namespace, "refused", "Failed")
        assert status["reason"] == "AttemptRejected"
        assert "images tagged :forbidden are not allowed here" in status["message"]
        wait_for(
            lambda: any(
                e.type == "Warning" and e.reason == "AttemptRejected" for e in kube.events(namespace, "refused")
            ),
            15,
            "a AttemptRejected event",
        )
        assert not kube.ptjs(namespace, "refused")
    finally:
        adm.delete_validating_admission_policy_binding(policy)
        adm.delete_validating_admission_policy(policy)


def render_probe(kube, namespace, spec):
    import yaml

    from llmtrain.backends.pytorchjob import render_pytorchjob
    from llmtrain.validation import parse_spec

    obj = render_pytorchjob(parse_spec(spec), "probe", namespace, 1, None, "etcd.test.svc:2379")
    return kube.cluster.kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(obj), check=False)


def test_a_spec_larger_than_the_annotation_limit_still_runs_and_updates(operator, kube, namespace):
    # The largest cluster.env the schema allows (64 × 2 KiB, issue 18): half of what all annotations
    # may be (256 KiB); a copy of the spec in an annotation (kopf's diff base) would show below.
    env = {f"BIG_{i}": "x" * 2048 for i in range(64)}
    _create(kube, namespace, "big", tiny(cluster={"env": env}))
    kube.wait_ptj(namespace, "big-a1")
    kube.wait_phase(namespace, "big", "Pending")
    kube.custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "big", {"spec": {"resilience": {"maxRestarts": 4}}}
    )
    job = wait_for(
        lambda: (j := kube.job(namespace, "big"))["status"].get("observedGeneration") == 2 and j,
        30,
        "the resilience update to be applied",
    )
    assert any(c["type"] == "SpecAccepted" and c["status"] == "True" for c in job["status"]["conditions"])
    annotations = job["metadata"].get("annotations") or {}
    assert sum(len(k) + len(v) for k, v in annotations.items()) < 16 * 1024


def test_checkpoint_uri_cannot_be_added_or_removed_on_a_live_job(kube, dev_cluster, namespace):
    kube.apply(namespace, kube.job_doc("no-ckpt", tiny()))
    kube.apply(namespace, kube.job_doc("with-ckpt", tiny(checkpoint={"uri": "file:///tmp/ckpt"})))
    add = kube.cluster.kubectl(
        "patch",
        "llmtj",
        "no-ckpt",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"checkpoint":{"uri":"file:///tmp/other"}}}',
        check=False,
    )
    assert add.returncode != 0 and "spec.checkpoint.uri is immutable" in add.stderr, add.stderr
    remove = kube.cluster.kubectl(
        "patch",
        "llmtj",
        "with-ckpt",
        "-n",
        namespace,
        "--type=json",
        "-p",
        '[{"op":"remove","path":"/spec/checkpoint/uri"}]',
        check=False,
    )
    assert remove.returncode != 0 and "spec.checkpoint.uri is immutable" in remove.stderr, remove.stderr
    change = kube.cluster.kubectl(
        "patch",
        "llmtj",
        "with-ckpt",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"checkpoint":{"uri":"file:///tmp/elsewhere"}}}',
        check=False,
    )
    assert change.returncode != 0 and "immutable" in change.stderr
    kube.cluster.kubectl(
        "patch", "llmtj", "with-ckpt", "-n", namespace, "--type=merge", "-p", '{"spec":{"checkpoint":{"keep":7}}}'
    )  # the cadence still may change
    assert kube.job(namespace, "with-ckpt")["spec"]["checkpoint"] == {
        **kube.job(namespace, "with-ckpt")["spec"]["checkpoint"],
        "uri": "file:///tmp/ckpt",
        "keep": 7,
    }


def test_custom_dims_show_a_model_column(operator, kube, namespace):
    dims = {
        "hiddenSize": 64,
        "intermediateSize": 128,
        "numLayers": 2,
        "numHeads": 4,
        "numKvHeads": 4,
        "vocabSize": 256,
        "maxSeqLen": 64,
    }
    spec = tiny()
    spec["model"] = {"dims": dims}
    kube.apply(namespace, kube.job_doc("custom", spec))
    wait_for(lambda: kube.status(namespace, "custom").get("model"), 30, "status.model")
    row = kube.cluster.kubectl("get", "llmtj", "custom", "-n", namespace).stdout.split("\n")[1].split()
    assert row[:3] == ["custom", "Pending", "custom-2L-64h"]


# --- Pending: the pods' own reasons, and a start-up deadline (defect 7) ---------------------------


def test_a_pending_job_shows_why_its_pods_do_not_start_and_restarts_after_the_deadline(operator, kube, namespace):
    from llmtrain_devcluster.standins import worker0_pod

    kube.apply(namespace, kube.job_doc("stuck", tiny(resilience={"startupTimeoutMinutes": 10, "maxRestarts": 1})))
    ptj = kube.wait_ptj(namespace, "stuck-a1")
    kube.core.create_namespaced_pod(namespace, worker0_pod("stuck", 1, "llmtrain-trainer:dev", owner=ptj))
    why = "0/16 nodes are available: 16 Insufficient vpc.amazonaws.com/efa."
    kube.core.patch_namespaced_pod_status(
        "stuck-a1-worker-0",
        namespace,
        {
            "status": {
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": why}],
            }
        },
    )
    status = wait_for(
        lambda: (s := kube.status(namespace, "stuck")).get("reason") == "Unschedulable" and s,
        30,
        "the scheduler's reason in status",
    )
    assert why in status["message"] and status["phase"] == "Pending"
    wait_for(
        lambda: any(
            e.type == "Warning" and e.reason == "Unschedulable" and why in e.message
            for e in kube.events(namespace, "stuck")
        ),
        30,
        "an Unschedulable event",
    )
    # Eleven minutes into the attempt (the same clock the hang test moves): past startupTimeoutMinutes.
    import time

    long_ago = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 660))
    kube.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "stuck", {"status": {"attemptCreationTime": long_ago}}
    )
    kube.wait_ptj(namespace, "stuck-a2")
    status = kube.status(namespace, "stuck")
    assert (status["attempt"], status["restarts"], status["reason"]) == (2, 1, "StartupTimeout")
    assert "startupTimeoutMinutes 10" in status["message"] and why in status["message"]


# --- the module's operator is the only one acting here ------------------------------------------


def test_no_other_operator_starts_beside_the_shared_one(operator, dev_cluster, trainer_endpoint, namespace, tmp_path):
    # The shared operator watches every namespace: a second one, even scoped to this test's
    # namespace, would act on the same jobs (a JobSet failover test failed on it: the shared one,
    # not serving JobSet, failed the jobs the test's leader had just started).
    from .conftest import OperatorProcess

    second = OperatorProcess(
        dev_cluster.kubeconfig, tmp_path / "second.log", trainer_endpoint[1], ["--namespace", namespace]
    )
    try:
        with pytest.raises(AssertionError, match="already acts on every namespace"):
            second.start()
    finally:
        if second.proc is not None:  # it ran after all: the test fails, the process goes
            second.stop(signal.SIGKILL)
    assert second.proc is None  # refused before it ran
    assert operator.proc.poll() is None
