"""The health rules in the operator, as a real process against the real kube-apiserver: NaN,
loss-spike and no-first-step restarts (with the rollback step carried into the next attempt's
pods), the rollback acknowledged by the next attempt, and the stale-checkpoint warning. (The hang
rule: test_operator_cluster.py::test_progress_from_rank0_metrics_and_restart_on_hang.)

Rank 0 is a stand-in: the trainer's own TrainerMetrics registry served on the operator's
--trainer-metrics-port at a loopback address of its own (127.0.0.N, all loopback on Linux), which is
the pod IP the test reports for the attempt's worker 0. So each test's job is scraped from its own
endpoint, and the trainer itself is not under test here (tests/trainer/test_trainer_rollback.py)."""

from __future__ import annotations

import time
from contextlib import contextmanager

import pytest
from prometheus_client import start_http_server

from llmtrain_devcluster.process import free_port
from llmtrain_devcluster.standins import running_at, worker0_pod

from .conftest import OperatorProcess, wait_for
from .test_operator_cluster import tiny


@pytest.fixture(scope="module")
def health_operator(dev_cluster, tmp_path_factory):
    op = OperatorProcess(dev_cluster.kubeconfig, tmp_path_factory.mktemp("operator") / "operator.log", free_port())
    op.start()
    yield op
    op.stop()


@contextmanager
def rank0(op: OperatorProcess, ip: str):
    from llmtrain_trainer.metrics.prometheus import TrainerMetrics

    metrics = TrainerMetrics(job="standin", rank=0)
    server, thread = start_http_server(op.trainer_metrics_port, addr=ip, registry=metrics.registry)
    try:
        yield metrics
    finally:
        server.shutdown()
        thread.join(5)


def start_attempt(kube, namespace: str, name: str, attempt: int, ip: str, metrics=None) -> None:
    """Worker 0's pod of the attempt at `ip`, and its PyTorchJob Running (as Kubeflow reports it);
    with `metrics`, a step completes once the attempt is Running (a heartbeat from before the
    attempt started is the previous attempt's, which the rules ignore)."""
    ptj = kube.wait_ptj(namespace, f"{name}-a{attempt}")
    kube.core.create_namespaced_pod(namespace, worker0_pod(name, attempt, "llmtrain-trainer:dev", owner=ptj))
    kube.core.patch_namespaced_pod_status(f"{name}-a{attempt}-worker-0", namespace, running_at(ip))
    kube.set_ptj_condition(namespace, f"{name}-a{attempt}", "Running")
    kube.wait_phase(namespace, name, "Running")
    if metrics is not None:
        metrics.heartbeat_timestamp_seconds.set(time.time())


def condition(status: dict, type_: str) -> dict:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


def env_of(ptj: dict) -> dict:
    container = ptj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in container["env"]}


def set_clock(kube, namespace: str, name: str, minutes_ago: float) -> None:
    """Move the attempt's start into the past (the same clock the hang test moves)."""
    t = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - minutes_ago * 60))
    kube.custom.patch_namespaced_custom_object_status(
        "llmtrain.dev", "v1alpha1", namespace, "llmtrainingjobs", name, {"status": {"attemptStartTime": t}}
    )


def warnings(kube, namespace: str, name: str, reason: str) -> list:
    return [e for e in kube.events(namespace, name) if e.reason == reason and e.type == "Warning"]


def test_nan_losses_restart_before_the_first_bad_step_and_the_next_attempt_acknowledges(
    health_operator, kube, namespace
):
    name, ip = "nan", "127.0.0.11"
    kube.apply(
        namespace,
        kube.job_doc(
            name, tiny(resilience={"nonFiniteLossSteps": 3, "maxRestarts": 3}, checkpoint={"uri": "s3://bucket/nan/"})
        ),
    )
    with rank0(health_operator, ip) as m:
        m.step.set(40)
        start_attempt(kube, namespace, name, 1, ip, m)
        wait_for(
            lambda: condition(kube.status(namespace, name), "TrainingHealthy").get("status") == "True",
            30,
            "TrainingHealthy True while steps complete",
        )
        # Steps 41 and 42 were NaN, then 43, 44 (all between two scrapes): a run of 4 from step 41.
        t0 = time.monotonic()
        m.nonfinite_loss_steps.set(4)
        m.nonfinite_loss_max_steps.set(4)
        m.nonfinite_loss_first_step.set(41)
        m.loss.set(float("nan"))
        m.step.set(44)
        ptj2 = kube.wait_ptj(namespace, f"{name}-a2")
        print(f"NaN run → attempt 2's PyTorchJob: {time.monotonic() - t0:.2f} s (--progress-interval 0.5)")
        status = kube.status(namespace, name)
        assert (status["attempt"], status["reason"], status["resumeBeforeStep"]) == (2, "NonFiniteLoss", 41)
        assert "NaN/Inf for 4 consecutive steps from step 41" in status["message"]
        cond = condition(status, "TrainingHealthy")
        assert (cond["status"], cond["reason"]) == ("False", "NonFiniteLoss")
        assert env_of(ptj2)["LLMTRAIN_RESUME_BEFORE_STEP"] == "41"
        wait_for(lambda: warnings(kube, namespace, name, "Restarting"), 30, "a Restarting event")

        # Attempt 2's trainer resumed before step 41 and says so; its loss is finite again.
        for g in (m.nonfinite_loss_steps, m.nonfinite_loss_max_steps, m.nonfinite_loss_first_step):
            g.set(0)
        m.loss.set(2.4)
        m.resumed_before_step.set(41)
        start_attempt(kube, namespace, name, 2, ip, m)
        status = wait_for(
            lambda: (
                (s := kube.status(namespace, name)).get("resumeBeforeStep") is None
                and condition(s, "TrainingHealthy").get("status") == "True"
                and s
            ),
            30,
            "the rollback acknowledged and TrainingHealthy again",
        )
        assert status["attempt"] == 2 and status["restarts"] == 1
        wait_for(
            lambda: [e for e in kube.events(namespace, name) if e.reason == "RolledBack"], 30, "a RolledBack event"
        )


