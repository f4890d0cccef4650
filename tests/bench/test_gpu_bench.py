"""bench/gpu.py's parts that decide what the GPU table says, and the one command for the borrowed GPU
machine (scripts/gpu-bench.sh, scripts/gpu-wheels.sh), checked without a GPU (issue 32).

The bench's CPU path itself runs in tests/bench/test_bench_quick.py; its run under the GPU machine's torch
is `make gpu-smoke` (bench/results/gpu_smoke_cpu.json).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import gpu  # noqa: E402 — bench/gpu.py, a script
from llmtrain.catalog import instance_type  # noqa: E402


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        # NVIDIA's H100 datasheet (dense BF16, no sparsity): the PCIe and NVL parts are slower than the
        # SXM part of p5, whose 989 TFLOP/s the bench used for every H100 before (issue 32).
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
    ],
)
def test_h100_pcie_and_nvl_have_their_own_peak(name, peak):
    got, source, spec_type = gpu.peak_for(name)
    assert got == peak and "datasheet" in source
    assert instance_type(spec_type).gpu.startswith("H100")  # the trainer's spec still names a real type


@pytest.mark.parametrize(
    ("name", "catalog_type"),
    [
        ("NVIDIA H100 80GB HBM3", "p5.48xlarge"),  # what torch calls the SXM H100
        ("NVIDIA H200", "p5e.48xlarge"),
        ("NVIDIA A100-SXM4-80GB", "p4d.24xlarge"),
    ],
)
def test_catalog_gpus_take_the_catalog_peak(name, catalog_type):
    got, source, spec_type = gpu.peak_for(name)
    assert got == instance_type(catalog_type).peak_flops_per_device
    assert catalog_type in source and instance_type(spec_type).gpu == instance_type(catalog_type).gpu


def test_an_unknown_gpu_gets_no_mfu_rather_than_a_wrong_one():
    # "H20" must not match the catalog's H200, nor an L4 anything.
    for name in ("NVIDIA H20", "NVIDIA L4"):
        got, source, _ = gpu.peak_for(name)
        assert got is None and "MFU not computed" in source, (name, source)


def _args(**kw):
    import argparse

    base = {"warmup": 2, "steps": 6, "batch": 2, "seq_len": 100, "flops_per_token": 1000, "peak_flops": 1e6}
    return argparse.Namespace(**(base | kw))


def test_one_timer_for_every_row_from_the_end_of_warmup_to_the_last_step():
    t0 = 1000.0
    # Steps end at t0 + 5 (cold start: compile), then every 0.5 s, except step 5 takes 1 s.
    ends = {1: 1005.0, 2: 1005.5, 3: 1006.0, 4: 1006.5, 5: 1007.5, 6: 1008.0}
    r = gpu.summarize(ends, t0, _args())
    assert r["status"] == "ok" and r["timed_steps"] == 4
    assert r["step_seconds"] == pytest.approx((1008.0 - 1005.5) / 4)
    assert r["tokens_per_second_per_device"] == pytest.approx(200 / 0.625, abs=0.1)
    assert r["mfu"] == pytest.approx(320 * 1000 / 1e6, abs=1e-4)
    assert r["first_step_end_seconds"] == 5.0
    assert r["step_seconds_range"] == [0.5, 1.0]


def test_a_row_that_reads_back_only_every_nth_step_is_timed_on_the_same_window():
    # torchtitan as shipped reads its results back on logged steps only (1 and every log_freq-th):
    # the window is the same, single steps have no spread.
    ends = {1: 1010.0, 2: 1011.0, 6: 1013.0}
    r = gpu.summarize(ends, 1000.0, _args())
    assert r["status"] == "ok" and r["step_seconds"] == pytest.approx(0.5)
    assert "step_seconds_range" not in r


def test_a_row_without_the_window_ends_is_not_reported_as_a_speed():
    r = gpu.summarize({1: 1.0, 2: 2.0}, 0.0, _args())
    assert r["status"] == "failed" and "6" in r["error"]


def test_no_peak_means_no_mfu():
    r = gpu.summarize({2: 1.0, 6: 3.0}, 0.0, _args(peak_flops=None))
    assert r["status"] == "ok" and r["mfu"] is None


def test_why_failed_names_the_workers_exception_not_torchruns_summary():
    stderr = """[rank0]: Traceback (most recent call last):
