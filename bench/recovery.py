"""How long does the trainer take to get back to training after a worker dies? (CPU, gloo)

The operator's part of a recovery (failure seen → next attempt's pods Running) is measured on the
simulated cluster; this measures the trainer's part on this machine, as the operator relaunches it:

1. baseline: a cold start, `torchrun` launch → first training step (no checkpoint to load);
2. recovery: the same job with `checkpoint.intervalSteps`, SIGKILLed (the whole process group, as a
   node loss would) a few steps after a committed checkpoint, then launched again at once with a
   fresh rendezvous id; SIGKILL → first resumed step, split into launch → `config` event (processes
   up and rendezvous done), → `resume` event (checkpoint loaded), → first step.

Checked on every repeat: the relaunch resumes from the last committed checkpoint, and the steps after
it run exactly once each up to maxSteps (no lost or repeated step in the trajectory); the steps done
between that checkpoint and the kill are recomputed, and their count is reported.

    .venv/bin/python bench/recovery.py [--repeats 3] [--nproc 2] [--quick]

With ``--control-plane`` it measures the other half instead, on the real chain (a dev cluster with
kube-scheduler, kwok-simulated p5.48xlarge nodes and the Kubeflow training-operator, started here):
``--jobs 1,200`` one-node jobs run (one simulated node each, plus ``--spare-nodes``), then, one at a
time, a Running pod of one of them is failed through kwok's chaos stage and the time from the pod
turning Failed to the next attempt's pods Running is recorded, split into

    pod Failed → PyTorchJob Failed              (training-operator sees the failure)
    → status.attempt N+1                        (llmtrain operator: its conditional status write)
    → PyTorchJob N+1 created                    (llmtrain operator: old deleted, new rendered)
    → pods created                              (training-operator)
    → pods scheduled                            (kube-scheduler)
    → pods Running                              (kwok: its "fast" pod-ready stage has no delay)

and, as the baseline in the same run and at the same load, a fresh job's create → pods Running.
Simulated delays: kwok's chaos stage waits 1–2 s between the failure label and the pod turning
Failed (before the clock starts); every other kwok stage used has none. Restart backoff (any
``spec.resilience`` field about backoff, and the operator's ``--min-restart-backoff-seconds`` floor)
is set to 0: the deliberate wait is not what is measured.

    .venv/bin/python bench/recovery.py --control-plane --jobs 1,200 --repeats 10 --burst 20 \
        --json bench/results/recovery_control_plane.json
    .venv/bin/python bench/recovery.py --control-plane --quick     # 1 job, 3 repeats (tests/bench)
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ports import free_port
from trainer_events import TrainerEvents, trainer_env


def job_spec(steps: int, interval: int, ckpt: str) -> dict:
    return {
        "model": {"preset": "tiny"},
        "data": {"uri": "synthetic", "seqLen": 64},
        "cluster": {"instanceType": "cpu", "processesPerNode": 2},
        "fsdp": {"shardingStrategy": "FULL_SHARD", "mixedPrecision": "fp32", "activationCheckpointing": "none"},
        "training": {
            "maxSteps": steps,
            "globalBatchTokens": 1024,
            "microBatchSize": 4,
            "learningRate": 1e-3,
            "warmupSteps": 1,
            "seed": 0,
        },
        "checkpoint": {"uri": ckpt, "intervalSteps": interval, "intervalMinutes": 60, "keep": 2},
        "resilience": {"collectiveTimeoutMinutes": 2},
        "rendezvous": {"backend": "c10d"},
    }


class Run(TrainerEvents):
    """One torchrun; `until` raises if it exits before the event."""

    def __init__(self, spec_file: Path, nproc: int, workdir: Path):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{free_port()}",
            f"--rdzv-id=rec-{uuid.uuid4().hex[:8]}",
            "--max-restarts=0",
            "-m",
            "llmtrain_trainer",
            "--spec",
            str(spec_file),
        ]
        self.started = time.monotonic()
        super().__init__(
            cmd,
            trainer_env(LLMTRAIN_CHECKPOINT_STAGING=str(workdir / "staging")),
            workdir / f"stderr-{uuid.uuid4().hex[:6]}.log",
        )

    def until(self, pred, timeout: float = 300) -> tuple[float, dict]:
        item = self.next_event(pred, timeout)
        if item is None:
            raise RuntimeError(f"trainer exited ({self.proc.wait()}) early; {self.log_tail()}")
        return item

    def kill(self) -> None:
        """SIGKILL torchrun and every worker at once, as a lost node would."""
        from llmtrain_trainer.launch import kill_tree

        kill_tree(self.proc)
        self.proc.wait()


def cold_start(nproc: int, workdir: Path) -> float:
    spec = workdir / "cold.json"
    spec.write_text(json.dumps(job_spec(3, 0, str(workdir / "cold-ckpt"))))
    run = Run(spec, nproc, workdir)
    t, _ = run.until(lambda e: e.get("event") == "step")
    run.kill()
    return t - run.started


def recovery(nproc: int, workdir: Path, steps: int, interval: int) -> dict:
    ckpt = workdir / f"ckpt-{uuid.uuid4().hex[:6]}"
    spec = workdir / "job.json"
    spec.write_text(json.dumps(job_spec(steps, interval, str(ckpt))))
    first = Run(spec, nproc, workdir)
    _, saved = first.until(lambda e: e.get("event") == "checkpoint" and e["step"] >= 2 * interval)
    _, last = first.until(lambda e: e.get("event") == "step" and e["step"] >= saved["step"] + 2)
    first.kill()
    killed = time.monotonic()

    second = Run(spec, nproc, workdir)
    t_config, _ = second.until(lambda e: e.get("event") == "config")
    t_resume, resumed = second.until(lambda e: e.get("event") == "resume")
    t_step, step = second.until(lambda e: e.get("event") == "step")
    seen = [step["step"]]
    while True:
        _, e = second.until(lambda e: e.get("event") in ("step", "end"))
        if e["event"] == "end":
            break
        seen.append(e["step"])
    second.proc.wait(60)
    # The last committed checkpoint at kill time is at least `saved`; the one the run resumed from
    # must be the newest committed, and every later step must run exactly once.
    assert resumed["step"] >= saved["step"], (resumed, saved)
    assert seen == list(range(resumed["step"] + 1, steps + 1)), seen
    return {
        "kill_to_first_step_s": t_step - killed,
        "launch_to_config_s": t_config - second.started,
        "config_to_resumed_s": t_resume - t_config,
        "resumed_to_first_step_s": t_step - t_resume,
        "resumed_from": resumed["step"],
        "killed_at_step": last["step"],
        "steps_recomputed": last["step"] - resumed["step"],
    }


# --- control-plane recovery on the real chain ------------------------------------------------------

CP_PARTS = (  # (name, from stage, to stage) of Recorder; from an attempt N stage to an N+1 one
    ("training_operator_ptj_failed_s", ("pod_failed", 0), ("ptj_failed", 0)),
    ("operator_status_write_s", ("ptj_failed", 0), ("status_attempt", 1)),
    ("operator_new_ptj_s", ("status_attempt", 1), ("ptj_created", 1)),
    ("training_operator_pods_s", ("ptj_created", 1), ("pods_created", 1)),
    ("scheduler_s", ("pods_created", 1), ("pods_scheduled", 1)),
    ("kwok_running_s", ("pods_scheduled", 1), ("pods_running", 1)),
)


def control_plane(a: argparse.Namespace) -> dict:
    from kubernetes import client

    from chainbench import (
        ChainRun,
        Recorder,
        api_client,
        job_spec,
        stats,
        training_operator_args,
        wait_for,
        zero_backoff,
    )
    from llmtrain.spec import API_VERSION, GROUP, KIND, PLURAL, VERSION
    from llmtrain_devcluster.chain import FAIL_EXIT_CODE_ANNOTATION, FAIL_POD_LABEL

    counts = sorted({int(c) for c in str(a.jobs).split(",")})
    nodes = max(counts) + a.spare_nodes
    out: dict = {
        "mode": "control-plane",
        "p5_nodes": nodes,
        "repeats": a.repeats,
        "restart_backoff_fields_set_to_0": zero_backoff(),
        # the deliberate wait is not what is measured: the spec's backoff is 0 (zero_backoff), and so is
        # the operator's floor (--min-restart-backoff-seconds, 5 s by default), which otherwise raises it
        "operator_args": [
            "--progress-interval",
            str(a.progress_interval),
            "--min-restart-backoff-seconds",
            "0",
            *shlex.split(a.operator_args),
        ],
        "training_operator_args": training_operator_args(a.training_operator_threads, a.training_operator_qps),
        "scenarios": {},
    }
    with tempfile.TemporaryDirectory(prefix="llmtrain-recovery-cp-") as tmp:
        work = Path(tmp)
        t0 = time.monotonic()
        with ChainRun(work / "cluster", nodes, out["training_operator_args"], work / "operator.log", 4000) as run:
            out["cluster_start_s"] = time.monotonic() - t0
            cluster = run.cluster
            api = api_client(cluster.kubeconfig)
            core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
            ns = f"recovery-{uuid.uuid4().hex[:6]}"
            core.create_namespace({"metadata": {"name": ns}})
            # Progress scraping is not on the recovery path (PyTorchJob events drive restarts); a long
            # interval also keeps the operator from dialling the simulated pods' (unroutable) IPs.
            op = run.start_operator(ns, out["operator_args"])
            rec = Recorder(api, ns)
            spec = job_spec(nodes=1)

            def create(name: str) -> float:
                t = time.monotonic()
                custom.create_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    ns,
                    PLURAL,
                    {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": spec},
                )
                return t

            def attempt_of(name: str) -> int:
                return rec.phase.get(name, (1, None))[0]

            def fail_at_once(victims: list[str]) -> dict:
                """Correlated failures (a rack, a switch): one pod of each of ``victims`` failed
                together; each job's own recovery time, and when the last one was back."""
                attempts = {j: attempt_of(j) for j in victims}
                for j, n in attempts.items():
                    pod = next(
                        p
                        for p in core.list_namespaced_pod(
                            ns, label_selector=f"{rec.job_label}={j},{rec.attempt_label}={n}"
                        ).items
                        if p.status.phase == "Running"
                    )
                    core.patch_namespaced_pod(
                        pod.metadata.name,
                        ns,
                        {
                            "metadata": {
                                "labels": {FAIL_POD_LABEL: "true"},
                                "annotations": {FAIL_EXIT_CODE_ANNOTATION: "137"},
                            }
                        },
                    )
                wait_for(
                    lambda: all(rec.get(j, n + 1, "pods_running") for j, n in attempts.items()),
                    a.timeout,
                    f"{len(victims)} jobs recovered at once (operator log: {op.log_path})",
                )
                totals = [rec.get(j, n + 1, "pods_running") - rec.get(j, n, "pod_failed") for j, n in attempts.items()]
                first = min(rec.get(j, n, "pod_failed") for j, n in attempts.items())
                last = max(rec.get(j, n + 1, "pods_running") for j, n in attempts.items())
                return {
                    "jobs": len(victims),
                    "recovery_s": stats(totals),
                    "first_failure_to_last_running_s": last - first,
                    "parts_median_s": {
                        part: statistics.median(
                            rec.get(j, n + d1, s1) - rec.get(j, n + d0, s0) for j, n in attempts.items()
                        )
                        for part, (s0, d0), (s1, d1) in CP_PARTS
                    },
                }

            jobs: list[str] = []
            for count in counts:
                new = [f"job-{i:04d}" for i in range(len(jobs), count)]
                with ThreadPoolExecutor(8) as pool:
                    list(pool.map(create, new))
                jobs += new
                # Settled: every job's phase Running, i.e. the training-operator has written each
                # PyTorchJob's Running condition and the operator followed it. Before that the
                # training-operator's queue still holds the start-up burst (one worker thread and 20
                # API QPS by default), and a failure would wait behind it.
                settle = time.monotonic()
                wait_for(
                    lambda: all(
                        rec.phase.get(j, (0, None))[1] == "Running" and rec.get(j, attempt_of(j), "pods_running")
                        for j in jobs  # noqa: B023 - waited on here, inside the loop
                    ),
                    a.timeout,
                    f"{count} jobs Running",
                )
                settled_s = time.monotonic() - settle
                runs, cold = [], []
                for r in range(a.repeats):
                    job = jobs[r % count]
                    n = attempt_of(job)
                    pods = core.list_namespaced_pod(
                        ns, label_selector=f"{rec.job_label}={job},{rec.attempt_label}={n}"
                    ).items
                    victim = next(p for p in pods if p.status.phase == "Running")
                    core.patch_namespaced_pod(
                        victim.metadata.name,
                        ns,
                        {
                            "metadata": {
                                "labels": {FAIL_POD_LABEL: "true"},
                                "annotations": {FAIL_EXIT_CODE_ANNOTATION: "137"},
                            }
                        },
                    )
                    wait_for(
                        lambda: rec.get(job, n + 1, "pods_running"),  # noqa: B023 - waited on here
                        a.timeout,
                        f"{job} attempt {n + 1} pods Running (operator log: {op.log_path})",
                    )
                    t = {f"{stage}_{d}": rec.get(job, n + d, stage) for _, *ends in CP_PARTS for stage, d in ends}
                    run = {
                        "job": job,
                        "attempt": n + 1,
                        "total_s": rec.get(job, n + 1, "pods_running") - rec.get(job, n, "pod_failed"),
                        "failed_node": victim.spec.node_name,
                        "new_nodes": sorted(rec.pod_nodes.get((job, n + 1), ())),
                    }
                    for part, (s0, d0), (s1, d1) in CP_PARTS:
                        run[part] = t[f"{s1}_{d1}"] - t[f"{s0}_{d0}"]
                    runs.append(run)
                    # Baseline at the same load: a new job's create → pods Running (then gone again).
                    probe = f"probe-{count}-{r}"
                    created = create(probe)
                    wait_for(lambda: rec.get(probe, 1, "pods_running"), a.timeout, f"{probe} pods Running")  # noqa: B023 (waited on here)
                    cold.append(rec.get(probe, 1, "pods_running") - created)
                    custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, probe)
                burst = None
                if a.burst and count >= a.burst:
                    burst = fail_at_once(jobs[-a.burst :])
                # Exactly one live PyTorchJob per job, at its newest attempt.
                ptjs = custom.list_namespaced_custom_object("kubeflow.org", "v1", ns, "pytorchjobs")["items"]
                live: dict[str, list[str]] = {}
                for p in ptjs:
                    if p["metadata"].get("deletionTimestamp"):
                        continue
                    conds = (p.get("status") or {}).get("conditions") or []
                    if not any(c["type"] in ("Failed", "Succeeded") and c["status"] == "True" for c in conds):
                        live.setdefault(p["metadata"]["labels"][rec.job_label], []).append(p["metadata"]["name"])
                extra = {j: v for j, v in live.items() if j in jobs and len(v) != 1}
                total = [r["total_s"] for r in runs]
                scenario = {
                    "running_jobs": count,
                    "settle_s": settled_s,
                    "recovery_s": stats(total),
                    "parts_median_s": {part: statistics.median(r[part] for r in runs) for part, *_ in CP_PARTS},
                    "parts_max_s": {part: max(r[part] for r in runs) for part, *_ in CP_PARTS},
                    "create_to_running_s": stats(cold),
                    "ratio_recovery_to_create": statistics.median(total) / statistics.median(cold),
                    "jobs_with_other_than_one_live_ptj": extra,
                    "burst": burst,
                    "runs": runs,
                }
                out["scenarios"][str(count)] = scenario
                print(
                    json.dumps({"scenario": count, "recovery_s": scenario["recovery_s"]}), file=sys.stderr, flush=True
                )
            out["operator_peak_rss_mib"], out["operator_cpu_s"] = op.usage()
            rec.stop()
    return out


