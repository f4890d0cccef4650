"""The job backend's headless Service, made sure of by act.finish for the live attempt's child once
per child per operator process (controller/adapters/companions.py), with the API calls recorded
(the Kubernetes client is the boundary faked here; tests/chain/test_job_backend_chain.py runs the
same code against the real API server and Job controller)."""

from __future__ import annotations

import copy

from prometheus_client import CollectorRegistry

from llmtrain.controller.adapters.metrics import OperatorMetrics
from llmtrain.controller.operator import Operator
from llmtrain.controller.policy.config import OperatorConfig
from llmtrain.controller.reconciler import reconcile

from .decide_world import UID, batch_job, tiny
from .test_act_order import FakeKube, _job


class JobKube(FakeKube):
    """The API server's answers for batch Jobs (a uid on the created Job) and Services."""

    def create_child(self, kind, obj):
        made, created = super().create_child(kind, obj)
        made["metadata"]["uid"] = f"uid-of-{made['metadata']['name']}"
        return made, created

    def create_service(self, obj):
        ref = obj["metadata"]["ownerReferences"][0]
        self.calls.append(("service", obj["metadata"]["name"], ref["kind"], ref["uid"]))
        return True


def _operator(kube):
    cfg = OperatorConfig(default_etcd_endpoint="etcd.test.svc:2379", backends=("job",), default_backend="job")
    return Operator(cfg, OperatorMetrics(CollectorRegistry()), kube=kube)


def _child(attempt: int, state: str | None = "Created") -> dict:
    child = batch_job(attempt, state, raw_spec=tiny())
    child["metadata"]["uid"] = f"uid-of-j-a{attempt}"
    child["metadata"]["ownerReferences"] = [
        {"apiVersion": "llmtrain.dev/v1alpha1", "kind": "LLMTrainingJob", "uid": UID, "controller": True}
    ]
    return child


def _status(phase: str, attempt: int = 1) -> dict:
    return {
        "phase": phase,
        "attempt": attempt,
        "restarts": attempt - 1,
        "child": f"j-a{attempt}",
        "backend": "job",
        "observedGeneration": 1,
    }


def test_a_new_jobs_service_is_created_once_its_job_exists_owned_by_it():
    kube = JobKube(_job())
    op = _operator(kube)
    reconcile(op, ("ns", "j"), kube.get_job("ns", "j"))
    calls = [c for c in kube.calls if c[0] != "get"]
    assert calls == [
        ("create", "j-a1"),
        ("status", "100", "Pending"),
        ("service", "j-a1", "Job", "uid-of-j-a1"),
        ("event", "Created"),
    ]
    reconcile(op, ("ns", "j"), kube.get_job("ns", "j"))  # nothing new: no second create of either
    assert [c for c in kube.calls if c[0] in ("create", "service")] == calls[:1] + calls[2:3]


def test_an_operator_killed_between_the_job_and_its_service_creates_the_service_after_its_restart():
    """The watch brings the Job to the new process: no create is planned for it, and the Service is
    still made, once."""
    kube = JobKube(_job(_status("Pending")))
    op = _operator(kube)  # the restarted process
    op.attempts.put(_child(1))
    for _ in range(2):
        reconcile(op, ("ns", "j"), kube.get_job("ns", "j"))
    assert [c for c in kube.calls if c[0] in ("create", "service")] == [("service", "j-a1", "Job", "uid-of-j-a1")]
    again = _operator(kube)  # and once per process: a 409 there says it is there
    again.attempts.put(_child(1))
    reconcile(again, ("ns", "j"), kube.get_job("ns", "j"))
    assert [c for c in kube.calls if c[0] == "service"] == [("service", "j-a1", "Job", "uid-of-j-a1")] * 2


def test_no_service_for_an_ended_job_a_superseded_attempt_or_another_backends_child():
    ended = JobKube(_job(_status("Succeeded")))
    op = _operator(ended)
    op.attempts.put(_child(1, "Succeeded"))
    reconcile(op, ("ns", "j"), ended.get_job("ns", "j"))
    assert not [c for c in ended.calls if c[0] == "service"]

    restarted = JobKube(_job(_status("Restarting", attempt=2)))
    op = _operator(restarted)
    op.attempts.put(_child(1, "Failed"))  # attempt 1's Job, left over: deleted, not given a Service
    reconcile(op, ("ns", "j"), restarted.get_job("ns", "j"))
    assert ("delete", "j-a1") in restarted.calls
    assert ("service", "j-a1", "Job", "uid-of-j-a1") not in restarted.calls

    hand_made = copy.deepcopy(_child(1))
    hand_made["metadata"]["ownerReferences"] = []  # a Job someone else made under the attempt's name
    other = JobKube(_job(_status("Pending")))
    op = _operator(other)
    op.attempts.put(hand_made)
    reconcile(op, ("ns", "j"), other.get_job("ns", "j"))
    assert not [c for c in other.calls if c[0] == "service"]
