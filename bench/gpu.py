"""One GPU, one command, one JSON file: llmtrain vs torchtitan vs a plain loop on a Llama-3-shaped ~1B model.

    .venv/bin/python bench/gpu.py --out gpu-bench.json                  # on a GPU machine (< 8 min)
    .venv/bin/python bench/gpu.py --quick --device cpu --out x.json     # the CPU path (run by make test)

Same shape, batch, sequence length and steps for every variant; each runs in its own process (fresh
CUDA context, fresh compile cache), the first `--warmup` steps dropped, then the median step:

  llmtrain/<compile>/<ac>  the real trainer (`-m llmtrain_trainer`, FSDP2 on a 1-GPU mesh, bf16
                           params, fp32 reductions) with torch.compile off/on and selective/full
                           activation checkpointing; step time from its own step lines
                           (`llmtrain.flops`: 6N + 12·L·H·q·T per token, catalog peak per GPU, the
                           same formula for every variant),
                           peak memory = torch.cuda.max_memory_allocated of the worker;
  plain                    a plain PyTorch loop on the same model (no FSDP, bf16 autocast, no AC,
                           no compile) — the floor of what the model costs;
  torchtitan               torchtitan's own Llama 3 model with its FSDP2/AC/compile setup
                           (`parallelize_llama`), same dims, batch and settings, driven by the same
                           minimal loop; needs `pip install torchtitan==0.2.2` (see --torchtitan-path:
                           the project venv does not carry it, its dependencies — datasets, pyarrow,
                           tensorboard — are not the trainer's). Skipped with the reason when absent;
  llmtrain/compile/selective/float8
                           the trainer with `fsdp.float8: true` (torchao float8 Linear layers in the
                           transformer blocks, dynamic tensorwise scaling), only on GPUs with float8
                           tensor cores (compute capability ≥ 8.9: H100/H200); elsewhere recorded as
                           skipped with the reason (the trainer refuses float8 there).

Targets (issue 12): llmtrain ≥ 1.0× torchtitan tokens/s on the same settings; MFU ≥ 45% with compile
on H100/H200.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ports import metrics_port

REPO = Path(__file__).resolve().parents[1]


# Llama 3.2 1B shape (untied embeddings here: ~1.5B parameters with the 128k vocabulary).
SHAPE_1B = {
    "hiddenSize": 2048,
    "intermediateSize": 8192,
    "numLayers": 16,
    "numHeads": 32,
    "numKvHeads": 8,
    "vocabSize": 128256,
    "maxSeqLen": 8192,
    "ropeTheta": 500000.0,
}
FLOAT8_ROW = "llmtrain/compile/selective/float8"
TORCHTITAN_VERSION = "0.2.2"
SHAPE_CPU = {
    "hiddenSize": 128,
    "intermediateSize": 384,
    "numLayers": 2,
    "numHeads": 4,
    "numKvHeads": 2,
    "vocabSize": 512,
    "maxSeqLen": 128,
    "ropeTheta": 500000.0,
}


def gpu_instance_type() -> str:
    """The catalog entry whose GPU matches this one (for the MFU peak)."""
    import torch

    name = torch.cuda.get_device_name()
    if "H200" in name:
        return "p5e.48xlarge"
    if "A100" in name:
        return "p4de.24xlarge"
    return "p5.48xlarge"  # H100 and anything else: the H100 peak


def job_spec(a: argparse.Namespace, compile_: bool, ac: str, float8: bool = False) -> dict:
    gpu = a.device == "cuda"
    return {
        "model": {"dims": a.shape},
        "data": {"uri": "synthetic", "seqLen": a.seq_len},
        "cluster": {"instanceType": a.instance_type, "processesPerNode": 1},
        "fsdp": {
            "shardingStrategy": "FULL_SHARD",
            "mixedPrecision": "bf16" if gpu else "fp32",
            "activationCheckpointing": ac,
            "compile": compile_,
            "float8": float8,
        },
        "training": {
            "maxSteps": a.steps,
            "globalBatchTokens": a.batch * a.seq_len,
            "microBatchSize": a.batch,
            "learningRate": 3e-4,
            "warmupSteps": 2,
            "seed": 0,
        },
        "rendezvous": {"backend": "c10d"},
    }


# -- workers (each in its own process) -------------------------------------------------------------


def _peak_memory() -> int:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated()
    from resource import RUSAGE_SELF, getrusage

    return getrusage(RUSAGE_SELF).ru_maxrss * 1024  # CPU path: peak RSS


def worker_llmtrain(spec_path: str) -> None:
    from llmtrain_trainer.__main__ import main as trainer_main

    rc = trainer_main(["--spec", spec_path])
    print(json.dumps({"peak_memory_bytes": _peak_memory(), "rc": rc}), flush=True)


def _minimal_loop(model, params, spec: dict, device, amp) -> dict:
    """The shared timed loop for `plain` and `torchtitan`: synthetic batches made before timing."""
    import torch
    import torch.nn.functional as F  # noqa: N812 — torch's own convention

    t = spec["training"]
    seq, batch, vocab = spec["data"]["seqLen"], t["microBatchSize"], spec["model"]["dims"]["vocabSize"]
    gen = torch.Generator().manual_seed(0)
    data = [torch.randint(0, vocab, (batch, seq + 1), generator=gen).to(device) for _ in range(4)]
    opt = torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.95), foreach=True)
    ends = []
    for s in range(t["maxSteps"]):
        x = data[s % len(data)]
        with amp():
            logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten(0, 1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        ends.append(time.time())
    return {"ends": ends, "peak_memory_bytes": _peak_memory(), "loss": loss.item()}


def worker_plain(spec_path: str) -> None:
    import contextlib

    import torch

    from llmtrain.defaults import resolve
    from llmtrain.spec import LLMTrainingJobSpec, resolve_dims
    from llmtrain_trainer.models.init import init_weights
    from llmtrain_trainer.models.llama import Llama

    raw = json.loads(Path(spec_path).read_text())
    dims = resolve_dims(resolve(LLMTrainingJobSpec.model_validate(raw)).model)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = Llama(dims)
    init_weights(model, 0)
    model.to(device)
    model.init_rope(device)
    amp = (lambda: torch.autocast("cuda", torch.bfloat16)) if device.type == "cuda" else contextlib.nullcontext
    print(json.dumps(_minimal_loop(model, list(model.parameters()), raw, device, amp)), flush=True)


def worker_torchtitan(spec_path: str) -> None:
    """torchtitan's Llama 3 and its parallelize_llama (FSDP2 + AC + compile) on a 1-GPU mesh."""
    import contextlib

    import torch
    import torch.distributed as dist

    raw = json.loads(Path(spec_path).read_text())
    d, f = raw["model"]["dims"], raw["fsdp"]
    # torchtitan derives the MLP width: h = int(2·4·dim/3), h = int(ffn_dim_multiplier·h), rounded up to
    # a multiple of multiple_of. Choose both so it lands on our intermediateSize (Llama 3.2 1B: 1.5, 256).
    import math

    from torchtitan.models.llama3 import TransformerModelArgs
    from torchtitan.models.llama3.model.model import Transformer

    base = int(2 * 4 * d["hiddenSize"] / 3)
    args = TransformerModelArgs(
        dim=d["hiddenSize"],
        n_layers=d["numLayers"],
        n_heads=d["numHeads"],
        n_kv_heads=d["numKvHeads"],
        vocab_size=d["vocabSize"],
        max_seq_len=raw["data"]["seqLen"],
        rope_theta=d["ropeTheta"],
        ffn_dim_multiplier=d["intermediateSize"] / base,
        multiple_of=math.gcd(d["intermediateSize"], 256),
    )
    # ... and check that it does.
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    with torch.device("meta"):
        model = Transformer(args)
    hidden = model.layers["0"].feed_forward.w1.out_features
    if hidden != d["intermediateSize"]:
        raise SystemExit(f"torchtitan MLP width {hidden} != {d['intermediateSize']}: set ffn_dim_multiplier")
    from torchtitan.config import JobConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.models.llama3.infra.parallelize import parallelize_llama

    job = JobConfig()
    job.activation_checkpoint.mode = f["activationCheckpointing"]
    job.compile.enable = f["compile"]
    job.compile.components = ["model"] if f["compile"] else []
    job.training.mixed_precision_param = "bfloat16" if device.type == "cuda" else "float32"
    dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=1)
    model = parallelize_llama(model, dims, job)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=device)
    print(json.dumps(_minimal_loop(model, list(model.parameters()), raw, device, contextlib.nullcontext)), flush=True)


