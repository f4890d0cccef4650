"""The operator under restarts and concurrency, against the real apiserver: an attempt never goes
back, no attempt's child lives twice, Ready survives a restart, restart backoff survives one, slow
metrics endpoints delay no new job, a standby takes over.

Every test here starts its own operator(s), watching only its namespace, and no operator is shared
by the module: one would act on these tests' jobs too (OperatorProcess.start refuses). The bad-input
tests, on a shared operator, are in test_operator_inputs.py.

The operator SIGKILLed through a restart storm and the two-replica failover run on both backends
(the `backend` fixture: the test writes the child's status as its controller would, a PyTorchJob's
condition or a JobSet's); the rest never reach a child's controller's words and run once."""

from __future__ import annotations

import datetime as dt
import signal
import threading

import pytest
from kubernetes import client, watch

from backend_child import OPERATOR_ARGS, live_names
from llmtrain.spec import GROUP, PLURAL, VERSION

from .conftest import OperatorProcess, wait_for
from .test_operator_cluster import tiny


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
        try:
            self._record()
        except Exception:  # noqa: BLE001 — the stream ends when stop() closes it
            pass

    def _record(self):
        for event in self._watch.stream(
            self.custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL, timeout_seconds=600
        ):
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


def _create(kube, namespace: str, name: str, spec: dict, backend: str | None = None) -> None:
    if backend:
        spec = {**spec, "cluster": {**spec["cluster"], "backend": backend}}
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, kube.job_doc(name, spec))


@pytest.fixture
def own_operator(dev_cluster, trainer_endpoint, tmp_path, namespace):
    """start(*flags): an operator of this test's own, watching only its namespace (no other operator
    may act there meanwhile: OperatorProcess.start refuses), SIGKILLed at the end."""
    ops = []

    def start(*extra_args) -> OperatorProcess:
        op = OperatorProcess(
            dev_cluster.kubeconfig,
            tmp_path / f"operator-{len(ops)}.log",
            trainer_endpoint[1],
            ["--namespace", namespace, *extra_args],
        )
        op.start()
        ops.append(op)
        return op

    yield start
    for op in ops:
        op.stop(signal.SIGKILL)


@pytest.mark.slow
def test_attempts_failed_while_the_operator_was_down_go_forward_exactly_once(own_operator, kube, namespace, backend):
    names = [f"storm-{i}" for i in range(20)]
    recorder = AttemptRecorder(kube.api, namespace)
    op = own_operator("--verbose", *OPERATOR_ARGS)
    for name in names:
        _create(kube, namespace, name, tiny(resilience={"maxRestarts": 3}), backend)
    for name in names:
        wait_for(lambda name=name: kube.status(namespace, name).get("child") == f"{name}-a1", 60, f"{name} recorded")
    op.stop(signal.SIGKILL)
    for name in names:  # the child's controller marks every attempt Failed while ours is down
        kube.set_child_state(backend, namespace, f"{name}-a1", "Failed", "worker 0 exited with code 137")
    op.start()
    # And once more in the middle of the restart storm: some jobs moved on, others not yet.
    wait_for(lambda: any(kube.status(namespace, n).get("attempt") == 2 for n in names), 60, "the storm to start")
    op.stop(signal.SIGKILL)
    op.start()

    last: list = []

    def settled() -> bool:
        for name in names:
            status = kube.status(namespace, name)
            live = live_names(kube.children(backend, namespace, name))
            state = (status.get("attempt"), status.get("restarts"), status.get("child"), live)
            if state != (2, 1, f"{name}-a2", [f"{name}-a2"]):
                last[:] = [name, state, status.get("phase"), status.get("message")]
                return False
        return True

    try:
        wait_for(settled, 90, "every job at attempt 2 / restarts 1 with only <job>-a2 alive")
    except AssertionError as err:
        raise AssertionError(f"{err}; e.g. {last}") from None
    # The resumed operator's handlers have all run (every job was re-adopted or restarted), and
    # nothing went back on the way, in any write the API server stored.
    wait_for(
        lambda: all(
            any(
                e.reason in ("Adopted", "Created")
                for e in kube.events(namespace, n)
                if "attempt 2" in (e.message or "")
            )
            for n in names
        ),
        60,
        "attempt 2 adopted",
    )
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
    wait_for(
        lambda: sum(e.reason == "Adopted" for e in kube.events(namespace, "steady")) >= 1,
        30,
        "the restarted operator to resume the job",
    )
    kube.cluster.kubectl("wait", "--for=condition=Ready", "llmtj/steady", "-n", namespace, "--timeout=10s")
    status = kube.status(namespace, "steady")
    assert status["phase"] == "Running"
    assert [c["status"] for c in status["conditions"] if c["type"] == "Ready"] == ["True"]


