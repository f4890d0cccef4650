"""The operator, as a real process, against a real kube-apiserver + etcd + controller-manager with
Kubeflow's own PyTorchJob CRD. The PyTorchJob status is written the way the training-operator
writes it (no training-operator runs here: it would need nodes and pods)."""

from __future__ import annotations

import copy
import glob
import re
import signal
import time

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from llmtrain.backends.pytorchjob import render_pytorchjob
from llmtrain.controller.policy.child_status import parse_time
from llmtrain.planner import checkpoint_blocking_estimate, plan_job
from llmtrain.validation import load_job, parse_spec
from llmtrain_devcluster.standins import running_at, worker0_pod

from .conftest import wait_for
from .invalid_cases import BASE, CASES, spec_with

TINY = {
    "model": {"preset": "tiny"},
    "data": {"seqLen": 64},
    "cluster": {"instanceType": "cpu", "nodes": 1, "processesPerNode": 2, "image": "llmtrain-trainer:dev"},
    "fsdp": {"mixedPrecision": "fp32"},
    "training": {"maxSteps": 20, "globalBatchTokens": 64 * 2 * 2, "microBatchSize": 2, "warmupSteps": 2},
    "rendezvous": {"backend": "c10d"},
    # 1 s instead of the default 10 s: the restart tests need not wait; test_operator_reconciler
    # covers the backoff itself.
    "resilience": {"restartBackoffSeconds": 1},
}


def tiny(**over):
    spec = copy.deepcopy(TINY)
    for k, v in over.items():
        spec.setdefault(k, {}).update(v)
    return spec


def is_subset(small, big) -> bool:
    if isinstance(small, dict):
        return isinstance(big, dict) and all(k in big and is_subset(v, big[k]) for k, v in small.items())
    if isinstance(small, list):
        return isinstance(big, list) and len(small) == len(big) and all(map(is_subset, small, big))
    return small == big


@pytest.mark.parametrize("path", sorted(glob.glob("examples/*.yaml")))
def test_every_example_becomes_a_pytorchjob_the_kubeflow_schema_accepts(path, operator, kube, namespace):
    job = load_job(path)
    kube.cluster.kubectl("apply", "-n", namespace, "-f", path)
    ptj = kube.wait_ptj(namespace, f"{job.name}-a1")
    uid = kube.job(namespace, job.name)["metadata"]["uid"]
    status = kube.wait_phase(namespace, job.name, "Pending")
    inputs = None
    if job.spec.checkpoint.auto:
        # intervalMinutes auto: the MTBF the operator estimated from the cluster's jobs (recorded in
        # status.checkpoint) and, for attempt 1, the planner's blocking estimate go into the pods
        ck = status["checkpoint"]
        assert ck["intervalSource"] == "auto" and ck["attempt"] == 1 and ck["blockingMeasuredSaves"] == 0
        assert 300 <= ck["intervalSeconds"] <= 86400 and ck["reason"].startswith("auto: √(2 × ")
        inputs = (ck["mtbfSeconds"], checkpoint_blocking_estimate(plan_job(job.spec)))
    expected = render_pytorchjob(job.spec, job.name, namespace, 1, uid, "etcd.test.svc:2379", cadence_inputs=inputs)
    # Nothing the renderer wrote was pruned or rewritten by the API server's structural schema.
    assert is_subset(expected["spec"], ptj["spec"])
    assert ptj["metadata"]["ownerReferences"][0]["uid"] == uid
    # And the rendered object passes Kubeflow's schema with strict field validation.
    expected["metadata"]["name"] += "-dry"
    kube.cluster.kubectl("create", "--dry-run=server", "--validate=strict", "-f", "-", input=yaml.safe_dump(expected))
    assert status["child"] == ptj["metadata"]["name"] and status["attempt"] == 1
    assert status["plan"]["fits"] is True
    wait_for(lambda: any(e.reason == "Created" for e in kube.events(namespace, job.name)), 15, "a Created event")