def print_control_plane(out: dict) -> None:
    print(
        f"control-plane recovery (pod Failed → next attempt's pods Running), {out['p5_nodes']} simulated "
        f"p5.48xlarge nodes, {out['repeats']} failures per scenario; training-operator "
        f"{' '.join(out['training_operator_args']) or 'defaults'}"
    )
    for count, s in out["scenarios"].items():
        r, c = s["recovery_s"], s["create_to_running_s"]
        print(
            f"  {count:>4} running job(s): p50 {r['p50']:.2f} s  p95 {r['p95']:.2f} s  max {r['max']:.2f} s"
            f"   (new job create→Running p50 {c['p50']:.2f} s; recovery {s['ratio_recovery_to_create']:.2f}×)"
        )
        for part, v in s["parts_median_s"].items():
            print(f"      {part:<34} median {v:6.2f} s   max {s['parts_max_s'][part]:6.2f} s")
        b = s.get("burst")
        if b:
            print(
                f"      {b['jobs']} pods failed at once: per job p50 {b['recovery_s']['p50']:.2f} s, max "
                f"{b['recovery_s']['max']:.2f} s; first failure → last job Running "
                f"{b['first_failure_to_last_running_s']:.2f} s"
            )
            print("        medians: " + ", ".join(f"{k} {v:.2f}" for k, v in b["parts_median_s"].items()))
        if s["jobs_with_other_than_one_live_ptj"]:
            print(f"      NOT exactly one live PyTorchJob: {s['jobs_with_other_than_one_live_ptj']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--control-plane",
        action="store_true",
        help="measure pod failure → next attempt Running on the simulated chain instead",
    )
    ap.add_argument("--jobs", default="1,200", help="--control-plane: running jobs per scenario")
    ap.add_argument("--spare-nodes", type=int, default=4, help="--control-plane: simulated nodes beyond one per job")
    ap.add_argument(
        "--progress-interval", type=float, default=3600.0, help="--control-plane: the operator's --progress-interval"
    )
    ap.add_argument("--timeout", type=float, default=300.0, help="--control-plane: per wait")
    ap.add_argument(
        "--operator-args",
        default="",
        help="--control-plane: more operator flags (e.g. a restart-backoff flag set to 0)",
    )
    ap.add_argument(
        "--burst",
        type=int,
        default=0,
        help="--control-plane: also fail this many jobs' pods at once (per scenario with that many jobs)",
    )
    ap.add_argument(
        "--training-operator-threads",
        type=int,
        default=None,
        help="--control-plane: training-operator --controller-threads (default: Kubeflow's, 1)",
    )
    ap.add_argument(
        "--training-operator-qps",
        type=int,
        default=None,
        help="--control-plane: training-operator --kube-api-qps (default: Kubeflow's, 20)",
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--interval", type=int, default=4, help="checkpoint.intervalSteps")
    ap.add_argument("--quick", action="store_true", help="one repeat of a short job (used by the tests)")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args(argv)
    if a.control_plane:
        if a.quick:
            a.jobs, a.repeats = "1", 3
        out = control_plane(a)
        print_control_plane(out)
        print(json.dumps(out))
        if a.json:
            Path(a.json).write_text(json.dumps(out, indent=2))
        return 0
    if a.quick:
        a.repeats, a.steps, a.interval = 1, 40, 4
    with tempfile.TemporaryDirectory(prefix="llmtrain-recovery-") as tmp:
        work = Path(tmp)
        cold, rec = [], []
        for _ in range(a.repeats):  # alternate, so machine load drifts hit both sides alike
            cold.append(cold_start(a.nproc, work))
            rec.append(recovery(a.nproc, work, a.steps, a.interval))
    kill = [r["kill_to_first_step_s"] for r in rec]
    result = {
        "nproc": a.nproc,
        "repeats": a.repeats,
        "cold_start_s": {"median": statistics.median(cold), "min": min(cold), "max": max(cold)},
        "kill_to_first_step_s": {"median": statistics.median(kill), "min": min(kill), "max": max(kill)},
        "ratio_recovery_to_cold_start": statistics.median(kill) / statistics.median(cold),
        "runs": rec,
    }
    print(
        f"cold start → first step      median {result['cold_start_s']['median']:.2f} s "
        f"(min {min(cold):.2f}, max {max(cold):.2f})"
    )
    print(
        f"SIGKILL → first resumed step median {result['kill_to_first_step_s']['median']:.2f} s "
        f"(min {min(kill):.2f}, max {max(kill):.2f}); {result['ratio_recovery_to_cold_start']:.2f}× cold start"
    )
    for r in rec:
        print(
            f"  launch→config {r['launch_to_config_s']:.2f} s, config→resumed {r['config_to_resumed_s']:.2f} s, "
            f"resumed→step {r['resumed_to_first_step_s']:.2f} s; resumed from step {r['resumed_from']}, "
            f"killed at {r['killed_at_step']}, {r['steps_recomputed']} step(s) recomputed, none lost or repeated"
        )
    print(json.dumps(result))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    from chainbench import exit_on_sigterm

    exit_on_sigterm()
    sys.exit(main())
