"""act's fixed order, with the API calls recorded (the Kubernetes client is the boundary faked
here; the cluster tests run the same code against the real API server): create before the status
write, one status write conditional on the observed resourceVersion, deletions and events only
after it applied, a conflict read again and decided again."""

from __future__ import annotations

import copy
import datetime as dt

from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from llmtrain.controller.config import OperatorConfig
from llmtrain.controller.metrics import OperatorMetrics
from llmtrain.controller.operator import Operator
from llmtrain.controller.reconciler import reconcile
from llmtrain.controller.status import timestamp

from .decide_world import UID, ptj, tiny


class FakeKube:
    def __init__(self, job: dict, conflicts: int = 0):
        self.job, self.calls, self.conflicts, self.rv = job, [], conflicts, 100

    def create_pytorchjob(self, obj):
        self.calls.append(("create", obj["metadata"]["name"]))
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = "1"
        return obj, True

    def patch_job_status(self, namespace, name, status, resource_version=None):
        self.calls.append(("status", resource_version, status.get("phase")))
        if self.conflicts:
            self.conflicts -= 1
            self.rv += 1  # someone else wrote
            self.job["metadata"]["resourceVersion"] = str(self.rv)
            raise ApiException(status=409, reason="Conflict")
        assert resource_version == self.job["metadata"]["resourceVersion"]
        self.rv += 1
        self.job = {
            **self.job,
            "metadata": {**self.job["metadata"], "resourceVersion": str(self.rv)},
            "status": {k: v for k, v in {**(self.job.get("status") or {}), **status}.items() if v is not None},
        }
        return copy.deepcopy(self.job)

    def get_job(self, namespace, name):
        self.calls.append(("get",))
        return copy.deepcopy(self.job)

    def get_pytorchjob(self, namespace, name):
        self.calls.append(("get-ptj", name))
        return None

    def delete_pytorchjob(self, namespace, name):
        self.calls.append(("delete", name))

    def post_event(self, ref, warning, reason, message):
        self.calls.append(("event", reason))


def _job(status=None):
    return {
        "metadata": {"name": "j", "namespace": "ns", "uid": UID, "generation": 1, "resourceVersion": "100"},
        "spec": tiny(),
        "status": status or {},
    }


def _operator(kube):
    return Operator(
        OperatorConfig(default_etcd_endpoint="etcd.test.svc:2379"), OperatorMetrics(CollectorRegistry()), kube=kube
    )


def test_a_new_job_is_created_then_recorded_then_announced():
    kube = FakeKube(_job())
    op = _operator(kube)
    reconcile(op, ("ns", "j"), kube.get_job("ns", "j"))
    calls = [c for c in kube.calls if c[0] != "get"]
    assert calls == [("create", "j-a1"), ("status", "100", "Pending"), ("event", "Created")]
    assert kube.job["status"]["attempt"] == 1 and kube.job["status"]["pytorchJob"] == "j-a1"


def test_a_conflict_is_read_again_and_decided_again_and_nothing_is_created_twice():
    kube = FakeKube(_job(), conflicts=2)
    op = _operator(kube)
    reconcile(op, ("ns", "j"), kube.get_job("ns", "j"))
    calls = [c for c in kube.calls if c[0] != "get"]
    # one create (the second decision adopts what the first one created, from the cache), three writes
    assert [c for c in calls if c[0] == "create"] == [("create", "j-a1")]
    assert [c[1] for c in calls if c[0] == "status"] == ["100", "101", "102"]
    assert calls[-1] == ("event", "Adopted") and kube.job["status"]["phase"] == "Pending"


def test_a_restart_writes_first_then_deletes_the_old_attempt_then_posts_the_event():
    created = timestamp(dt.datetime.now(dt.UTC) - dt.timedelta(minutes=31))
    kube = FakeKube(
        _job(
            {
                "phase": "Pending",
                "attempt": 1,
                "restarts": 0,
                "pytorchJob": "j-a1",
                "observedGeneration": 1,
                "attemptCreationTime": created,
            }
        )
    )
    op = _operator(kube)
    op.attempts.put(ptj(1, "Created"))
    reconcile(op, ("ns", "j"), kube.get_job("ns", "j"))
    calls = [c for c in kube.calls if c[0] not in ("get", "get-ptj")]
    assert calls[:3] == [("status", "100", "Restarting"), ("delete", "j-a1"), ("event", "Restarting")]
    assert kube.job["status"]["attempt"] == 2 and kube.job["status"]["reason"] == "StartupTimeout"


def test_a_conflicting_restart_deletes_nothing_until_its_write_applied():
    created = timestamp(dt.datetime.now(dt.UTC) - dt.timedelta(minutes=31))
    kube = FakeKube(
        _job(
            {
                "phase": "Pending",
                "attempt": 1,
                "restarts": 0,
                "pytorchJob": "j-a1",
                "observedGeneration": 1,
                "attemptCreationTime": created,
            }
        ),
        conflicts=1,
    )
    op = _operator(kube)
    op.attempts.put(ptj(1, "Created"))
    reconcile(op, ("ns", "j"), kube.get_job("ns", "j"))
    calls = [c for c in kube.calls if c[0] not in ("get", "get-ptj")]
    assert calls[0] == ("status", "100", "Restarting")  # refused (409)
    assert calls[1] == ("status", "101", "Restarting")  # decided again on the fresh read
    assert calls[2:4] == [("delete", "j-a1"), ("event", "Restarting")]
    assert kube.job["status"]["attempt"] == 2 and kube.job["status"]["restarts"] == 1  # spent once