def _time(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


@pytest.mark.slow
def test_restart_backoff_spaces_attempts_and_survives_an_operator_restart(own_operator, kube, namespace):
    op = own_operator()
    _create(
        kube,
        namespace,
        "loop",
        tiny(resilience={"maxRestarts": 5, "restartBackoffSeconds": 3, "maxRestartBackoffSeconds": 6}),
    )
    kube.wait_ptj(namespace, "loop-a1")
    # Attempt 1 fails: attempt 2 after 3 s.
    failed_at = dt.datetime.now(dt.UTC).replace(microsecond=0)
    kube.set_ptj_condition(namespace, "loop-a1", "Failed", "worker 0 exited with code 1")
    waiting = wait_for(
        lambda: (s := kube.status(namespace, "loop")).get("attempt") == 2 and s, 15, "attempt 2 recorded"
    )
    due = _time(waiting["nextAttemptTime"])
    assert 2 <= (due - failed_at).total_seconds() <= 5, (failed_at, due)
    assert "restart backoff 3 s" in waiting["message"] and waiting["nextAttemptTime"] in waiting["message"]
    second = kube.wait_ptj(namespace, "loop-a2", timeout=20)
    assert _time(second["metadata"]["creationTimestamp"]) >= due
    # act() creates the child before its one status write: the field goes with that write, just after
    wait_for(lambda: "nextAttemptTime" not in kube.status(namespace, "loop"), 10, "nextAttemptTime cleared")

    # Attempt 2 fails: 6 s (doubled). The operator dies right after recording it; the one that
    # starts again must still wait for status.nextAttemptTime.
    failed_at = dt.datetime.now(dt.UTC).replace(microsecond=0)
    kube.set_ptj_condition(namespace, "loop-a2", "Failed", "worker 0 exited with code 1")
    waiting = wait_for(
        lambda: (s := kube.status(namespace, "loop")).get("attempt") == 3 and s, 15, "attempt 3 recorded"
    )
    op.stop(signal.SIGKILL)
    due = _time(waiting["nextAttemptTime"])
    assert 5 <= (due - failed_at).total_seconds() <= 8, (failed_at, due)
    assert not kube.ptjs(namespace, "loop") or live_names(kube.ptjs(namespace, "loop")) in ([], ["loop-a2"])
    op.start()
    third = kube.wait_ptj(namespace, "loop-a3", timeout=30)
    assert _time(third["metadata"]["creationTimestamp"]) >= due
    status = kube.status(namespace, "loop")
    assert (status["attempt"], status["restarts"]) == (3, 2)


# --- progress scraping is off the handler threads (defect 9) -------------------------------------


@pytest.fixture
def slow_metrics_port():
    """A rank-0 metrics endpoint that takes 5 s to answer each scrape (an overloaded trainer)."""
    import http.server
    import time

    from llmtrain_devcluster.process import free_port

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            time.sleep(5)
            try:
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"llmtrain_trainer_step 1\n")
            except OSError:
                pass

        def log_message(self, *_):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Slow)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.mark.slow