def test_status_follows_the_pytorchjob(operator, kube, namespace):
    kube.apply(namespace, kube.job_doc("follow", tiny()))
    kube.wait_ptj(namespace, "follow-a1")
    kube.set_ptj_condition(namespace, "follow-a1", "Created")
    kube.wait_phase(namespace, "follow", "Pending")
    kube.set_ptj_condition(namespace, "follow-a1", "Running")
    running = kube.wait_phase(namespace, "follow", "Running")
    assert running["startTime"] and any(c["type"] == "Ready" and c["status"] == "True" for c in running["conditions"])
    kube.set_ptj_condition(namespace, "follow-a1", "Succeeded")
    done = kube.wait_phase(namespace, "follow", "Succeeded")
    assert done["completionTime"]
    table = kube.cluster.kubectl("get", "llmtj", "follow", "-n", namespace).stdout
    assert table.split("\n")[0].split()[:7] == ["NAME", "PHASE", "MODEL", "INSTANCE", "NODES", "ATTEMPT", "RESTARTS"]
    assert table.split("\n")[1].split()[:7] == ["follow", "Succeeded", "tiny", "cpu", "1", "1", "0"]
    assert "Succeeded" in table and "tiny" in table
    # Events are posted after the status write they report, asynchronously.
    wait_for(
        lambda: {"Created", "Running", "Succeeded"} <= {e.reason for e in kube.events(namespace, "follow")},
        15,
        "Created, Running and Succeeded events",
    )


def test_failure_restarts_with_a_fresh_rendezvous_until_the_budget_is_spent(operator, kube, namespace):
    kube.apply(namespace, kube.job_doc("flaky", tiny(resilience={"maxRestarts": 1})))
    first = kube.wait_ptj(namespace, "flaky-a1")
    kube.set_ptj_condition(namespace, "flaky-a1", "Running")
    kube.wait_phase(namespace, "flaky", "Running")
    kube.set_ptj_condition(namespace, "flaky-a1", "Failed", "worker 1 exited with code 137")
    second = kube.wait_ptj(namespace, "flaky-a2")
    status = kube.status(namespace, "flaky")
    assert (status["attempt"], status["restarts"], status["phase"]) == (2, 1, "Restarting")
    assert "code 137" in status["message"]
    assert second["spec"]["elasticPolicy"]["rdzvId"] != first["spec"]["elasticPolicy"]["rdzvId"]
    assert status["rendezvousId"] == second["spec"]["elasticPolicy"]["rdzvId"]
    wait_for(
        lambda: [p["metadata"]["name"] for p in kube.ptjs(namespace, "flaky")] == ["flaky-a2"],
        30,
        "the failed attempt's PyTorchJob to be deleted",
    )
    kube.set_ptj_condition(namespace, "flaky-a2", "Failed", "worker 0 exited with code 1")
    failed = kube.wait_phase(namespace, "flaky", "Failed")
    assert failed["reason"] == "RestartBudgetExhausted" and "1 of 1 restarts" in failed["message"]
    assert not any(p["metadata"]["name"] == "flaky-a3" for p in kube.ptjs(namespace, "flaky"))


def test_invalid_jobs_fail_with_their_message_and_the_operator_carries_on(operator, kube, namespace):
    assert len(CASES) >= 15
    for _, name, overrides, _, _ in CASES:
        kube.apply(namespace, kube.job_doc(name, spec_with(overrides)))
    for _, name, _, field, fragment in CASES:
        status = kube.wait_phase(namespace, name, "Failed")
        assert status["reason"] == "InvalidSpec"
        assert field in status["message"] and fragment in status["message"], status["message"]
        assert not kube.ptjs(namespace, name)
    warnings = wait_for(
        lambda: [e for e in kube.events(namespace, CASES[0][1]) if e.type == "Warning"], 15, "a Warning event"
    )
    assert warnings[0].reason == "InvalidSpec"
    kube.apply(namespace, kube.job_doc("still-served", BASE))  # the operator is still serving
    kube.wait_ptj(namespace, "still-served-a1")
    assert operator.proc.poll() is None


