"""Operator pieces that need no cluster: the phase gauge under concurrent handlers, and how the
pods' own words become a Pending job's reason."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry

from llmtrain.controller.adapters.caches import PhaseGauge
from llmtrain.controller.adapters.metrics import OperatorMetrics
from llmtrain.controller.policy.child_status import pod_summary, startup_problem


def test_the_phase_gauge_is_exact_when_many_handler_threads_update_it():
    metrics = OperatorMetrics(CollectorRegistry())
    gauge = PhaseGauge(metrics.jobs)
    errors: list[BaseException] = []
    threads_n, jobs_n = 16, 1500

    def worker(t: int):
        try:
            for i in range(jobs_n):
                gauge.track("ns", f"job-{t}-{i}", "Pending")
                gauge.track("ns", f"job-{t}-{i}", "Running" if i % 3 else "Failed")
                if i % 5 == 0:
                    gauge.track("ns", f"job-{t}-{i}", None)  # deleted
        except BaseException as err:  # noqa: BLE001 — the defect was a RuntimeError from a thread
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    alive = [i for i in range(jobs_n) if i % 5]
    expected = {
        "Pending": 0,
        "Running": sum(1 for i in alive if i % 3) * threads_n,
        "Failed": sum(1 for i in alive if i % 3 == 0) * threads_n,
    }
    for phase, count in expected.items():
        assert metrics.jobs.labels(phase)._value.get() == count, phase


def _pod(name, conditions=(), waiting=None, phase="Pending"):
    status = {"phase": phase, "conditions": list(conditions)}
    if waiting:
        status["containerStatuses"] = [{"name": "pytorch", "state": {"waiting": waiting}}]
    return pod_summary({"metadata": {"name": name, "labels": {}}, "status": status})


def test_an_unschedulable_pod_is_reported_in_the_schedulers_words():
    msg = "0/16 nodes are available: 16 Insufficient vpc.amazonaws.com/efa."
    pods = [
        _pod("j-a1-worker-1"),
        _pod("j-a1-worker-0", [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": msg}]),
    ]
    assert startup_problem(pods) == ("Unschedulable", f"pod j-a1-worker-0: {msg}")


def test_an_image_pull_failure_is_reported_with_the_kubelets_reason():
    pods = [
        _pod(
            "j-a1-worker-0",
            [{"type": "PodScheduled", "status": "True"}],
            {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "nope:1"'},
        )
    ]
    assert startup_problem(pods) == (
        "ImagePullBackOff",
        'pod j-a1-worker-0: container pytorch: ImagePullBackOff: Back-off pulling image "nope:1"',
    )


def test_a_pod_that_is_merely_creating_its_container_is_not_a_problem():
    pods = [_pod("j-a1-worker-0", [{"type": "PodScheduled", "status": "True"}], {"reason": "ContainerCreating"})]
    assert startup_problem(pods) is None and startup_problem([]) is None


def _ptj(rv: int) -> dict:
    from llmtrain.render import JOB_LABEL

    return {"metadata": {"name": "j-a1", "namespace": "ns", "resourceVersion": str(rv), "labels": {JOB_LABEL: "j"}}}


def test_the_attempt_cache_tells_a_new_pytorchjob_version_from_one_it_already_has():
    from llmtrain.controller.adapters.caches import AttemptCache

    cache = AttemptCache()
    assert cache.put(_ptj(5)) is True
    assert cache.put(_ptj(5)) is False  # the watch's echo of our own create's response
    assert cache.put(_ptj(4)) is False and cache.of("ns", "j")["j-a1"]["metadata"]["resourceVersion"] == "5"
    assert cache.put(_ptj(6)) is True and cache.of("ns", "j")["j-a1"]["metadata"]["resourceVersion"] == "6"
    cache.drop("ns", "j", "j-a1")
    assert cache.put(_ptj(6)) is True  # deleted and seen again: new to the cache


def test_kopf_builds_no_diff_base_only_while_no_handler_needs_one():
    import kopf

    from llmtrain.controller import kopfconfig, watch
    from llmtrain.controller.operator import Operator
    from llmtrain.controller.policy.config import OperatorConfig

    registry = kopf.OperatorRegistry()
    watch.register(Operator(OperatorConfig(), OperatorMetrics(CollectorRegistry())), registry)
    settings = kopf.OperatorSettings()
    kopfconfig.apply(settings, registry)  # the operator's own registry: on.event handlers only
    storage = settings.persistence.diffbase_storage
    assert isinstance(storage, kopfconfig.NoDiffBase)
    assert storage.build(body=kopf.Body({"metadata": {"name": "x"}, "spec": {"a": 1}})) is None
    for register in (
        lambda r: kopf.on.update("example.com", "v1", "things", registry=r),
        lambda r: kopf.timer("example.com", "v1", "things", interval=5, registry=r),
        lambda r: kopf.daemon("example.com", "v1", "things", registry=r),
    ):
        registry = kopf.OperatorRegistry()
        register(registry)(lambda **_: None)
        settings = kopf.OperatorSettings()
        kopfconfig.apply(settings, registry)
        assert not isinstance(settings.persistence.diffbase_storage, kopfconfig.NoDiffBase)


def test_the_pod_cache_keeps_each_attempts_pods_until_they_are_deleted():
    from llmtrain.controller.adapters.caches import PodCache

    pods = PodCache()
    pods.put("ns", "j", "1", "j-a1-worker-0", {"name": "j-a1-worker-0", "phase": "Pending"})
    pods.put("ns", "j", "1", "j-a1-worker-1", {"name": "j-a1-worker-1", "phase": "Pending"})
    pods.put("ns", "j", "1", "j-a1-worker-0", {"name": "j-a1-worker-0", "phase": "Running"})  # a later event
    pods.put("ns", "j", "2", "j-a2-worker-0", {"name": "j-a2-worker-0", "phase": "Pending"})
    assert sorted((p["name"], p["phase"]) for p in pods.of("ns", "j", 1)) == [
        ("j-a1-worker-0", "Running"),
        ("j-a1-worker-1", "Pending"),
    ]  # attempt as int or label string
    assert [p["name"] for p in pods.of("ns", "j", "2")] == ["j-a2-worker-0"]
    assert pods.of("other", "j", 1) == [] and pods.of("ns", "j", 3) == []
    pods.drop("ns", "j", "1", "j-a1-worker-0")
    pods.drop("ns", "j", "1", "j-a1-worker-1")
    pods.drop("ns", "j", "1", "never-seen")
    assert pods.of("ns", "j", 1) == [] and pods._by_attempt.keys() == {("ns", "j", "2")}