def test_slow_metrics_endpoints_do_not_delay_a_new_jobs_pytorchjob(
    dev_cluster, kube, namespace, tmp_path, slow_metrics_port
):
    import time

    from llmtrain_devcluster.standins import running_at, worker0_pod

    op = OperatorProcess(
        dev_cluster.kubeconfig, tmp_path / "operator.log", slow_metrics_port, ["--namespace", namespace]
    )
    op.start()
    try:
        running = [f"busy-{i}" for i in range(40)]
        for name in running:
            _create(kube, namespace, name, tiny())
        for name in running:
            kube.wait_ptj(namespace, f"{name}-a1")
            ptj = kube.ptj(namespace, f"{name}-a1")
            kube.core.create_namespaced_pod(namespace, worker0_pod(name, 1, "llmtrain-trainer:dev", owner=ptj))
            kube.core.patch_namespaced_pod_status(f"{name}-a1-worker-0", namespace, running_at("127.0.0.1"))
            kube.set_ptj_condition(namespace, f"{name}-a1", "Running")
        for name in running:
            kube.wait_phase(namespace, name, "Running")
        # Every running job's scrape now hangs for 5 s, every 0.5 s. A new job must still get its
        # PyTorchJob as fast as on an idle operator (the idle figure is well under a second).
        latencies = []
        for i in range(3):
            started = time.monotonic()
            _create(kube, namespace, f"fresh-{i}", tiny())
            kube.wait_ptj(namespace, f"fresh-{i}-a1", timeout=30)
            latencies.append(time.monotonic() - started)
        # The defect took 8-12 s; idle it is well under 1 s. 4 s leaves room for a machine whose 2
        # cores other work is using (2.1 s was seen at load average 14) and still catches it.
        assert max(latencies) < 4.0, latencies
    finally:
        op.stop(signal.SIGKILL)


# --- leader election: exactly one replica acts, failover in seconds (defect 10) -------------------


def _lease_holder(kube, namespace: str) -> str | None:
    try:
        lease = client.CoordinationV1Api(kube.api).read_namespaced_lease("llmtrain-operator", namespace)
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise
    return lease.spec.holder_identity


@pytest.mark.slow
def test_two_replicas_one_acts_and_the_standby_takes_over_within_seconds(own_operator, kube, namespace, backend):
    import os
    import time

    args = ("--leader-elect", "--leader-election-namespace", namespace, "--leader-lease-seconds", "3", *OPERATOR_ARGS)
    first = own_operator(*args)
    wait_for(lambda: _lease_holder(kube, namespace), 30, "a leader")
    second = own_operator(*args)
    host = os.uname().nodename
    by_identity = {f"{host}-{op.proc.pid}": op for op in (first, second)}
    leader = by_identity[_lease_holder(kube, namespace)]
    standby = second if leader is first else first
    assert "waiting to acquire lease" in standby.log_path.read_text()

    recorder = AttemptRecorder(kube.api, namespace)
    names = [f"ha-{i}" for i in range(10)]
    for name in names:
        _create(kube, namespace, name, tiny(resilience={"maxRestarts": 3}), backend)
    for name in names:
        wait_for(lambda name=name: kube.status(namespace, name).get("child") == f"{name}-a1", 60, f"{name} recorded")
    # Only the leader acted: the standby never got the lease, so it never started its handlers.
    assert "acquired lease" not in standby.log_path.read_text()

    leader.stop(signal.SIGKILL)
    killed = time.time()
    for name in names:
        kube.set_child_state(backend, namespace, f"{name}-a1", "Failed", "node lost")
    wait_for(lambda: _lease_holder(kube, namespace) == f"{host}-{standby.proc.pid}", 30, "the standby to lead")
    # When the standby took the Lease is the acquireTime it wrote (a microsecond timestamp from this
    # machine's clock), not when this test next looked: the ten status writes above and the polling
    # took 15 s at a CI run's load, which is the test's latency, not the failover's.
    lease = client.CoordinationV1Api(kube.api).read_namespaced_lease("llmtrain-operator", namespace)
    took_over = lease.spec.acquire_time.timestamp() - killed
    assert 0 < took_over < 3 + 3, took_over  # the lease (3 s) plus a few renewal rounds

    def settled() -> bool:
        return all(
            (kube.status(namespace, n).get("attempt"), kube.status(namespace, n).get("restarts")) == (2, 1)
            and live_names(kube.children(backend, namespace, n)) == [f"{n}-a2"]
            for n in names
        )

    wait_for(settled, 60, "every job at attempt 2 with only <job>-a2 after the failover")
    recorder.stop()
    assert recorder.regressions == []