@pytest.mark.parametrize(
    "overrides,fragment",
    [
        ({"cluster": {"instanceType": "p9.48xlarge"}}, "spec.cluster.instanceType"),
        ({"model": {"preset": "llama9"}}, "spec.model.preset"),
        ({"cluster": {"nodes": 0}}, "spec.cluster.nodes"),
        ({"fsdp": {"shardingStrategy": "ZERO3"}}, "spec.fsdp.shardingStrategy"),
        ({"model": {"preset": "llama2-7b", "hfToken": "hf_secret"}}, 'unknown field "spec.model.hfToken"'),
        ({"training": {"learningRate": 0}}, "spec.training.learningRate"),
        ({"checkpoint": {"intervalMinutes": "fast"}}, 'intervalMinutes: Invalid value: "fast": must be a whole number'),
        ({"checkpoint": {"intervalMinutes": -5}}, "intervalMinutes: Invalid value: -5: must be a whole number"),
        # Kubernetes names and formats, refused at apply instead of at pod creation (issue 8, defects 4 and 6)
        ({"cluster": {"queueName": "Bad Queue!"}}, "spec.cluster.queueName"),
        ({"rendezvous": {"endpoint": "etcd:notaport"}}, "spec.rendezvous.endpoint"),
        ({"cluster": {"image": "Bad Image!!"}}, "spec.cluster.image"),
        ({"cluster": {"serviceAccountName": "Bad_SA"}}, "spec.cluster.serviceAccountName"),
        ({"cluster": {"priorityClassName": "High Priority"}}, "spec.cluster.priorityClassName"),
        (
            {"cluster": {"volumes": [{"name": "fsx", "claimName": "My PVC", "mountPath": "/fsx"}]}},
            "spec.cluster.volumes[0].claimName",
        ),
        (
            {"model": {"preset": "llama2-7b", "hfTokenSecretRef": {"name": "hf token"}}},
            "spec.model.hfTokenSecretRef.name",
        ),
        ({"cluster": {"nodeSelector": {"bad key!": "x"}}}, "spec.cluster.nodeSelector"),
        ({"cluster": {"nodeSelector": {"pool": "not a label value"}}}, "spec.cluster.nodeSelector.pool"),
        (
            {"cluster": {"nodeSelector": {"node.kubernetes.io/instance-type": "p4d.24xlarge"}}},
            "set from spec.cluster.instanceType",
        ),
    ],
)
def test_the_api_server_rejects_what_the_schema_can(overrides, fragment, kube, namespace):
    result = kube.apply(namespace, kube.job_doc("rejected", spec_with(overrides)), check=False)
    assert result.returncode != 0 and fragment in result.stderr, result.stderr


def test_only_resilience_and_checkpoint_cadence_may_change(operator, kube, namespace):
    kube.apply(namespace, kube.job_doc("mutable", tiny()))
    kube.wait_phase(namespace, "mutable", "Pending")
    bad = kube.cluster.kubectl(
        "patch",
        "llmtj",
        "mutable",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"fsdp":{"shardingStrategy":"NO_SHARD"}}}',
        check=False,
    )
    assert bad.returncode != 0 and "immutable" in bad.stderr and "spec.fsdp" in bad.stderr
    kube.cluster.kubectl(
        "patch",
        "llmtj",
        "mutable",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"resilience":{"maxRestarts":4},"checkpoint":{"keep":5,"intervalMinutes":"auto"}}}',
    )
    job = wait_for(
        lambda: (
            (j := kube.job(namespace, "mutable"))["status"].get("observedGeneration") == j["metadata"]["generation"]
            and j
        ),
        30,
        "observedGeneration to catch up",
    )
    assert job["metadata"]["generation"] == 2 and job["spec"]["checkpoint"]["intervalMinutes"] == "auto"
    assert any(c["type"] == "SpecAccepted" and c["status"] == "True" for c in job["status"]["conditions"])
    assert [p["metadata"]["name"] for p in kube.ptjs(namespace, "mutable")] == ["mutable-a1"]


def test_deleting_the_job_garbage_collects_its_pytorchjob(operator, kube, namespace):
    kube.apply(namespace, kube.job_doc("doomed", tiny()))
    kube.wait_ptj(namespace, "doomed-a1")
    kube.cluster.kubectl("delete", "llmtj", "doomed", "-n", namespace, "--wait=true")
    wait_for(lambda: not kube.ptjs(namespace, "doomed"), 60, "garbage collection of doomed-a1")


