"""The operator under restarts and concurrency, against the real apiserver: an attempt never goes
back, no attempt's PyTorchJob lives twice, Ready survives a restart, bad input ends Failed."""

from __future__ import annotations

import signal
import threading

import pytest
from kubernetes import client, watch

from llmtrain.spec import GROUP, PLURAL, VERSION

from .conftest import OperatorProcess, wait_for
from .test_operator_cluster import tiny

pytestmark = [pytest.mark.cluster]


class AttemptRecorder:
    """Watches every LLMTrainingJob of a namespace and records each (attempt, restarts) the API
    server ever stored, so a write that goes back is seen even if it is later corrected."""

    def __init__(self, api_client, namespace: str):
        self.custom = client.CustomObjectsApi(api_client)
        self.namespace, self.seen = namespace, {}
        self.regressions: list[str] = []
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        for event in self._watch.stream(self.custom.list_namespaced_custom_object, GROUP, VERSION,
                                        self.namespace, PLURAL, timeout_seconds=600):
            job = event["object"]
            status = job.get("status") or {}
            if "attempt" not in status:
                continue
            name = job["metadata"]["name"]
            now = (status["attempt"], status.get("restarts") or 0)
            before = self.seen.get(name, (0, 0))
            if now[0] < before[0] or now[1] < before[1]:
                self.regressions.append(f"{name}: {before} -> {now}")
            self.seen[name] = max(before, now)

    def stop(self):
        self._watch.stop()


def _create(kube, namespace: str, name: str, spec: dict) -> None:
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, kube.job_doc(name, spec))


@pytest.fixture
def own_operator(dev_cluster, trainer_endpoint, tmp_path):
    ops = []

    def start(*extra_args) -> OperatorProcess:
        op = OperatorProcess(dev_cluster.kubeconfig, tmp_path / f"operator-{len(ops)}.log", trainer_endpoint[1],
                             extra_args)
        op.start()
        ops.append(op)
        return op

    yield start
    for op in ops:
        op.stop(signal.SIGKILL)


@pytest.mark.slow
def test_attempts_failed_while_the_operator_was_down_go_forward_exactly_once(own_operator, kube, namespace):
    names = [f"storm-{i}" for i in range(20)]
    recorder = AttemptRecorder(kube.api, namespace)
    op = own_operator()
    for name in names:
        _create(kube, namespace, name, tiny(resilience={"maxRestarts": 3}))
    for name in names:
        wait_for(lambda: kube.status(namespace, name).get("pytorchJob") == f"{name}-a1", 60, f"{name} recorded")
    op.stop(signal.SIGKILL)
    for name in names:  # the training-operator marks every attempt Failed while ours is down
        kube.set_ptj_condition(namespace, f"{name}-a1", "Failed", "worker 0 exited with code 137")
    op.start()

    def settled() -> bool:
        for name in names:
            status = kube.status(namespace, name)
            if (status.get("attempt"), status.get("restarts"), status.get("pytorchJob")) != (2, 1, f"{name}-a2"):
                return False
            if sorted(p["metadata"]["name"] for p in kube.ptjs(namespace, name)
                      if not p["metadata"].get("deletionTimestamp")) != [f"{name}-a2"]:
                return False
        return True

    wait_for(settled, 90, "every job at attempt 2 / restarts 1 with only <job>-a2 alive")
    # The resumed operator's handlers have all run (every job was re-adopted or restarted), and
    # nothing went back on the way, in any write the API server stored.
    wait_for(lambda: all(any(e.reason in ("Adopted", "Created") for e in kube.events(namespace, n)
                             if "attempt 2" in (e.message or "")) for n in names), 60, "attempt 2 adopted")
    assert settled()
    recorder.stop()
    assert recorder.regressions == []
    assert all(recorder.seen[n] == (2, 1) for n in names)


def test_ready_stays_true_for_a_running_job_across_an_operator_restart(own_operator, kube, namespace):
    op = own_operator()
    _create(kube, namespace, "steady", tiny())
    kube.wait_ptj(namespace, "steady-a1")
    kube.set_ptj_condition(namespace, "steady-a1", "Running")
    kube.wait_phase(namespace, "steady", "Running")
    op.stop(signal.SIGTERM)
    op.start()
    wait_for(lambda: sum(e.reason == "Adopted" for e in kube.events(namespace, "steady")) >= 1, 30,
             "the restarted operator to resume the job")
    kube.cluster.kubectl("wait", "--for=condition=Ready", "llmtj/steady", "-n", namespace, "--timeout=10s")
    status = kube.status(namespace, "steady")
    assert status["phase"] == "Running"
    assert [c["status"] for c in status["conditions"] if c["type"] == "Ready"] == ["True"]
