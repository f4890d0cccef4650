"""decide() where the backend matters, no cluster: the JobSet rows (the child's state maps
differently: Running is every Job ready, no Restarting, suspend is spec.suspend), the backend
recorded once, the old status.pytorchJob read and cleared, a backend whose CRD is missing, and
Kueue not managing the child's kind. Snapshots from decide_world; JobSets as JobSet v0.12.0's
controller leaves them (decide_world.jobset)."""

from __future__ import annotations

from dataclasses import replace

from llmtrain.controller.policy.snapshot import CreateResult, Workload

from .decide_world import CFG, NOW, ago, decide_, jobset, pending, ptj, running, snap, tiny

JS = {"backend": "jobset"}
QUEUED = tiny(cluster={"instanceType": "cpu", "nodes": 1, "queueName": "team-a"})


def js_snap(status=None, spec=None, children=(), **facts):
    return snap(status, spec, children, backend="jobset", **facts)


def test_a_new_job_on_the_jobset_backend_creates_a_jobset_and_records_the_backend_once():
    plan = decide_(js_snap({}))
    assert plan.situation == "new_job" and plan.create["kind"] == "JobSet"
    assert plan.create["metadata"]["name"] == "j-a1"
    done = decide_(js_snap({}, created=CreateResult("j-a1", "created", rendezvous_id="rid")))
    assert done.status["backend"] == "jobset" and done.status["child"] == "j-a1"
    assert [(e.reason.value, e.message) for e in done.events] == [("Created", "Created JobSet j-a1 (attempt 1)")]
    # a later attempt of a job whose status records its backend writes it no more (one writer, once)
    failed = js_snap(running(**JS), children=[jobset(1, "Failed")], failures=())
    restart = decide_(failed)
    assert restart.status["child"] == "j-a2" and "backend" not in restart.status


def test_a_jobset_runs_when_every_job_is_ready_and_a_readiness_blip_is_not_a_restart():
    # Jobs active, pods not all ready: still Pending (a PyTorchJob's Created)
    assert decide_(js_snap(pending(**JS), children=[jobset(1, "Created")])).situation != "follow"
    plan = decide_(js_snap(pending(**JS), children=[jobset(1, "Running")]))
    assert plan.situation == "follow" and plan.status["phase"] == "Running"
    assert plan.status["message"] == "JobSet j-a1 is Running"
    # a pod turned unready (a late kubelet heartbeat): ready drops, the attempt still trains
    blip = decide_(js_snap(running(**JS), children=[jobset(1, "Created")]))
    assert blip.situation == "steady" and blip.status is None


def test_a_completed_jobset_succeeds_the_job_and_a_failed_one_is_judged_from_its_pods():
    succeeded = js_snap(running(**JS), children=[jobset(1, "Succeeded")])
    assert decide_(succeeded).need == "final"  # the trainer's final summary from its pods (ending.py)
    done = decide_(succeeded.with_(final_read=True))
    assert (done.situation, done.status["phase"]) == ("follow", "Succeeded")
    failed = js_snap(running(**JS), children=[jobset(1, "Failed")])
    assert decide_(failed).need == "failures"  # its pods say why (the JobSet says only "max restarts")
    plan = decide_(failed.with_(failures=()))
    assert (plan.situation, plan.status["phase"], plan.status["reason"]) == ("attempt_failed", "Restarting", "Failed")
    assert "jobset failed due to reaching max number of restarts" in plan.status["message"]
    assert plan.delete == ("j-a1",)