def test_progress_from_rank0_metrics_and_restart_on_hang(operator, trainer_endpoint, kube, namespace):
    metrics, _ = trainer_endpoint
    kube.apply(
        namespace,
        kube.job_doc(
            "progress", tiny(resilience={"hangTimeoutMinutes": 30, "maxRestarts": 2}, training={"maxSteps": 100})
        ),
    )
    ptj = kube.wait_ptj(namespace, "progress-a1")
    # The worker pod as the training-operator would create it, with its IP as the kubelet reports it.
    kube.core.create_namespaced_pod(namespace, worker0_pod("progress", 1, "llmtrain-trainer:dev", owner=ptj))
    kube.core.patch_namespaced_pod_status("progress-a1-worker-0", namespace, running_at("127.0.0.1"))
    metrics.step.set(42)
    metrics.loss.set(2.5)
    metrics.tokens_per_second.set(1234.5)
    metrics.mfu.set(0.41)
    metrics.heartbeat_timestamp_seconds.set(time.time())
    metrics.train_start_timestamp_seconds.set(time.time())
    metrics.resume_step.set(40)
    for _ in range(2):
        metrics.step_seconds.observe(2.0)
    # ... and, as the trainer's attempt ledger exports them, the attempt-wide counters the operator
    # prefers (equal to this process's own: no in-place restart yet)
    metrics.attempt_steps.set(2)
    metrics.attempt_step_seconds.set(4.0)
    kube.set_ptj_condition(namespace, "progress-a1", "Running")
    progress = wait_for(
        lambda: (
            kube.status(namespace, "progress").get("progress", {}).get("step") == 42
            and kube.status(namespace, "progress")["progress"]
        ),
        30,
        "progress in status",
    )
    assert (progress["loss"], progress["tokensPerSecond"], progress["mfu"]) == (2.5, 1234.5, 0.41)
    # the goodput counters of attempt 1, and the ETA: the steps left at 2 s each
    assert (progress["attempt"], progress["resumeStep"], progress["attemptSteps"], progress["stepSeconds"]) == (
        1,
        40,
        2,
        4.0,
    )
    assert progress["estimatedRemainingSeconds"] == (100 - 42) * 2 and progress["estimatedCompletionTime"]
    metrics.step.set(43)
    wait_for(lambda: kube.status(namespace, "progress")["progress"]["step"] == 43, 30, "the next scrape")
    assert kube.status(namespace, "progress")["attempt"] == 1  # a moving heartbeat is not a hang

    # Two hours into the attempt, the last step completed an hour ago: longer than hangTimeoutMinutes.
    two_hours_ago = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 7200))
    kube.custom.patch_namespaced_custom_object_status(
        "llmtrain.dev",
        "v1alpha1",
        namespace,
        "llmtrainingjobs",
        "progress",
        {"status": {"attemptStartTime": two_hours_ago}},
    )
    metrics.heartbeat_timestamp_seconds.set(time.time() - 3600)
    kube.wait_ptj(namespace, "progress-a2")
    status = kube.status(namespace, "progress")
    assert status["attempt"] == 2 and status["reason"] == "Hang" and "no training step" in status["message"]
    first = status["goodput"]["attempts"][0]
    assert (first["endReason"], first["resumeStep"], first["attemptSteps"]) == ("Hang", 40, 2)
    # the faked hour-old heartbeat predates the loop's start: the whole loop is the hang
    assert status["goodput"]["seconds"]["hang"] > 0 and status["goodput"]["seconds"]["productive"] == 0
    families = {f.name: f for f in text_string_to_metric_families(operator.metrics())}
    hang = [
        s
        for s in families["llmtrain_operator_job_restarts"].samples
        if s.name.endswith("_total") and s.labels.get("reason") == "Hang" and s.labels["llmtrain_job"] == "progress"
    ]
    assert hang and hang[0].value == 1


def _columns(kube, namespace: str, name: str) -> dict[str, str]:
    """`kubectl get llmtj NAME`, the real kubectl and the CRD's printer columns: header → value
    ("" for a column kubectl leaves empty), each value read where its header starts."""
    header, row = kube.cluster.kubectl("get", "llmtj", name, "-n", namespace).stdout.splitlines()[:2]
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    ends = [*starts[1:], None]
    return {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, ends, strict=True)}