def test_loss_spike_restarts_before_the_spike(health_operator, kube, namespace):
    name, ip = "spike", "127.0.0.12"
    kube.apply(
        namespace,
        kube.job_doc(
            name,
            tiny(
                resilience={"lossSpikeFactor": 2.5, "lossSpikeMinSteps": 100, "maxRestarts": 3},
                checkpoint={"uri": "s3://bucket/spike/"},
            ),
        ),
    )
    with rank0(health_operator, ip) as m:
        m.step.set(300)
        m.loss_spike_step.set(250)  # a spike under the factor: recorded by the trainer, not acted on
        m.loss_spike_ratio.set(2.2)
        start_attempt(kube, namespace, name, 1, ip, m)
        wait_for(
            lambda: kube.status(namespace, name).get("progress", {}).get("lossSpikeStep") == 250,
            30,
            "the spike facts in status.progress",
        )
        m.step.set(301)
        wait_for(lambda: kube.status(namespace, name)["progress"]["step"] == 301, 30, "the next scrape")
        assert kube.status(namespace, name)["attempt"] == 1
        t0 = time.monotonic()
        m.loss_spike_step.set(290)
        m.loss_spike_ratio.set(3.4)
        ptj2 = kube.wait_ptj(namespace, f"{name}-a2")
        print(f"loss spike → attempt 2's PyTorchJob: {time.monotonic() - t0:.2f} s (--progress-interval 0.5)")
        status = kube.status(namespace, name)
        assert (status["attempt"], status["reason"], status["resumeBeforeStep"]) == (2, "LossSpike", 290)
        assert "s3://bucket/spike/quarantine/" in status["message"]
        assert condition(status, "TrainingHealthy")["reason"] == "LossSpike"
        assert env_of(ptj2)["LLMTRAIN_RESUME_BEFORE_STEP"] == "290"


def test_no_first_step_within_the_allowance_restarts(health_operator, kube, namespace):
    name, ip = "slowstart", "127.0.0.13"
    kube.apply(
        namespace,
        kube.job_doc(name, tiny(resilience={"firstStepTimeoutMinutes": 20, "hangTimeoutMinutes": 5, "maxRestarts": 3})),
    )
    with rank0(health_operator, ip):  # serving, but no step yet: loading
        start_attempt(kube, namespace, name, 1, ip)
        set_clock(kube, namespace, name, minutes_ago=10)  # past hangTimeoutMinutes, within the allowance
        wait_for(lambda: kube.status(namespace, name).get("progress", {}).get("updateTime"), 30, "a scrape")
        time_of_scrape = kube.status(namespace, name)["progress"]["updateTime"]
        wait_for(
            lambda: kube.status(namespace, name)["progress"]["updateTime"] != time_of_scrape,
            30,
            "a scrape after the clock moved",
        )
        assert kube.status(namespace, name)["attempt"] == 1  # loading for 10 min is not a hang
        t0 = time.monotonic()
        set_clock(kube, namespace, name, minutes_ago=21)
        kube.wait_ptj(namespace, f"{name}-a2")
        print(f"past firstStepTimeoutMinutes → attempt 2's PyTorchJob: {time.monotonic() - t0:.2f} s")
        status = kube.status(namespace, name)
        assert (status["attempt"], status["reason"]) == (2, "NoFirstStep")
        assert "firstStepTimeoutMinutes 20" in status["message"] and "resumeBeforeStep" not in status
        assert condition(status, "TrainingHealthy")["reason"] == "NoFirstStep"


def test_stale_checkpoint_is_a_warning_condition_without_a_restart(health_operator, kube, namespace):
    name, ip = "stale", "127.0.0.14"
    kube.apply(namespace, kube.job_doc(name, tiny(checkpoint={"uri": "s3://bucket/stale/", "intervalMinutes": 5})))
    with rank0(health_operator, ip) as m:
        m.step.set(10)
        start_attempt(kube, namespace, name, 1, ip, m)
        wait_for(
            lambda: condition(kube.status(namespace, name), "TrainingHealthy").get("status") == "True",
            30,
            "TrainingHealthy",
        )
        assert not condition(kube.status(namespace, name), "CheckpointStale")  # 0 of 10 minutes
        t0 = time.monotonic()
        set_clock(kube, namespace, name, minutes_ago=11)  # 2 × intervalMinutes without a checkpoint
        status = wait_for(
            lambda: (
                (s := kube.status(namespace, name)) and condition(s, "CheckpointStale").get("status") == "True" and s
            ),
            30,
            "CheckpointStale",
        )
        print(f"past 2 × intervalMinutes → CheckpointStale=True: {time.monotonic() - t0:.2f} s")
        cond = condition(status, "CheckpointStale")
        assert cond["reason"] == "NoRecentCheckpoint" and "2 × checkpoint.intervalMinutes (5)" in cond["message"]
        wait_for(lambda: warnings(kube, namespace, name, "NoRecentCheckpoint"), 30, "a warning event")
        m.last_checkpoint_step.set(10)
        m.last_checkpoint_timestamp_seconds.set(time.time())
        status = wait_for(
            lambda: (
                (s := kube.status(namespace, name)) and condition(s, "CheckpointStale").get("status") == "False" and s
            ),
            30,
            "CheckpointStale cleared",
        )
        assert condition(status, "CheckpointStale")["reason"] == "CheckpointRecent"
        assert (status["attempt"], status.get("restarts", 0), status["phase"]) == (1, 0, "Running")
