"""act's fixed order, with the API calls recorded (the Kubernetes client is the boundary faked
here; the cluster tests run the same code against the real API server): create before the status
write, one status write conditional on the observed resourceVersion, deletions and events only
after it applied, a conflict read again and decided again."""

from __future__ import annotations

import copy
import datetime as dt

from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from llmtrain.controller.adapters.metrics import OperatorMetrics
from llmtrain.controller.operator import Operator
from llmtrain.controller.policy.config import OperatorConfig
from llmtrain.controller.policy.progress import timestamp
from llmtrain.controller.reconciler import reconcile

from .decide_world import UID, ptj, tiny


class FakeKube:
    def __init__(self, job: dict, conflicts: int = 0):
        self.job, self.calls, self.conflicts, self.rv = job, [], conflicts, 100

    def create_child(self, kind, obj):
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

    def get_child(self, kind, namespace, name):
        self.calls.append(("get-child", name))
        return None

    def delete_child(self, kind, namespace, name):
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
    assert kube.job["status"]["attempt"] == 1 and kube.job["status"]["child"] == "j-a1"


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
                "child": "j-a1",
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
                "child": "j-a1",
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


def test_a_run_that_only_waits_for_the_watch_leaves_the_goodput_series_to_the_next_run():
    # After an operator restart a job's first run often comes before its PyTorchJob's watch event:
    # that run waits (awaiting_watch); the goodput series are the run that adopts it's to set.
    import time

    from llmtrain import goodput as gp

    created = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    goodput = gp.opened({}, 1, created.timestamp(), created.timestamp())
    status = {
        "phase": "Pending",
        "attempt": 1,
        "restarts": 0,
        "child": "j-a1",
        "observedGeneration": 1,
        "attemptCreationTime": timestamp(created),
        "goodput": goodput,
    }
    kube = FakeKube(_job(status))
    op = _operator(kube)
    op.loop, op._watch_started = object(), time.monotonic()  # the watch has just started
    assert reconcile(op, ("ns", "j"), kube.get_job("ns", "j")) is not None  # look again soon
    assert ("get-ptj", "j-a1") not in kube.calls and op.metrics.goodput._jobs == {}
    op.attempts.put(ptj(1, "Created"))  # its watch event
    reconcile(op, ("ns", "j"), kube.get_job("ns", "j"))
    assert ("event", "Adopted") in kube.calls and ("ns", "j") in op.metrics.goodput._jobs


def test_right_after_a_start_a_job_waits_for_its_recorded_pytorchjobs_event_instead_of_running_twice():
    # After an operator restart the jobs' events come before their PyTorchJobs'. A job whose
    # recorded PyTorchJob is not in the cache yet is kept, not run: that PyTorchJob's event queues
    # it, and it is reconciled once, adopting it.
    import time

    status = {"phase": "Pending", "attempt": 1, "restarts": 0, "child": "j-a1", "observedGeneration": 1}
    kube = FakeKube(_job(status))
    op = _operator(kube)
    op.loop, op._watch_started = object(), time.monotonic()
    key = ("ns", "j")
    op.saw_job("ns", "j", kube.get_job("ns", "j"))
    assert key not in op.queue._queued and key in op.queue._due  # kept until its child's event, or 1 s
    assert op.queue.get(key) is not None  # what the PyTorchJob's event looks for to queue the job
    # a job whose PyTorchJob the watch brought first runs at once
    first = _operator(kube)
    first.loop, first._watch_started = object(), time.monotonic()
    first.attempts.put(ptj(1, "Created"))
    first.saw_job("ns", "j", kube.get_job("ns", "j"))
    assert key in first.queue._queued
    # once the job has been reconciled, or the watch is no longer fresh, every event runs it
    op.mark_seen(key)
    op.saw_job("ns", "j", kube.get_job("ns", "j"))
    assert key in op.queue._queued