def test_a_job_that_succeeds_shows_its_end(operator, trainer_endpoint, kube, namespace, monkeypatch):
    """kubectl get llmtj after a job succeeds: the trainer's final step, loss, tokens/s and MFU (its
    pod's termination message), goodput, shares as percentages, and no ETA. Before: the monitor's
    last scrape (here three steps short of the end), its ETA, and MFU and GOODPUT as bare ratios."""
    from llmtrain.controller.adapters import kube as opkube
    from llmtrain_devcluster.standins import exited
    from llmtrain_trainer.metrics.prometheus import TrainerMetrics

    served, _ = trainer_endpoint  # what the monitor scrapes while the trainer runs
    end = TrainerMetrics(job="ends", rank=0)  # the trainer's series when it exits (no longer served)
    kube.apply(namespace, kube.job_doc("ends", tiny(training={"maxSteps": 40})))
    ptj = kube.wait_ptj(namespace, "ends-a1")
    kube.core.create_namespaced_pod(namespace, worker0_pod("ends", 1, "llmtrain-trainer:dev", owner=ptj))
    kube.core.patch_namespaced_pod_status("ends-a1-worker-0", namespace, running_at("127.0.0.1"))
    start = time.time()  # the training loop begins; 10 ms a step
    for metrics, step, loss, tps, mfu in ((served, 37, 2.5, 1400.0, 0.1351), (end, 40, 2.25, 1500.0, 0.1085)):
        metrics.train_start_timestamp_seconds.set(start)
        metrics.resume_step.set(0)
        metrics.step.set(step)
        metrics.loss.set(loss)
        metrics.tokens_per_second.set(tps)
        metrics.mfu.set(mfu)
        metrics.attempt_steps.set(step)
        metrics.attempt_step_seconds.set(0.01 * step)
        metrics.heartbeat_timestamp_seconds.set(start + 0.01 * step)
    kube.set_ptj_condition(namespace, "ends-a1", "Running")
    wait_for(
        lambda: (kube.status(namespace, "ends").get("progress") or {}).get("estimatedCompletionTime"),
        30,
        "the scrape of step 37, with its ETA",
    )
    # The trainer ends at step 40 and its pod exits 0 with the final summary as its termination
    # message (what llmtrain_trainer.launch passes on: TrainerMetrics.final_summary, with the
    # steady means of tokens/s and MFU); then the training-operator marks the PyTorchJob Succeeded.
    summary = end.final_summary(tokens_per_second=1480.5, mfu=0.1085)
    kube.core.patch_namespaced_pod_status("ends-a1-worker-0", namespace, exited(0, summary))
    kube.set_ptj_condition(namespace, "ends-a1", "Succeeded")
    done = kube.wait_phase(namespace, "ends", "Succeeded")
    progress, goodput = done["progress"], done["goodput"]
    assert (progress["step"], progress["loss"], progress["tokensPerSecond"]) == (40, 2.25, 1480.5), progress
    assert (progress["mfu"], progress["mfuPercent"]) == (0.1085, "10.85%"), progress
    assert "estimatedCompletionTime" not in progress and "estimatedRemainingSeconds" not in progress, progress
    (record,) = goodput["attempts"]  # closed with the final counters, not the last scrape's
    assert (record["endReason"], record["step"], record["attemptSteps"], record["stepSeconds"]) == (
        "Succeeded",
        40,
        40,
        0.4,
    )
    columns = _columns(kube, namespace, "ends")
    assert (columns["PHASE"], columns["STEP"], columns["LOSS"], columns["TOKENS/S"]) == (
        "Succeeded",
        "40",
        "2.25",
        "1480.5",
    )
    assert columns["MFU"] == "10.85%" and columns["ETA"] == "", columns
    assert columns["GOODPUT"] == f"{goodput['ratio'] * 100:.2f}%", (columns, goodput["ratio"])

    # The monitor writes progress only while the job is Running: a scrape that was under way
    # when the job ended changes nothing (the API server refuses the patch's test).
    monkeypatch.setattr(opkube, "_client", lambda: kube.api)
    late = {**progress, "step": 37, "estimatedCompletionTime": progress["updateTime"]}
    assert opkube.patch_running_progress(namespace, "ends", late) is None
    assert kube.status(namespace, "ends")["progress"] == progress


def test_operator_metrics_count_reconciles_and_phases(operator, kube, namespace):
    def created() -> float:
        fams = {f.name: f for f in text_string_to_metric_families(operator.metrics())}
        return sum(
            s.value
            for s in fams["llmtrain_operator_reconciles"].samples
            if s.name.endswith("_total") and s.labels["outcome"] == "created"
        )

    before = created()
    kube.apply(namespace, kube.job_doc("counted", tiny()))
    kube.wait_ptj(namespace, "counted-a1")
    wait_for(lambda: created() == before + 1, 10, "the created counter")
    text = operator.metrics()
    assert "llmtrain_operator_reconcile_duration_seconds_bucket" in text
    assert 'llmtrain_operator_jobs{phase="Pending"}' in text


