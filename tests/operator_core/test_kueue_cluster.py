"""A job with spec.cluster.queueName against the real API server, the PyTorchJob held suspended as
Kueue holds a job it has not admitted (Kueue itself runs in the chain tests: tests/chain). What
Kueue does is done here by `kubectl patch`, as Kueue's own writes would be: unsuspend it and inject
its ResourceFlavor's nodeSelector and tolerations (admission), suspend it again (preemption).

The issue's measurement: a queued job with startupTimeoutMinutes 1 was restarted (StartupTimeout)
after 60 s, again after 135 s, each restart a new Workload at the back of the queue."""

from __future__ import annotations

import json
import time

from .conftest import wait_for
from .test_operator_cluster import tiny

QUEUE = "team-a"
KUEUE_NODE_SELECTOR = {"node.kubernetes.io/instance-type": "cpu", "kueue-flavor": "on-demand"}
KUEUE_TOLERATION = {"key": "kueue-flavor", "operator": "Exists", "effect": "NoSchedule"}


def queued_job(kube, name: str) -> dict:
    return kube.job_doc(name, tiny(cluster={"queueName": QUEUE}, resilience={"startupTimeoutMinutes": 1}))


def stamp(seconds_ago: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - seconds_ago))


def patch_status(kube, namespace: str, name: str, status: dict) -> None:
    kube.custom.patch_namespaced_custom_object_status(
        "llmtrain.dev", "v1alpha1", namespace, "llmtrainingjobs", name, {"status": status}
    )


def kueue_patch(kube, namespace: str, ptj: str, patch: list) -> None:
    """A write to the PyTorchJob as Kueue makes it (a JSON patch by another field manager)."""
    kube.cluster.kubectl("patch", "pytorchjob", ptj, "-n", namespace, "--type=json", "-p", json.dumps(patch))


def admit(kube, namespace: str, ptj: str) -> None:
    spec = "/spec/pytorchReplicaSpecs/Worker/template/spec"
    tolerations = (
        kube.ptj(namespace, ptj)["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"].get("tolerations") or []
    )
    kueue_patch(
        kube,
        namespace,
        ptj,
        [
            {"op": "replace", "path": "/spec/runPolicy/suspend", "value": False},
            {"op": "add", "path": f"{spec}/nodeSelector", "value": KUEUE_NODE_SELECTOR},
            {"op": "add", "path": f"{spec}/tolerations", "value": [*tolerations, KUEUE_TOLERATION]},
        ],
    )


