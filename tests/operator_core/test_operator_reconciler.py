"""The level-triggered reconciler against the real apiserver: kopf stores nothing on the jobs, a
recorded attempt without its PyTorchJob gets it, any character of a user string reaches the workers,
suspend/resume keep the budget. (The restart backoff across an operator restart needs an operator of
its own: test_operator_consistency.py.)"""

from __future__ import annotations

import time

from llmtrain.pod_contract import rendezvous_id
from llmtrain.spec import GROUP, PLURAL, VERSION

from .conftest import wait_for
from .test_operator_cluster import tiny
from .test_operator_consistency import _create


def _live(kube, namespace: str, name: str) -> list[str]:
    return sorted(
        p["metadata"]["name"] for p in kube.ptjs(namespace, name) if not p["metadata"].get("deletionTimestamp")
    )


def _patch_spec(kube, namespace: str, name: str, spec: dict) -> None:
    kube.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, {"spec": spec})


def test_kopf_stores_nothing_on_the_jobs(operator, kube, namespace):
    # kopf's on.create/update bookkeeping wrote progress and a diff base into annotations (3
    # PATCHes per job) and its timer added a finalizer: none of that may be left on a job.
    _create(kube, namespace, "clean", tiny())
    kube.wait_ptj(namespace, "clean-a1")
    kube.set_ptj_condition(namespace, "clean-a1", "Running")
    kube.wait_phase(namespace, "clean", "Running")
    _patch_spec(kube, namespace, "clean", {"resilience": {"maxRestarts": 5}})
    job = wait_for(
        lambda: (j := kube.job(namespace, "clean"))["status"].get("observedGeneration") == 2 and j,
        30,
        "the spec update to be observed",
    )
    assert not job["metadata"].get("annotations"), job["metadata"].get("annotations")
    assert not job["metadata"].get("finalizers"), job["metadata"].get("finalizers")
    assert "kopf" not in job["status"]
    managers = {m["manager"] for m in job["metadata"]["managedFields"]}
    assert not any("kopf" in m for m in managers), managers
    # The operator's writes are its own by name (its User-Agent), not the Python client's default
    # `OpenAPI-Generator`, which this test's own writes are: the status and the child it created.
    status_managers = {m["manager"] for m in job["metadata"]["managedFields"] if m.get("subresource") == "status"}
    assert status_managers == {"llmtrain-operator"}, job["metadata"]["managedFields"]
    ptj = kube.ptj(namespace, "clean-a1")
    child_managers = {m["manager"] for m in ptj["metadata"]["managedFields"] if not m.get("subresource")}
    assert child_managers == {"llmtrain-operator"}, ptj["metadata"]["managedFields"]


def test_a_recorded_attempt_without_its_pytorchjob_gets_it(operator, kube, namespace):
    # What a crash between writing attempt 2 and creating its PyTorchJob leaves behind, written by
    # hand while the operator runs: the status names attempt 2, only attempt 1's PyTorchJob exists.
    _create(kube, namespace, "heal", tiny())
    kube.wait_ptj(namespace, "heal-a1")
    kube.set_ptj_condition(namespace, "heal-a1", "Running")
    kube.wait_phase(namespace, "heal", "Running")
    uid = kube.job(namespace, "heal")["metadata"]["uid"]
    started = time.monotonic()
    kube.custom.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        "heal",
        {
            "status": {
                "phase": "Restarting",
                "attempt": 2,
                "restarts": 1,
                "child": "heal-a2",
                "rendezvousId": rendezvous_id(namespace, "heal", uid, 2),
            }
        },
    )
    ptj = kube.wait_ptj(namespace, "heal-a2", timeout=15)
    assert time.monotonic() - started < 10
    assert ptj["spec"]["elasticPolicy"]["rdzvId"] == rendezvous_id(namespace, "heal", uid, 2)
    wait_for(lambda: _live(kube, namespace, "heal") == ["heal-a2"], 15, "the superseded heal-a1 to be deleted")
    status = kube.status(namespace, "heal")
    assert (status["attempt"], status["restarts"], status["child"]) == (2, 1, "heal-a2")
    wait_for(
        lambda: any(e.reason == "Created" and "attempt 2" in e.message for e in kube.events(namespace, "heal")),
        15,
        "a Created event for attempt 2",
    )


def test_a_character_outside_the_basic_multilingual_plane_reaches_the_workers(operator, kube, namespace):
    # Parsing the whole rendered text as YAML refused such a character (the job ended Failed,
    # RenderFailed); the values now go in as JSON (render.py), which has no such limit. The
    # RenderFailed path itself: test_render_failed.py.
    _create(kube, namespace, "emoji", tiny(cluster={"env": {"GREETING": "hello \U0001f600"}}))
    kube.wait_phase(namespace, "emoji", "Pending")
    (ptj,) = kube.ptjs(namespace, "emoji")
    env = ptj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "GREETING", "value": "hello \U0001f600"} in env


def test_suspend_stops_the_attempt_keeps_the_budget_and_resume_starts_the_next(operator, kube, namespace):
    _create(kube, namespace, "pause", tiny())
    first = kube.wait_ptj(namespace, "pause-a1")
    # The pods the deletion stops get the trainer's SIGTERM checkpoint window.
    pod = first["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= 120
    kube.set_ptj_condition(namespace, "pause-a1", "Running")
    kube.wait_phase(namespace, "pause", "Running")

    _patch_spec(kube, namespace, "pause", {"suspend": True})
    status = kube.wait_phase(namespace, "pause", "Suspended")
    wait_for(lambda: not kube.ptjs(namespace, "pause"), 30, "the attempt's PyTorchJob to be deleted")
    assert (status["attempt"], status["restarts"]) == (1, 0)
    assert [c["reason"] for c in status["conditions"] if c["type"] == "Ready"] == ["Suspended"]
    wait_for(lambda: any(e.reason == "Suspended" for e in kube.events(namespace, "pause")), 15, "a Suspended event")
    row = kube.cluster.kubectl("get", "llmtj", "pause", "-n", namespace).stdout.split("\n")[1].split()
    assert row[1] == "Suspended"

    _patch_spec(kube, namespace, "pause", {"suspend": False})
    second = kube.wait_ptj(namespace, "pause-a2")
    assert second["spec"]["elasticPolicy"]["rdzvId"] != first["spec"]["elasticPolicy"]["rdzvId"]
    status = kube.status(namespace, "pause")
    assert (status["attempt"], status["restarts"]) == (2, 0)  # a resume spends no restart
    assert "resumed" in status["message"]
    assert _live(kube, namespace, "pause") == ["pause-a2"]


def test_a_job_created_suspended_starts_when_resumed(operator, kube, namespace):
    spec = tiny()
    spec["suspend"] = True
    _create(kube, namespace, "queued", spec)
    status = kube.wait_phase(namespace, "queued", "Suspended")
    assert (status["attempt"], status["restarts"]) == (1, 0) and not kube.ptjs(namespace, "queued")
    _patch_spec(kube, namespace, "queued", {"suspend": False})
    kube.wait_ptj(namespace, "queued-a1")
    status = wait_for(
        lambda: (s := kube.status(namespace, "queued")).get("child") == "queued-a1" and s, 15, "queued-a1 recorded"
    )
    assert (status["attempt"], status["restarts"], status["phase"]) == (1, 0, "Pending")