def test_an_operator_restart_adopts_and_never_duplicates(operator, kube, namespace):
    kube.apply(namespace, kube.job_doc("survivor", tiny()))
    kube.wait_ptj(namespace, "survivor-a1")
    operator.stop(signal.SIGKILL)
    # While it is down: a job whose PyTorchJob the dead operator had created but not yet recorded.
    kube.apply(namespace, kube.job_doc("orphan", tiny()))
    uid = kube.job(namespace, "orphan")["metadata"]["uid"]
    pre = render_pytorchjob(parse_spec(tiny()), "orphan", namespace, 1, uid, "etcd.test.svc:2379")
    kube.custom.create_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs", pre)
    operator.start()
    status = kube.wait_phase(namespace, "orphan", "Pending")
    assert status["child"] == "orphan-a1"
    wait_for(lambda: any(e.reason == "Adopted" for e in kube.events(namespace, "orphan")), 15, "an Adopted event")
    wait_for(
        lambda: any(e.reason == "Adopted" for e in kube.events(namespace, "survivor")),
        30,
        "the restarted operator to resume survivor",
    )
    assert [p["metadata"]["name"] for p in kube.ptjs(namespace, "survivor")] == ["survivor-a1"]
    assert [p["metadata"]["name"] for p in kube.ptjs(namespace, "orphan")] == ["orphan-a1"]


def test_goodput_is_kept_across_attempts_and_an_operator_restart(operator, kube, namespace):
    """status.goodput through the API server (its schema), two attempts and an operator restart:
    the records survive, the buckets add up to the wall time, the figures reach Prometheus."""
    kube.apply(namespace, kube.job_doc("gp", tiny(resilience={"maxRestarts": 2, "restartBackoffSeconds": 1})))
    kube.wait_ptj(namespace, "gp-a1")
    kube.set_ptj_condition(namespace, "gp-a1", "Running")
    kube.wait_phase(namespace, "gp", "Running")
    kube.set_ptj_condition(namespace, "gp-a1", "Failed", "worker 1 exited with code 137")
    kube.wait_ptj(namespace, "gp-a2")
    g = wait_for(
        lambda: (
            len((kube.status(namespace, "gp").get("goodput") or {}).get("attempts") or []) == 2
            and kube.status(namespace, "gp")["goodput"]
        ),
        30,
        "attempt 2's goodput record",
    )
    first = g["attempts"][0]
    assert (first["attempt"], first["endReason"]) == (1, "Failed") and first["endTime"] >= first["createdTime"]
    assert sum(g["seconds"].values()) == pytest.approx(g["wallSeconds"], abs=0.5)
    operator.stop(signal.SIGKILL)
    operator.start()
    kube.set_ptj_condition(namespace, "gp-a2", "Running")
    kube.wait_phase(namespace, "gp", "Running")
    kube.set_ptj_condition(namespace, "gp-a2", "Succeeded")
    done = kube.wait_phase(namespace, "gp", "Succeeded")
    g = done["goodput"]
    assert [(a["attempt"], a.get("endReason")) for a in g["attempts"]] == [(1, "Failed"), (2, "Succeeded")]
    created = kube.job(namespace, "gp")["metadata"]["creationTimestamp"]
    wall = (parse_time(done["completionTime"]) - parse_time(created)).total_seconds()
    assert g["wallSeconds"] == pytest.approx(wall, abs=1) and sum(g["seconds"].values()) == pytest.approx(wall, abs=1)
    assert g["seconds"]["restarting"] > 0 and g["updateTime"] == done["completionTime"]
    header = kube.cluster.kubectl("get", "llmtj", "gp", "-n", namespace).stdout.split("\n")[0].split()
    assert "GOODPUT" in header and "ETA" in header
    wait_for(
        lambda: f'llmtrain_job_goodput_ratio{{llmtrain_job="gp",namespace="{namespace}"}}' in operator.metrics(),
        15,
        "the goodput gauge",
    )