[rank0]:   File "bench/gpu.py", line 1, in <module>
[rank0]: torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised: no C++ compiler
E1203 10:00:00 torch/distributed/elastic/multiprocessing/api.py:1 failed (exitcode: 1)
Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
"""
    why = gpu.why_failed(stderr)
    assert why == "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised: no C++ compiler"


def test_the_rows_compare_like_with_like_and_run_the_comparison_first():
    rows = gpu.rows_for(gpu=True, cpu_compile=False)
    names = [r.name for r in rows]
    assert names[:3] == [
        "llmtrain/compile/selective",
        "torchtitan/shipped/compile/selective",
        "torchtitan/our-loop/compile/selective",
    ]
    assert {"llmtrain/eager/selective", "plain", "llmtrain/compile/selective/float8"} <= set(names)
    first = rows[:3]
    assert all(r.compile and r.ac == "selective" for r in first)
    assert [r.loop for r in first[1:]] == ["shipped", "ours"]
    # The GPU boxes fit scripts/gpu-bench.sh's budget when the rows take what they are expected to:
    # each box covers a cold compile, and the budget cuts the extras, not the comparison.
    assert sum(r.box_s for r in first) <= 420
    cpu = [r.name for r in gpu.rows_for(gpu=False, cpu_compile=False)]
    assert cpu[:3] == [
        "llmtrain/eager/selective",
        "torchtitan/shipped/eager/selective",
        "torchtitan/our-loop/eager/selective",
    ]


def test_the_comparisons_pair_the_rows_they_name():
    ok = {"status": "ok"}
    results = {
        "llmtrain/compile/selective": ok | {"tokens_per_second_per_device": 30.0, "mfu": 0.5},
        "torchtitan/shipped/compile/selective": ok | {"tokens_per_second_per_device": 40.0},
        "torchtitan/our-loop/compile/selective": ok | {"tokens_per_second_per_device": 20.0},
        "plain": {"status": "failed"},
    }
    c = gpu.comparisons(results, gpu=True)
    assert c["llmtrain_over_torchtitan_shipped"] == 0.75
    assert c["llmtrain_over_torchtitan_our_loop"] == 1.5
    assert c["torchtitan_shipped_over_our_loop"] == 2.0
    assert "llmtrain_over_plain" not in c
    assert c["targets"] == {
        "llmtrain_over_torchtitan_shipped_at_least_1.0": False,
        "llmtrain_compile_mfu_at_least_0.45": True,
    }


def test_a_row_past_its_box_is_ended_with_its_whole_process_group(tmp_path):
    # A stand-in for torchrun: a child that starts a grandchild (a worker), both sleeping.
    pidfile = tmp_path / "grandchild"
    child = (
        "import subprocess, sys, time; "
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(60)"
    )
    t0 = time.monotonic()
    rc, _, _ = gpu._boxed([sys.executable, "-c", child], dict(os.environ), 3)
    assert rc is None and time.monotonic() - t0 < 30
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the grandchild was signalled; wait for it to be gone or a zombie
        try:
            state = Path(f"/proc/{pid}/status").read_text()
        except FileNotFoundError:
            break
        if re.search(r"^State:\s+Z", state, re.M):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the worker {pid} outlived its row's time box")


def test_wheel_list_pins_one_version_each_and_agrees_with_the_project_pins():
    pins = {}
    for line in (REPO / "bench" / "gpu_wheels.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"bench/gpu_wheels.txt: {line!r} is not NAME==VERSION"
            key = re.sub(r"[-_.]+", "-", name).lower()
            assert key not in pins, f"two versions of {name}"
            pins[key] = version
    assert pins["torchtitan"] == gpu.TORCHTITAN_VERSION
    assert f"TORCHTITAN_VERSION={gpu.TORCHTITAN_VERSION}" in (REPO / "scripts" / "torchtitan.sh").read_text()
    constraints = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if "==" in line:
            name, _, version = line.strip().partition("==")
            constraints[re.sub(r"[-_.]+", "-", name).lower()] = version
    for name in ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "torchao"):
        assert pins[name] == constraints[name], name


def _copy_of_the_command(tmp_path: Path) -> Path:
    """scripts/gpu-bench.sh in a tree of its own (it works from the tree it sits in)."""
    (tmp_path / "tree" / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "gpu-bench.sh", tmp_path / "tree" / "scripts")
    return tmp_path / "tree" / "scripts" / "gpu-bench.sh"


def test_the_one_command_says_what_is_missing_and_still_leaves_its_log(tmp_path):
    script = _copy_of_the_command(tmp_path)
    out = tmp_path / "out"
    r = subprocess.run(["bash", str(script)], env=dict(os.environ, OUT=str(out)), capture_output=True, text=True)
    assert r.returncode == 2
    assert "make gpu-wheels" in r.stdout and "carry .whl" in r.stdout
    assert "make gpu-wheels" in (out / "gpu-bench.log").read_text()
    r = subprocess.run(["bash", str(script)], env={k: v for k, v in os.environ.items() if k != "OUT"}, text=True)
    assert r.returncode != 0


def test_the_docs_give_the_one_command_as_the_script_does():
    page = (REPO / "docs" / "performance" / "gpu.md").read_text()
    header = (REPO / "scripts" / "gpu-bench.sh").read_text()
    command = re.search(r"run\s+command: (.+?)\s+carry: (\[.+?\])\s+timeout_s: (\d+)", header)
    assert command, "scripts/gpu-bench.sh's header names the device command"
    cmd, carry, timeout = command.groups()
    assert f"`{cmd}`" in page and f"`{carry}`" in page and f"`{timeout}`" in page
    assert "make gpu-wheels" in page and "make gpu-smoke" in page
    results = sorted((REPO / "bench" / "results").glob("gpu_h*.json"))
    if not results:  # no GPU run committed yet: the page must say so
        assert "not measured yet" in page


def test_budget_skips_rows_that_do_not_fit_and_still_writes_the_report(tmp_path):
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    bench = [sys.executable, str(REPO / "bench" / "gpu.py"), "--quick", "--device", "cpu", "--budget", "1"]
    r = subprocess.run(
        [*bench, "--out", str(out), "--table", str(md)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(out.read_text())
    for name, row in report["results"].items():
        assert row["status"] == "skipped", (name, row)
        assert "budget" in row["reason"] or row["reason"].startswith(("torchtitan:", "float8:")), row
    assert report["env"]["torch"] and report["budget_seconds"] == 1
    assert all(f"| {name} |" in md.read_text() for name in report["results"])


def test_torchtitan_rows_train_in_bf16_with_op_level_selective_ac():
    # The torchtitan row trained in fp32 (one rank: no FSDP, so its bf16 param policy never applied)
    # with JobConfig's default selective_ac_option "2" (full AC on every second block) (issue 32).
    spec = {
        "data": {"seqLen": 4096},
        "training": {"microBatchSize": 2, "maxSteps": 30, "warmupSteps": 2},
        "fsdp": {"activationCheckpointing": "selective", "compile": True},
    }
    shipped = gpu.titan_settings(spec, {"loop": "shipped", "log_freq": 10}, "cuda")
    ours = gpu.titan_settings(spec, {"loop": "ours", "log_freq": 10}, "cuda")
    for s in (shipped, ours):
        assert s["training.mixed_precision_param"] == "bfloat16"
        assert s["activation_checkpoint.mode"] == "selective"
        assert s["activation_checkpoint.selective_ac_option"] == "op"
        assert s["training.seq_len"] == 4096 and s["training.local_batch_size"] == 2 and s["compile.enable"]
    # As shipped: its compiled loss; in our loop the loss is ours (eager), so only the model compiles.
    assert shipped["compile.components"] == ["model", "loss"] and ours["compile.components"] == ["model"]
    assert shipped["metrics.log_freq"] == 10  # torchtitan's default cadence of reading results back
