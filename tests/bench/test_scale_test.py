"""`llmtrain scale-test`: the arithmetic (units), and one real run at sizes 1 and 2 (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from llmtrain.validation import parse_spec
from llmtrain_trainer.cli.scale_test import add_efficiency, check_divisible, parse_sizes, summarize

REPO = Path(__file__).resolve().parents[2]


def test_sizes_are_sorted_unique_positive():
    assert parse_sizes("4,1,2,2") == [1, 2, 4]
    for bad in ("", "0,1", "a,2", "-1"):
        with pytest.raises(ValueError, match="comma-separated positive integers"):
            parse_sizes(bad)


def test_a_global_batch_that_does_not_split_is_refused_with_the_fix():
    spec = parse_spec(
        {
            "model": {"preset": "tiny"},
            "data": {"seqLen": 32},
            "cluster": {"instanceType": "cpu"},
            "training": {"globalBatchTokens": 32 * 6, "microBatchSize": 1},
        }
    )
    check_divisible(spec, [1, 2, 3, 6])
    with pytest.raises(ValueError, match=r"6 sequences per step do not split over 4 worker\(s\)"):
        check_divisible(spec, [1, 2, 4])


def test_efficiency_is_per_worker_throughput_relative_to_the_smallest_size():
    def steps(tps):  # step 1 is warm-up and must not count
        return [{"step": 1, "tokens_per_second": 1.0, "mfu": 0.0, "step_seconds": 9.0}] + [
            {"step": i + 2, "tokens_per_second": v, "mfu": 0.01, "step_seconds": 0.5} for i, v in enumerate(tps)
        ]

    rows = add_efficiency(
        [summarize(1, steps([100, 100, 100]), warmup=1), summarize(2, steps([150, 160, 170]), warmup=1)]
    )
    assert rows[0]["tokens_per_second_per_worker"] == 100 and rows[0]["scaling_efficiency"] == 1.0
    # 2 workers: median 160 tokens/s → 80 per worker → 80% of 100
    assert rows[1]["tokens_per_second_per_worker"] == 80 and rows[1]["scaling_efficiency"] == 0.8


@pytest.mark.slow
@pytest.mark.trainer
def test_scale_test_runs_each_size_and_writes_table_json_png(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmtrain.cli",
            "scale-test",
            "examples/local/scale-test.yaml",
            "--sizes",
            "1,2",
            "--max-steps",
            "5",
            "--warmup",
            "2",
            "--output",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "efficiency" in out.stdout
    result = json.loads((tmp_path / "scale-test.json").read_text())
    assert [r["size"] for r in result["rows"]] == [1, 2]
    assert result["rows"][0]["scaling_efficiency"] == 1.0
    for r in result["rows"]:
        assert r["steps"] == 3 and r["tokens_per_second"] > 0
        assert r["tokens_per_second_per_worker"] == pytest.approx(r["tokens_per_second"] / r["size"], rel=1e-3)
    png = (tmp_path / "scale-test.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


# -- cluster mode ----------------------------------------------------------------------------------


def test_scale_job_document_sets_nodes_and_drops_the_checkpoint():
    from llmtrain_trainer.cli.scale_test import scale_job_document, scale_job_name

    doc = {
        "apiVersion": "llmtrain.dev/v1alpha1",
        "kind": "LLMTrainingJob",
        "metadata": {"name": "llama"},
        "spec": {
            "cluster": {"instanceType": "p5.48xlarge", "nodes": 16, "minNodes": 8},
            "checkpoint": {"uri": "s3://b/ckpt/", "keep": 2},
            "training": {"maxSteps": 10000},
        },
    }
    out = scale_job_document(doc, scale_job_name("llama", 4), 4, 50)
    assert out["metadata"]["name"] == "llama-scale-4"
    assert out["spec"]["cluster"] == {"instanceType": "p5.48xlarge", "nodes": 4}
    assert out["spec"]["checkpoint"] == {"keep": 2} and out["spec"]["training"]["maxSteps"] == 50
    assert doc["spec"]["cluster"]["nodes"] == 16  # the input is not modified
    assert len(scale_job_name("x" * 60, 16)) == 45 and scale_job_name("x" * 60, 16).endswith("-scale-16")


def test_progress_sampling_takes_distinct_steps_after_warmup_and_reports_failure():
    from llmtrain_trainer.cli.scale_test import sample_progress

    seq = iter(
        [
            None,
            {"phase": "Pending"},
            {"phase": "Running", "progress": {"step": 2, "tokensPerSecond": 9}},
            {"phase": "Running", "progress": {"step": 3, "tokensPerSecond": 100, "mfu": 0.3}},
            {"phase": "Running", "progress": {"step": 3, "tokensPerSecond": 100, "mfu": 0.3}},
            {"phase": "Running", "progress": {"step": 5, "tokensPerSecond": 200, "mfu": 0.4}},
        ]
    )
    got = sample_progress(lambda: next(seq), warmup=2, samples=2, tokens_per_step=1000, deadline=1e18, poll=0, what="j")
    assert [(e["step"], e["tokens_per_second"], e["step_seconds"]) for e in got] == [(3, 100, 10.0), (5, 200, 5.0)]
    failed = iter([{"phase": "Failed", "message": "spec.fsdp.float8: p4d has A100 GPUs"}])
    with pytest.raises(RuntimeError, match=r"j failed: spec.fsdp.float8"):
        sample_progress(lambda: next(failed), 2, 2, 1000, 1e18, 0, "j")


EFFICIENCY = {1: 1.0, 2: 0.8}  # what the stand-in trainer reports per node count: the table must show it


@pytest.mark.slow
def test_cluster_mode_runs_each_node_count_through_the_operator(dev_cluster, namespace, tmp_path):
    """`llmtrain scale-test --kubeconfig` against the real kube-apiserver with the real operator: one
    job per node count, created, read from status.progress (which the operator scrapes from a rank-0
    /metrics endpoint), deleted before the next. The dev cluster has no kubelet, training-operator or
    GPUs, so two stand-ins play them: a thread that does what Kubeflow and the kubelet would (worker-0
    pod at 127.0.0.1, PyTorchJob Running), and the trainer's real TrainerMetrics advancing a step
    every 0.1 s with tokens/s = 1000 × workers × EFFICIENCY[nodes]. The orchestration and the
    status → table path are what is tested here; real multi-node throughput needs a real cluster."""
    import threading
    import time

    import yaml
    from kubernetes import client
    from prometheus_client import start_http_server

    from llmtrain.render import JOB_LABEL
    from llmtrain_devcluster.process import free_port
    from llmtrain_devcluster.standins import pytorchjob_conditions, running_at, worker0_pod
    from llmtrain_trainer.metrics.prometheus import TrainerMetrics
    from operator_core.conftest import OperatorProcess

    metrics = TrainerMetrics(job="scale", rank=0)
    port = free_port()
    server, server_thread = start_http_server(port, addr="127.0.0.1", registry=metrics.registry)
    op = OperatorProcess(dev_cluster.kubeconfig, tmp_path / "operator.log", port)
    op.start()
    stop = threading.Event()
    seen_nodes: list[int] = []
    errors: list[BaseException] = []
    current = {"nodes": None, "step": 0}

    def kubeflow_and_kubelet():
        with dev_cluster.api_client() as api:
            custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
            done = set()
            while not stop.is_set():
                try:
                    for ptj in custom.list_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs")[
                        "items"
                    ]:
                        name = ptj["metadata"]["name"]
                        if name in done:
                            continue
                        job = ptj["metadata"]["labels"][JOB_LABEL]
                        container = ptj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
                        spec = json.loads(next(e["value"] for e in container["env"] if e["name"] == "LLMTRAIN_SPEC"))
                        pod = worker0_pod(job, 1, container["image"], owner=ptj)
                        core.create_namespaced_pod(namespace, pod)
                        core.patch_namespaced_pod_status(pod["metadata"]["name"], namespace, running_at("127.0.0.1"))
                        custom.patch_namespaced_custom_object_status(
                            "kubeflow.org",
                            "v1",
                            namespace,
                            "pytorchjobs",
                            name,
                            {"status": {"conditions": pytorchjob_conditions([], "Running", name)}},
                        )
                        current.update(nodes=spec["cluster"]["nodes"], step=0)
                        seen_nodes.append(spec["cluster"]["nodes"])
                        done.add(name)
                    n = current["nodes"]
                    if n:
                        current["step"] += 1
                        metrics.step.set(current["step"])
                        metrics.tokens_per_second.set(1000.0 * n * EFFICIENCY[n])
                        metrics.mfu.set(0.4 * EFFICIENCY[n])
                except Exception as err:  # surfaced by the test below
                    errors.append(err)
                    return
                time.sleep(0.1)

    standin = threading.Thread(target=kubeflow_and_kubelet, daemon=True)
    standin.start()
    job_file = tmp_path / "job.yaml"
    job_file.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "llmtrain.dev/v1alpha1",
                "kind": "LLMTrainingJob",
                "metadata": {"name": "scaling"},
                "spec": {
                    "model": {"preset": "tiny"},
                    "data": {"uri": "synthetic", "seqLen": 32},
                    "cluster": {"instanceType": "cpu", "processesPerNode": 1, "nodes": 1},
                    "training": {"maxSteps": 1000, "globalBatchTokens": 32 * 4},
                    "checkpoint": {"uri": "file:///tmp/never-used"},
                    "rendezvous": {"backend": "c10d"},
                },
            }
        )
    )
    try:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "llmtrain.cli",
                "scale-test",
                str(job_file),
                "--sizes",
                "1,2",
                "--kubeconfig",
                str(dev_cluster.kubeconfig),
                "--namespace",
                namespace,
                "--samples",
                "3",
                "--warmup",
                "1",
                "--poll",
                "0.3",
                "--timeout",
                "90",
                "--output",
                str(tmp_path / "out"),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=400,
        )
    finally:
        stop.set()
        standin.join(10)
        op.stop()
        server.shutdown()
        server_thread.join(5)
    assert not errors, errors
    assert out.returncode == 0, out.stderr[-3000:] + "\n" + out.stdout[-2000:]
    assert seen_nodes == [1, 2]  # one job per size, in order, each with its node count
    result = json.loads((tmp_path / "out" / "scale-test.json").read_text())
    assert result["mode"] == "cluster"
    rows = result["rows"]
    assert [(r["nodes"], r["size"]) for r in rows] == [(1, 1), (2, 2)]
    for r in rows:
        assert r["steps"] == 3
        assert r["tokens_per_second"] == pytest.approx(1000 * r["size"] * EFFICIENCY[r["nodes"]], rel=1e-3)
        assert r["mfu"] == pytest.approx(0.4 * EFFICIENCY[r["nodes"]], rel=1e-3)
    assert rows[1]["scaling_efficiency"] == pytest.approx(0.8, rel=1e-3)
    assert (tmp_path / "out" / "scale-test.png").read_bytes()[:4] == b"\x89PNG"
    # every job was deleted before the next size (and at the end)
    with dev_cluster.api_client() as api:
        left = client.CustomObjectsApi(api).list_namespaced_custom_object(
            "llmtrain.dev", "v1alpha1", namespace, "llmtrainingjobs"
        )["items"]
    assert left == []