# -- the driver ------------------------------------------------------------------------------------


def _run(kind: str, spec: dict, a: argparse.Namespace, tmp: str) -> dict:
    spec_file = os.path.join(tmp, f"{kind}.json")
    Path(spec_file).write_text(json.dumps(spec))
    env = dict(
        os.environ,
        LLMTRAIN_METRICS_PORT=metrics_port(),
        LLMTRAIN_LOG_LEVEL="WARNING",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(
            p
            for p in [a.torchtitan_path, str(REPO / "operator"), str(REPO / "trainer"), os.environ.get("PYTHONPATH")]
            if p
        ),
    )
    if a.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=1",
        __file__,
        f"--run-{kind}",
        spec_file,
    ]
    t0 = time.time()
    try:
        out = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=a.variant_timeout)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "seconds": a.variant_timeout}
    wall = round(time.time() - t0, 1)
    if out.returncode:
        err = out.stderr.strip().splitlines()
        # The worker's own reason, not torchrun's summary of it (which is all the last lines say).
        why = [
            ln
            for ln in err
            if ("Error" in ln or "Exit" in ln or " != " in ln)
            and "ChildFailedError" not in ln
            and not ln.lstrip().startswith(("File ", "raise ", "W1", "E1"))
        ]
        return {"status": "failed", "seconds": wall, "error": "\n".join(why[-3:] or err[-6:])}
    lines = [json.loads(ln) for ln in out.stdout.splitlines() if ln.startswith("{")]
    result = lines[-1]
    if kind == "llmtrain":
        # Same clock as the minimal loops: time between consecutive step ends (bookkeeping included).
        ends = [e["time"] for e in lines if e.get("event") == "step"]
        times = [y - x for x, y in zip(ends[a.warmup :], ends[a.warmup + 1 :], strict=False)]
        return _summary(times, result["peak_memory_bytes"], spec, a, wall)
    times = [b - x for x, b in zip(result["ends"][a.warmup :], result["ends"][a.warmup + 1 :], strict=False)]
    return _summary(times, result["peak_memory_bytes"], spec, a, wall)