def test_a_queued_job_is_not_restarted_and_its_deadline_counts_from_admission(operator, kube, namespace):
    kube.apply(namespace, queued_job(kube, "waits"))
    ptj = kube.wait_ptj(namespace, "waits-a1")
    assert ptj["spec"]["runPolicy"]["suspend"] is True
    assert ptj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == QUEUE
    kube.wait_phase(namespace, "waits", "Pending")
    # Two hours in the queue, startupTimeoutMinutes 1 (the old operator restarted it here: reason
    # StartupTimeout, attempt 2, restarts 1, and again at every deadline). No Kueue runs here, so no
    # Workload ever appears: two hours on, the job says Kueue made none (NoKueueWorkload), still queued.
    patch_status(kube, namespace, "waits", {"attemptCreationTime": stamp(7200)})

    def queued_not_restarted():
        s = kube.status(namespace, "waits")
        assert s.get("reason") != "StartupTimeout" and (s.get("restarts") or 0) == 0, f"restarted while queued: {s}"
        return s.get("reason") == "NoKueueWorkload" and s

    queued = wait_for(queued_not_restarted, 30, "reason NoKueueWorkload")
    assert queued["phase"] == "Pending" and f"LocalQueue {QUEUE}" in queued["message"]
    words = queued["message"]
    # The operator rewrites the message it owns once it has decided on this status: the sign it
    # looked at the two-hour-old attemptCreationTime again.
    patch_status(kube, namespace, "waits", {"attemptCreationTime": stamp(7200), "message": "scribbled"})
    after = wait_for(
        lambda: (s := kube.status(namespace, "waits")).get("message") == words and s,
        30,
        "the queued message rewritten after the two-hour-old attemptCreationTime",
    )
    assert (after["phase"], after["reason"], after["attempt"], after["restarts"]) == (
        "Pending",
        "NoKueueWorkload",
        1,
        0,
    )
    assert "kubeflow.org/pytorchjob" in words and "integrations.frameworks" in words
    assert [p["metadata"]["name"] for p in kube.ptjs(namespace, "waits")] == ["waits-a1"]
    wait_for(
        lambda: any(e.reason == "NoKueueWorkload" and e.type == "Warning" for e in kube.events(namespace, "waits")),
        15,
        "a NoKueueWorkload warning",
    )

    # Kueue admits it: unsuspends it and injects its flavor's nodeSelector and tolerations.
    admit(kube, namespace, "waits-a1")
    admitted = wait_for(
        lambda: (s := kube.status(namespace, "waits")).get("reason") == "Admitted" and s, 30, "reason Admitted"
    )
    assert admitted["admissionTime"] and admitted["restarts"] == 0 and admitted["attempt"] == 1
    ptj = kube.ptj(namespace, "waits-a1")
    pod = ptj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert pod["nodeSelector"] == KUEUE_NODE_SELECTOR and KUEUE_TOLERATION in pod["tolerations"]
    assert ptj["spec"]["runPolicy"]["suspend"] is False
    # The operator never wrote the PyTorchJob's spec after creating it: generation 1 was the create,
    # 2 Kueue's admission; and the fields Kueue set are Kueue's alone.
    assert ptj["metadata"]["generation"] == 2
    owners = {
        m["manager"]
        for m in ptj["metadata"]["managedFields"]
        if not m.get("subresource")
        and "f:suspend" in json.dumps((m.get("fieldsV1") or {}).get("f:spec", {}).get("f:runPolicy", {}))
    }
    assert owners == {"kubectl-patch"}, ptj["metadata"]["managedFields"]

    # The deadline now counts from admission: two minutes after it, the pods not started → restart.
    patch_status(kube, namespace, "waits", {"admissionTime": stamp(120)})
    assert kube.wait_ptj(namespace, "waits-a2")["spec"]["runPolicy"]["suspend"] is True  # a new Workload
    restarted = wait_for(
        lambda: (s := kube.status(namespace, "waits")).get("reason") == "Queued" and s, 30, "attempt 2 queued"
    )
    assert (restarted["attempt"], restarted["restarts"]) == (2, 1)
    wait_for(
        lambda: any(
            e.reason == "Restarting" and "startup-timeout" in e.message for e in kube.events(namespace, "waits")
        ),
        15,
        "the StartupTimeout restart's event",
    )


def test_preempted_by_kueue_is_not_a_failure(operator, kube, namespace):
    kube.apply(namespace, queued_job(kube, "preempt"))
    kube.wait_ptj(namespace, "preempt-a1")
    wait_for(lambda: kube.status(namespace, "preempt").get("reason") == "Queued", 30, "reason Queued")
    admit(kube, namespace, "preempt-a1")
    kube.set_ptj_condition(namespace, "preempt-a1", "Running")
    kube.wait_phase(namespace, "preempt", "Running")
    # Kueue preempts it: suspends the PyTorchJob again (the training-operator then deletes the pods,
    # which get their grace period; the trainer saves on SIGTERM).
    kueue_patch(kube, namespace, "preempt-a1", [{"op": "replace", "path": "/spec/runPolicy/suspend", "value": True}])
    status = wait_for(
        lambda: (s := kube.status(namespace, "preempt")).get("reason") == "Preempted" and s, 30, "reason Preempted"
    )
    assert (status["phase"], status["attempt"], status["restarts"]) == ("Pending", 1, 0)
    assert "no restart spent" in status["message"] and not status.get("admissionTime")
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "Queued")
    wait_for(
        lambda: any(e.reason == "Preempted" and e.type == "Warning" for e in kube.events(namespace, "preempt")),
        15,
        "a Preempted warning event",
    )
    # Re-admitted: the same PyTorchJob (the same Workload) runs again, from the newest checkpoint.
    kueue_patch(kube, namespace, "preempt-a1", [{"op": "replace", "path": "/spec/runPolicy/suspend", "value": False}])
    back = wait_for(
        lambda: (s := kube.status(namespace, "preempt")).get("reason") in ("Admitted", "Running") and s,
        30,
        "re-admitted",
    )
    assert (back["attempt"], back["restarts"], back["child"]) == (1, 0, "preempt-a1")
    assert [p["metadata"]["name"] for p in kube.ptjs(namespace, "preempt")] == ["preempt-a1"]