def test_a_suspended_jobset_is_queued_and_kueue_not_managing_jobsets_is_said_naming_the_framework():
    waiting = js_snap(
        pending(**JS, attemptCreationTime=ago(seconds=20)), QUEUED, [jobset(1, None, raw_spec=QUEUED, suspended=True)]
    )
    assert decide_(waiting).need == "workload"
    plan = decide_(waiting.with_(workload_read=True))
    assert plan.status["reason"] == "Queued" and "waiting for Kueue to admit the JobSet" in plan.status["message"]
    silent = js_snap(pending(**JS), QUEUED, [jobset(1, None, raw_spec=QUEUED, suspended=True)], workload_read=True)
    plan = decide_(silent)
    assert plan.status["reason"] == "NoKueueWorkload"
    assert "jobset.x-k8s.io/jobset" in plan.status["message"] and "JobSet j-a1" in plan.status["message"]
    assert [(e.warning, e.reason.value) for e in plan.events] == [(True, "NoKueueWorkload")]
    # written, the next look changes nothing and asks again only at the progress interval
    written = {**silent.raw_status, **{k: getattr(v, "value", v) for k, v in plan.status.items() if k != "conditions"}}
    again = decide_(js_snap(written, QUEUED, [jobset(1, None, raw_spec=QUEUED, suspended=True)], workload_read=True))
    assert again.status is None and again.requeue == CFG.progress_interval
    # Kueue picks it up after all (the platform added the framework): admitted
    admitted = js_snap(written, QUEUED, [jobset(1, "Created", raw_spec=QUEUED)], workload_read=True)
    assert decide_(admitted).status["reason"] == "Admitted"


def test_the_wait_for_a_workload_is_the_operators_setting_and_looked_at_when_it_ends():
    cfg = replace(CFG, kueue_workload_wait=120.0)
    o = snap(pending(attemptCreationTime=ago(seconds=100)), QUEUED, [ptj(1, None, raw_spec=QUEUED, suspended=True)])
    o = o.with_(workload_read=True)
    first = decide_(o, cfg)
    assert first.status["reason"] == "Queued"  # 100 s of 120: not yet
    written = {**o.raw_status, "reason": "Queued", "message": first.status["message"]}
    steady = decide_(snap(written, QUEUED, [ptj(1, None, raw_spec=QUEUED, suspended=True)], workload_read=True), cfg)
    assert steady.situation == "steady" and abs(steady.requeue - (120 - 100)) < 1  # when the wait ends
    later = decide_(o, replace(cfg, kueue_workload_wait=60.0))  # 100 s of 60
    assert later.status["reason"] == "NoKueueWorkload" and "kubeflow.org/pytorchjob" in later.status["message"]
    # a Workload that exists says why itself: never NoKueueWorkload, however long
    told = o.with_(workload=Workload("w", message="couldn't assign flavors"), now=NOW.replace(hour=18))
    assert decide_(told, cfg).status["reason"] == "Queued"


def test_a_backend_whose_crd_is_missing_fails_the_job_naming_the_crd_and_the_setting():
    o = js_snap({}, created=CreateResult("j-a1", "not-served", "the server could not find the requested resource"))
    plan = decide_(o)
    assert (plan.status["phase"], plan.status["reason"]) == ("Failed", "BackendNotInstalled")
    msg = plan.status["message"]
    assert "jobsets.jobset.x-k8s.io" in msg and "backends.default" in msg and "backends.enabled" in msg
    # chosen by the job itself: the message points at its field instead
    own = js_snap({}, tiny(cluster={"instanceType": "cpu", "backend": "jobset"}), created=o.created)
    assert "spec.cluster.backend is jobset" in decide_(own).status["message"]
    # chosen by its namespace's default
    ns_cfg = replace(CFG, namespace_backends={"ns": "jobset"})
    assert "backends.namespaceDefaults.ns" in decide_(o, ns_cfg).status["message"]


def test_a_refused_jobset_is_attempt_rejected_naming_the_kind():
    o = js_snap({}, created=CreateResult("j-a1", "rejected", "admission webhook denied"))
    plan = decide_(o)
    assert plan.status["reason"] == "AttemptRejected"
    assert plan.status["message"] == "the API server refused JobSet j-a1: admission webhook denied"


def test_an_older_operators_status_pytorchjob_is_read_and_cleared_with_the_next_attempt():
    """A job running before the backend choice (status.pytorchJob, no status.backend) is a PyTorchJob
    job: its recorded child is found, and its next attempt records status.child (and the backend)
    and clears the old field, so it never names an attempt that is gone."""
    legacy = running()
    legacy.pop("child"), legacy.pop("backend")
    legacy["pytorchJob"] = "j-a1"
    o = snap(legacy, children=[ptj(1, "Failed")], failures=())
    assert o.status.current_child == "j-a1"
    plan = decide_(o)
    assert plan.situation == "attempt_failed" and plan.delete == ("j-a1",)
    assert plan.status["child"] == "j-a2" and plan.status["pytorchJob"] is None
    assert plan.status["backend"] == "pytorchjob"