def _summary(step_seconds: list[float], peak: int, spec: dict, a: argparse.Namespace, wall: float) -> dict:
    from llmtrain import flops
    from llmtrain.catalog import instance_type
    from llmtrain.defaults import resolve
    from llmtrain.spec import LLMTrainingJobSpec, resolve_dims

    dims = resolve_dims(resolve(LLMTrainingJobSpec.model_validate(spec)).model)
    med = statistics.median(step_seconds)
    tps = a.batch * a.seq_len / med
    fpt = flops.flops_per_token(dims, a.seq_len)
    peak_flops = instance_type(a.instance_type).peak_flops_per_device
    return {
        "status": "ok",
        "seconds": wall,
        "timed_steps": len(step_seconds),
        "step_seconds_median": round(med, 5),
        "step_seconds_spread": [round(min(step_seconds), 5), round(max(step_seconds), 5)],
        "tokens_per_second": round(tps, 1),
        "mfu": round(flops.mfu(tps, fpt, peak_flops), 4),
        "peak_memory_gib": round(peak / 2**30, 3),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for kind in ("llmtrain", "plain", "torchtitan"):
        p.add_argument(f"--run-{kind}", help=argparse.SUPPRESS)
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--batch", type=int, default=2, help="sequences per step")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=8, help="steps dropped (compile happens in the first)")
    p.add_argument("--variant-timeout", type=int, default=150, help="seconds per variant")
    p.add_argument("--torchtitan-path", help="a directory with torchtitan installed (pip install --target)")
    p.add_argument("--quick", action="store_true", help="a tiny shape and 4 steps: the CPU path, for tests")
    p.add_argument("--out", default="gpu-bench.json")
    a = p.parse_args(argv)
    for kind in ("llmtrain", "plain", "torchtitan"):
        if getattr(a, f"run_{kind}"):
            globals()[f"worker_{kind}"](getattr(a, f"run_{kind}"))
            return 0

    if a.device != "cpu":  # the CPU path (make test) leaves torch to the variants' own processes (~4 s CPU)
        import torch

        if a.device == "auto":
            a.device = "cuda" if torch.cuda.is_available() else "cpu"
        if a.device == "cuda" and not torch.cuda.is_available():
            sys.exit("--device cuda: no GPU visible")
    a.shape = SHAPE_1B if a.device == "cuda" and not a.quick else SHAPE_CPU
    if a.quick:
        a.seq_len, a.batch, a.steps, a.warmup = min(a.seq_len, 64), 2, 4, 1
    a.instance_type = gpu_instance_type() if a.device == "cuda" else "cpu"
    gpu = a.device == "cuda"

    variants: list[tuple[str, str, bool, str, bool]] = []  # (name, kind, compile, ac, float8)
    for compile_ in (False, True) if gpu else (False,):  # inductor on CPU needs a C++ toolchain
        for ac in ("selective", "full"):
            variants.append((f"llmtrain/{'compile' if compile_ else 'eager'}/{ac}", "llmtrain", compile_, ac, False))
    variants += [
        (FLOAT8_ROW, "llmtrain", True, "selective", True),
        ("plain", "plain", False, "none", False),
        (
            "torchtitan/compile/selective" if gpu else "torchtitan/eager/selective",
            "torchtitan",
            gpu,
            "selective",
            False,
        ),
    ]
    fp8_missing = float8_unsupported(a.device)
    t_start = time.time()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, kind, compile_, ac, float8 in variants:
            if kind == "torchtitan" and not _has_torchtitan(a.torchtitan_path):
                results[name] = {
                    "status": "skipped",
                    "reason": "torchtitan is not installed: "
                    f"scripts/torchtitan.sh, then --torchtitan-path (torchtitan=={TORCHTITAN_VERSION})",
                }
                continue
            if float8 and fp8_missing:
                results[name] = {"status": "skipped", "reason": fp8_missing}
                continue
            results[name] = _run(kind, job_spec(a, compile_, ac, float8), a, tmp)
            print(f"{name:32} {json.dumps(results[name])}", flush=True)
    ok = {k: v for k, v in results.items() if v.get("status") == "ok"}
    comparisons = {}
    tt = ok.get("torchtitan/compile/selective") or ok.get("torchtitan/eager/selective")
    ours = ok.get("llmtrain/compile/selective") or ok.get("llmtrain/eager/selective")
    if tt and ours:
        comparisons["llmtrain_over_torchtitan_tokens_per_second"] = round(
            ours["tokens_per_second"] / tt["tokens_per_second"], 3
        )
    if FLOAT8_ROW in ok and "llmtrain/compile/selective" in ok:
        comparisons["float8_over_bf16_tokens_per_second"] = round(
            ok[FLOAT8_ROW]["tokens_per_second"] / ok["llmtrain/compile/selective"]["tokens_per_second"], 3
        )
    if "plain" in ok and ours:
        comparisons["llmtrain_over_plain_tokens_per_second"] = round(
            ours["tokens_per_second"] / ok["plain"]["tokens_per_second"], 3
        )
    report = {
        "bench": "gpu",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_start)),
        "device": torch.cuda.get_device_name() if gpu else "cpu",
        "torch": torch_version(),
        "instance_type_for_peak": a.instance_type,
        "model": a.shape,
        "seq_len": a.seq_len,
        "batch": a.batch,
        "steps": a.steps,
        "warmup": a.warmup,
        "quick": a.quick,
        "results": results,
        "comparisons": comparisons,
        "seconds": round(time.time() - t_start, 1),
    }
    Path(a.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(comparisons))
    print(f"wrote {a.out} ({report['seconds']} s)")
    return 0


def torch_version() -> str:
    """torch.__version__ with its build label (e.g. 2.15.0+cu132; the package metadata drops it),
    read from torch/version.py so that the CPU path's driver need not import torch for it."""
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin, "torch is not installed"
    found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", Path(spec.origin).with_name("version.py").read_text(), re.M)
    assert found, "no __version__ in torch/version.py"
    return found.group(1)


def float8_unsupported(device: str) -> str | None:
    """Why the float8 row cannot run on this device, or None when it can."""
    if device != "cuda":
        return "float8 needs a GPU with float8 tensor cores (H100/H200); this run is on cpu"
    import torch

    cap = torch.cuda.get_device_capability()
    if cap < (8, 9):
        return (
            f"float8 needs compute capability ≥ 8.9 (H100/H200); {torch.cuda.get_device_name()} has {cap[0]}.{cap[1]}"
        )
    return None


def _has_torchtitan(path: str | None) -> bool:
    import importlib.util

    if path:
        sys.path.insert(0, path)
    try:
        return importlib.util.find_spec("torchtitan") is not None
    finally:
        if path:
            sys.path.remove(path)


if __name__ == "__main__":
    sys.exit(main())
