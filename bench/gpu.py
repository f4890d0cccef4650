"""One GPU, one command, one JSON file: llmtrain against torchtitan on a Llama-3-shaped ~1.5B model.

    bash scripts/gpu-bench.sh                                 # the borrowed GPU machine (docs/performance/gpu.md)
    .venv/bin/python bench/gpu.py --out gpu-bench.json         # any GPU machine with the project's venv
    .venv/bin/python bench/gpu.py --quick --device cpu --out x.json     # the CPU path (make test, make gpu-smoke)
    python3 bench/gpu.py --table-from bench/results/gpu_smoke_cpu.json  # a result file's docs table

Every row trains the same shape, batch and sequence length for the same steps, each in its own process
(launched by torchrun: fresh CUDA context, fresh compile cache), and is timed by the same clock: wall
seconds from the end of step `--warmup` to the end of the last step, a step's end being read on the host
after that step's results came back from the device (so compile and warm-up stay out). tokens/s is per
device (one device here); MFU = tokens/s × FLOPs per token (llmtrain.flops, torchtitan's formula too: the
torchtitan rows report theirs and the driver checks they agree) ÷ the GPU's dense BF16 peak (`peak_for`).

Rows, in the order they run (each time-boxed; a row that does not fit the budget is skipped, saying so):

  llmtrain/compile/selective   the real trainer (`-m llmtrain_trainer`): FSDP2 on a 1-GPU mesh, bf16
                               params and fp32 reductions, op-level selective activation checkpointing,
                               each block compiled; its own step lines give the step ends
  torchtitan/shipped/compile/selective
                               torchtitan as shipped: its Llama 3, `parallelize_llama` (op-level selective
                               AC, each block compiled), its single-device bf16 policy (autocast: with one
                               rank torchtitan applies no FSDP), its compiled loss, fused AdamW, LR
                               schedule, GC control and its own `Trainer.train_step`, logging (and so
                               reading results back) every `--log-freq` steps as it does
  torchtitan/our-loop/compile/selective
                               torchtitan's model and `parallelize_llama` as above, its autocast, driven by
                               this script's minimal loop: eager fp32 loss, foreach AdamW, a read-back
                               every step — what torchtitan's loop is worth, against the row above
  llmtrain/eager/selective     the trainer without compile
  plain                        this project's Llama in the minimal loop: bf16 autocast, no FSDP, no
                               checkpointing, no compile — what the model alone costs
  llmtrain/compile/selective/float8
                               the trainer with `fsdp.float8` (torchao Float8Linear in the blocks), on
                               GPUs with float8 tensor cores (compute capability ≥ 8.9)

On the CPU (`--device cpu`) the same rows run eager at a tiny shape (`--cpu-compile` adds the compile rows:
inductor's C++ backend), the float8 row is skipped with its reason. Before the rows, a probe process
imports what each row needs and says in one line which feature is missing; a row needing it is skipped
with that line. The report also records the versions found (python, torch, CUDA, triton, torchtitan ...).

Targets (issue 32): llmtrain ≥ 1.0× torchtitan as shipped in tokens/s on one H200 at the same settings;
MFU ≥ 45% with compile.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The operator package (spec, catalog, FLOPs) and the trainer from the source tree, so that the driver
# also runs under a bare python3 (the GPU machine's) with no editable install.
for _p in (REPO / "trainer", REPO / "operator"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from ports import metrics_port  # noqa: E402 — bench/ is this script's directory

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
TORCHTITAN_VERSION = "0.2.2"  # scripts/torchtitan.sh and bench/gpu_wheels.txt pin the same

# Dense BF16 tensor-core peak per GPU for the GPUs the catalog has no instance type for: H100 PCIe and
# H100 NVL are slower parts than the SXM H100 of p5 (NVIDIA's H100 datasheet, without sparsity; the
# figures torchtitan's get_peak_flops uses). Checked before the catalog, whose H100 is the SXM part.
PEAK_OFF_CATALOG = {("H100", "NVL"): 835e12, ("H100", "PCIe"): 756e12}


def peak_for(device_name: str) -> tuple[float | None, str, str]:
    """(dense BF16 peak FLOP/s, where it comes from, the catalog instance type for the trainer's spec)
    of a GPU named as torch.cuda.get_device_name() names it. The peak is None (and MFU is not computed)
    for a GPU neither the catalog nor PEAK_OFF_CATALOG knows."""
    from llmtrain.catalog import instance_types

    gpus = {name: t for name, t in instance_types().items() if t.is_gpu}
    for (model, variant), peak in PEAK_OFF_CATALOG.items():
        if model in device_name and variant in device_name:
            fallback = next(n for n, t in gpus.items() if t.gpu.startswith(model))
            return peak, f"NVIDIA datasheet, {model} {variant} (not in the catalog)", fallback
    for name, t in gpus.items():
        model = t.gpu.split("-")[0]  # "H200-SXM-141GB" -> "H200"
        if re.search(rf"\b{model}\b", device_name):
            return t.peak_flops_per_device, f"catalog {name} ({t.gpu})", name
    return None, f"no dense BF16 peak known for {device_name!r}: MFU not computed", "p5.48xlarge"


@dataclass(frozen=True)
class Row:
    name: str
    kind: str  # llmtrain | plain | torchtitan
    what: str
    compile: bool = False
    ac: str = "selective"
    float8: bool = False
    loop: str = "ours"  # torchtitan rows: "shipped" (its Trainer.train_step) or "ours" (the minimal loop)
    box_s: int = 60  # seconds on a GPU, start and cold compile included

    @property
    def needs(self) -> tuple[str, ...]:
        return (
            ("trainer",)
            + (("torchtitan",) if self.kind == "torchtitan" else ())
            + (("compile",) if self.compile else ())
            + (("float8",) if self.float8 else ())
        )


def rows_for(gpu: bool, cpu_compile: bool) -> list[Row]:
    """The rows in the order they run: the comparison first, so that a short budget cuts the extras."""
    c = "compile" if gpu or cpu_compile else "eager"
    tt_shipped = (
        "torchtitan as shipped: its model, parallelize_llama, single-device bf16 autocast, compiled loss, "
        "fused AdamW, its train_step"
    )
    tt_ours = "torchtitan's model and parallelize_llama, its autocast, in our minimal loop (eager loss, foreach AdamW)"
    compiled = gpu or cpu_compile
    rows = [
        Row(
            f"llmtrain/{c}/selective",
            "llmtrain",
            "llmtrain's trainer: FSDP2 (1-rank mesh), op-level SAC",
            compiled,
            box_s=150,
        ),
        Row(f"torchtitan/shipped/{c}/selective", "torchtitan", tt_shipped, compiled, loop="shipped", box_s=150),
        Row(f"torchtitan/our-loop/{c}/selective", "torchtitan", tt_ours, compiled, loop="ours", box_s=120),
    ]
    if compiled:
        rows.append(Row("llmtrain/eager/selective", "llmtrain", "llmtrain's trainer without compile", box_s=60))
    rows += [
        Row("plain", "plain", "our Llama, bf16 autocast, no FSDP/AC/compile, minimal loop", ac="none", box_s=60),
        Row(
            "llmtrain/compile/selective/float8",
            "llmtrain",
            "llmtrain's trainer with fsdp.float8 (torchao, tensorwise)",
            True,
            float8=True,
            box_s=150,
        ),
    ]
    return rows


def job_spec(a: argparse.Namespace, row: Row) -> dict:
    gpu = a.device == "cuda"
    return {
        "model": {"dims": a.shape},
        "data": {"uri": "synthetic", "seqLen": a.seq_len},
        "cluster": {"instanceType": a.instance_type, **({} if gpu else {"processesPerNode": 1})},
        "fsdp": {
            "shardingStrategy": "FULL_SHARD",
            "mixedPrecision": "bf16" if gpu else "fp32",
            "activationCheckpointing": row.ac,
            "compile": row.compile,
            "float8": row.float8,
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


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:300]


def worker_probe(device: str) -> None:
    """Which features this machine has, each None or one line saying what is missing, and the versions
    found. Printed as one JSON line; never raises."""
    import importlib.metadata as md
    import platform
    import shutil

    missing: dict[str, str | None] = {}
    env: dict = {"python": platform.python_version(), "python_executable": sys.executable}
    try:
        import torch

        env["torch"] = torch.__version__
        env["cuda"] = torch.version.cuda
        gpu = torch.cuda.is_available() and device != "cpu"
        env["device"] = "cuda" if gpu else "cpu"
        if gpu:
            props = torch.cuda.get_device_properties(0)
            env |= {
                "gpu": torch.cuda.get_device_name(0),
                "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
                "multiprocessors": props.multi_processor_count,
                "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            }
            smi = shutil.which("nvidia-smi")
            if smi:
                q = subprocess.run(
                    [smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
                )
                env["driver"] = q.stdout.strip() or None
    except Exception as err:  # noqa: BLE001 — the probe reports every failure as one line
        print(json.dumps({"env": env, "missing": {"torch": _one_line(err)}}), flush=True)
        return
    for dist_name in ("triton", "torchao", "torchtitan", "pydantic", "numpy"):
        try:
            env[dist_name] = md.version(dist_name)
        except md.PackageNotFoundError:
            env[dist_name] = None

    def check(feature: str, fn) -> None:
        try:
            missing[feature] = fn()
        except BaseException as err:  # noqa: BLE001 — ImportError, AttributeError, SystemExit ...: one line each
            missing[feature] = f"{feature}: {_one_line(err)}"

    def trainer() -> None:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: F401
        from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts  # noqa: F401

        import llmtrain_trainer.train  # noqa: F401 — the whole trainer: torch APIs, pydantic, the spec

    def compile_() -> str | None:
        if gpu:
            import triton  # noqa: F401 — inductor's GPU backend

            return None
        cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
        return None if cxx else "compile: no C++ compiler for inductor's CPU backend"

    def float8() -> str | None:
        if not gpu:
            return "float8: needs a GPU with float8 tensor cores (H100/H200); this run is on cpu"
        cap = torch.cuda.get_device_capability(0)
        if cap < (8, 9):
            return f"float8: needs compute capability ≥ 8.9 (H100/H200); {env['gpu']} has {cap[0]}.{cap[1]}"
        from llmtrain.catalog import ModelDims
        from llmtrain_trainer.distributed.parallel import convert_float8
        from llmtrain_trainer.models.llama import Llama

        with torch.device("meta"):
            model = Llama(ModelDims(256, 512, 1, 4, 2, 512))
        n = convert_float8(model)
        return None if n else "float8: torchao converted no Linear layer"

    def torchtitan() -> str | None:
        if env["torchtitan"] is None:
            return (
                f"torchtitan: not installed (torchtitan=={TORCHTITAN_VERSION}: make gpu-wheels on the GPU "
                "machine, scripts/torchtitan.sh with --torchtitan-path elsewhere)"
            )
        if env["torchtitan"] != TORCHTITAN_VERSION:
            return f"torchtitan: {env['torchtitan']} found, the bench is written for {TORCHTITAN_VERSION}"
        import torchtitan.models.llama3
        import torchtitan.train  # noqa: F401

        return None

    check("trainer", trainer)
    check("compile", compile_)
    check("float8", float8)
    check("torchtitan", torchtitan)
    print(json.dumps({"env": env, "missing": missing}), flush=True)


def _peak_memory() -> int:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated()
    from resource import RUSAGE_SELF, getrusage

    return getrusage(RUSAGE_SELF).ru_maxrss * 1024  # CPU path: peak RSS


def _says_why(worker):
    """A worker that fails prints its exception in one line on stdout first (the driver's reason for the
    row; torchrun's own summary of a failed worker names no cause), then fails as before."""

    def run(spec_path: str) -> None:
        try:
            worker(spec_path)
        except BaseException as err:
            if not (isinstance(err, SystemExit) and err.code in (0, None)):
                print(json.dumps({"error": _one_line(err)}), flush=True)
            raise

    return run


@_says_why
def worker_llmtrain(spec_path: str) -> None:
    from llmtrain_trainer.__main__ import main as trainer_main

    rc = trainer_main(["--spec", spec_path])
    print(json.dumps({"peak_memory_bytes": _peak_memory(), "rc": rc}), flush=True)


def _batches(job: dict, device, n: int = 4) -> list:
    """Synthetic token batches (batch, seq + 1), made before timing; the rows cycle through them."""
    import torch

    t = job["spec"]["training"]
    seq, vocab = job["spec"]["data"]["seqLen"], job["spec"]["model"]["dims"]["vocabSize"]
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (t["microBatchSize"], seq + 1), generator=gen).to(device) for _ in range(n)]


def _minimal_loop(model, params, job: dict, device, amp) -> dict:
    """The timed loop of `plain` and `torchtitan/our-loop`: eager fp32 loss, foreach AdamW and clipping,
    and a read-back of the loss at every step's end."""
    import torch
    import torch.nn.functional as F  # noqa: N812 — torch's own convention

    data = _batches(job, device)
    opt = torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.95), foreach=True)
    ends, losses = {}, []
    for s in range(job["spec"]["training"]["maxSteps"]):
        x = data[s % len(data)]
        with amp:
            logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten(0, 1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        ends[s + 1] = time.time()
    return {"ends": ends, "peak_memory_bytes": _peak_memory(), "loss_first": losses[0], "loss_last": losses[-1]}


@_says_why
def worker_plain(spec_path: str) -> None:
    import contextlib

    import torch

    from llmtrain.defaults import resolve
    from llmtrain.spec import LLMTrainingJobSpec, resolve_dims
    from llmtrain_trainer.models.init import init_weights
    from llmtrain_trainer.models.llama import Llama

    job = json.loads(Path(spec_path).read_text())
    dims = resolve_dims(resolve(LLMTrainingJobSpec.model_validate(job["spec"])).model)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = Llama(dims)
    init_weights(model, 0)
    model.to(device)
    model.init_rope(device)
    amp = torch.autocast("cuda", torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    print(json.dumps(_minimal_loop(model, list(model.parameters()), job, device, amp)), flush=True)


class _StepLog:
    """torchtitan's metrics processor as Trainer.train_step calls it: `should_log` with its rule (step 1
    and every log_freq-th step), `log` with the values it read back. Records when each logged step ended."""

    def __init__(self, log_freq: int):
        self.log_freq = log_freq
        self.ends: dict[int, float] = {}
        self.losses: list[float] = []

    def should_log(self, step: int) -> bool:
        return step == 1 or step % self.log_freq == 0

    def log(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=None) -> None:
        self.ends[step] = time.time()  # after train_step's loss.item() and grad_norm.item()
        self.losses.append(float(global_avg_loss))


class _NoCheckpoint:
    def maybe_wait_for_staging(self) -> None:
        pass


def titan_settings(spec: dict, row: dict, device_type: str) -> dict:
    """What the torchtitan rows change in torchtitan's JobConfig defaults ("section.field": value)."""
    t = spec["training"]
    return {
        "training.seq_len": spec["data"]["seqLen"],
        "training.local_batch_size": t["microBatchSize"],
        "training.steps": t["maxSteps"],
        # Its mixed precision: bf16 on a GPU (with one rank, by autocast: maybe_enable_amp); fp32 on CPU.
        "training.mixed_precision_param": "bfloat16" if device_type == "cuda" else "float32",
        # Op-level selective AC, as llmtrain's rows (JobConfig's default "2" is full AC on every 2nd block).
        "activation_checkpoint.mode": spec["fsdp"]["activationCheckpointing"],
        "activation_checkpoint.selective_ac_option": "op",
        "compile.enable": spec["fsdp"]["compile"],
        # As shipped it compiles the model and the loss; our loop's loss is eager, so only the model.
        "compile.components": ["model", "loss"] if row["loop"] == "shipped" else ["model"],
        "optimizer.lr": 3e-4,
        "lr_scheduler.warmup_steps": t["warmupSteps"],
        "metrics.log_freq": row["log_freq"],
    }


@_says_why
def worker_torchtitan(spec_path: str) -> None:
    """torchtitan's Llama 3 with its own parallelize_llama, bf16 policy and (loop "shipped") its own
    Trainer.train_step, optimizer, LR schedule, loss and GC control; or (loop "ours") the minimal loop."""
    import math

    import torch
    import torch.distributed as dist

    job = json.loads(Path(spec_path).read_text())
    spec, row = job["spec"], job["row"]
    d, seq = spec["model"]["dims"], spec["data"]["seqLen"]
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")

    from torchtitan.components.loss import build_cross_entropy_loss
    from torchtitan.components.lr_scheduler import build_lr_schedulers
    from torchtitan.components.optimizer import build_optimizers
    from torchtitan.config import JobConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.models.llama3 import Transformer, TransformerModelArgs, parallelize_llama
    from torchtitan.tools.utils import GarbageCollection

    # torchtitan derives the MLP width: h = int(2·4·dim/3), h = int(ffn_dim_multiplier·h), rounded up to a
    # multiple of multiple_of. Chosen so that it lands on intermediateSize (Llama 3.2 1B: 1.5, 256).
    base = int(2 * 4 * d["hiddenSize"] / 3)
    args = TransformerModelArgs(
        dim=d["hiddenSize"],
        n_layers=d["numLayers"],
        n_heads=d["numHeads"],
        n_kv_heads=d["numKvHeads"],
        vocab_size=d["vocabSize"],
        rope_theta=d["ropeTheta"],
        ffn_dim_multiplier=d["intermediateSize"] / base,
        multiple_of=math.gcd(d["intermediateSize"], 256),
    )
    cfg = JobConfig()
    for path, value in titan_settings(spec, row, device.type).items():
        section, field = path.split(".")
        setattr(getattr(cfg, section), field, value)
    args.update_from_config(cfg)
    dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=1)
    with torch.device("meta"):
        model = Transformer(args)
    hidden = model.layers["0"].feed_forward.w1.out_features
    if hidden != d["intermediateSize"]:
        raise SystemExit(f"torchtitan MLP width {hidden} != {d['intermediateSize']}: set ffn_dim_multiplier")
    n_params, flops_per_token = args.get_nparams_and_flops(model, seq)
    model = parallelize_llama(model, dims, cfg)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    amp = dist_utils.maybe_enable_amp(dims, cfg.training.mixed_precision_param, device.type)
    facts = {"params": n_params, "flops_per_token": flops_per_token, "amp": type(amp).__name__}
    if row["loop"] == "ours":
        out = _minimal_loop(model, list(model.parameters()), job, device, amp)
        print(json.dumps({**out, **facts}), flush=True)
        return

    from torchtitan.train import Trainer

    if device.type == "cpu":
        # torchtitan assumes a GPU: its device_type is "cuda" when torch finds no accelerator, and its
        # ParallelDims builds the mesh train_step asks for on it. The CPU path (tests, make gpu-smoke)
        # builds it on the CPU instead; on a GPU nothing is changed.
        import torchtitan.distributed.parallel_dims as titan_dims

        titan_dims.device_type = "cpu"
    # Trainer.train_step, torchtitan's own step, on a Trainer holding what __init__ would build for this
    # job minus what the bench replaces: the dataset (synthetic batches, on the host as its loader gives
    # them), checkpointing (off, as by default) and the metrics processor (_StepLog: same log cadence).
    tr = Trainer.__new__(Trainer)
    tr.job_config, tr.parallel_dims, tr.device, tr.model_args = cfg, dims, device, args
    tr.model_parts, tr.tokenizer, tr.gradient_accumulation_steps = [model], None, 1
    tr.optimizers = build_optimizers([model], cfg.optimizer, dims)
    tr.lr_schedulers = build_lr_schedulers(tr.optimizers, cfg.lr_scheduler, cfg.training.steps)
    tr.loss_fn = build_cross_entropy_loss(cfg)
    tr.train_context = dist_utils.get_train_context(False)
    tr.maybe_enable_amp = amp
    tr.checkpointer = _NoCheckpoint()
    tr.metrics_processor = log = _StepLog(cfg.metrics.log_freq)
    tr.gc_handler = GarbageCollection(gc_freq=cfg.training.gc_freq)
    tr.step, tr.ntokens_seen = 0, 0
    batches = [({"input": x[:, :-1].cpu()}, x[:, 1:].cpu()) for x in _batches(job, "cpu")]

    def data():
        while True:
            yield from batches

    it = data()
    for _ in range(cfg.training.steps):
        tr.step += 1
        tr.gc_handler.run(tr.step)
        tr.train_step(it)
    facts["optimizer"] = type(tr.optimizers.optimizers[0]).__name__
    facts["fused"] = bool(tr.optimizers.optimizers[0].defaults.get("fused"))
    print(
        json.dumps(
            {
                "ends": log.ends,
                "peak_memory_bytes": _peak_memory(),
                "loss_first": log.losses[0],
                "loss_last": log.losses[-1],
                **facts,
            }
        ),
        flush=True,
    )


# -- the driver ------------------------------------------------------------------------------------


def _boxed(cmd: list[str], env: dict, box_s: float) -> tuple[int | None, str, str]:
    """Run cmd in a process group of its own; past box_s, end the whole group (torchrun and its workers,
    so nothing keeps the GPU for the next row). Returns (returncode or None on timeout, stdout, stderr)."""
    proc = subprocess.Popen(
        cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=box_s)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
                out, err = proc.communicate(timeout=grace)
                break
            except ProcessLookupError:
                out, err = proc.communicate()
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            out, err = "", ""
        return None, out, err


def why_failed(stderr: str) -> str:
    """A failed process's reason in one line, when it printed none itself: the last exception line in its
    stderr that is not torchrun's summary of a failed worker."""
    lines = [re.sub(r"^\[rank\d+\]:\s*", "", ln).strip() for ln in stderr.strip().splitlines()]
    exc = [
        ln
        for ln in lines
        if re.match(r"^[\w.]*[A-Z]\w*(Error|Exception|Exit|Interrupt|Unsupported|Failed)\b:?", ln)
        and "ChildFailedError" not in ln
    ]
    if exc:
        return exc[-1][:400]
    return (lines[-1] if lines else "no output")[:400]


def _env(a: argparse.Namespace) -> dict:
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
    return env


def probe(a: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--run-probe", a.device]
    rc, out, err = _boxed(cmd, _env(a), 180)
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if rc != 0 or not lines:
        sys.exit(f"bench/gpu.py: the probe failed: {why_failed(err)}")
    return json.loads(lines[-1])


def run_row(row: Row, a: argparse.Namespace, tmp: Path, box_s: float) -> dict:
    spec = job_spec(a, row)
    spec_file = tmp / f"{row.name.replace('/', '_')}.json"
    if row.kind == "llmtrain":
        spec_file.write_text(json.dumps(spec))
    else:
        spec_file.write_text(json.dumps({"spec": spec, "row": {"loop": row.loop, "log_freq": a.log_freq}}))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1"]
    cmd += [__file__, f"--run-{row.kind}", str(spec_file)]
    # A compile cache of the row's own (inductor's default is shared in /tmp): each row compiles cold.
    cache = tmp / f"{spec_file.stem}.cache"
    env = _env(a) | {"TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"), "TRITON_CACHE_DIR": str(cache / "triton")}
    t0 = time.time()
    rc, out, err = _boxed(cmd, env, box_s)
    wall = round(time.time() - t0, 1)
    lines = []
    for ln in out.splitlines():
        if ln.startswith("{"):
            try:
                lines.append(json.loads(ln))
            except json.JSONDecodeError:
                continue
    if row.kind == "llmtrain":
        ends = {e["step"]: e["time"] for e in lines if e.get("event") == "step"}
    else:
        ends = {int(k): v for k, v in lines[-1]["ends"].items()} if lines and "ends" in lines[-1] else {}
    base = {"what": row.what, "box_seconds": round(box_s), "seconds": wall}
    if rc is None:
        done = max(ends, default=0)
        return {**base, "status": "timeout", "error": f"time box of {round(box_s)} s reached after step {done}"}
    said = [ln["error"] for ln in lines if "error" in ln]
    if rc != 0 or said or not lines or lines[-1].get("rc"):
        return {**base, "status": "failed", "error": said[-1] if said else why_failed(err)}
    result = lines[-1]
    return {**base, **summarize(ends, t0, a), **_facts(result, a)}


def _facts(result: dict, a: argparse.Namespace) -> dict:
    out = {
        "peak_memory_gib": round(result["peak_memory_bytes"] / 2**30, 3),
        **{k: round(result[k], 4) for k in ("loss_first", "loss_last") if k in result},
    }
    for k in ("params", "flops_per_token", "amp", "optimizer", "fused"):
        if k in result:
            out[k] = result[k]
    if "flops_per_token" in result and result["flops_per_token"] != a.flops_per_token:
        out["flops_per_token_mismatch"] = f"torchtitan counts {result['flops_per_token']}, llmtrain {a.flops_per_token}"
    return out


def summarize(ends: dict[int, float], t0: float, a: argparse.Namespace) -> dict:
    """The one timer of every row: wall seconds from the end of step `warmup` to the end of the last step,
    over the steps in between."""
    if a.warmup not in ends or a.steps not in ends:
        return {"status": "failed", "error": f"no end time for step {a.warmup} or {a.steps} (got {sorted(ends)})"}
    window = ends[a.steps] - ends[a.warmup]
    steps = a.steps - a.warmup
    step_s = window / steps
    tps = a.batch * a.seq_len / step_s
    out = {
        "status": "ok",
        "timed_steps": steps,
        "step_seconds": round(step_s, 5),
        "tokens_per_second_per_device": round(tps, 1),
        "mfu": round(tps * a.flops_per_token / a.peak_flops, 4) if a.peak_flops else None,
        "first_step_end_seconds": round(ends[min(ends)] - t0, 1),  # start, init and cold compile
    }
    timed = [ends[s] - ends[s - 1] for s in range(a.warmup + 1, a.steps + 1) if s in ends and s - 1 in ends]
    if len(timed) == steps:  # a read-back at every step: the spread of single steps
        out["step_seconds_range"] = [round(min(timed), 5), round(max(timed), 5)]
    return out


def comparisons(results: dict[str, dict], gpu: bool) -> dict:
    ok = {k: v for k, v in results.items() if v.get("status") == "ok"}

    def ratio(x: str, y: str) -> float | None:
        if x in ok and y in ok:
            return round(ok[x]["tokens_per_second_per_device"] / ok[y]["tokens_per_second_per_device"], 3)
        return None

    c = "compile" if "llmtrain/compile/selective" in results else "eager"
    pairs = {
        "llmtrain_over_torchtitan_shipped": (f"llmtrain/{c}/selective", f"torchtitan/shipped/{c}/selective"),
        "llmtrain_over_torchtitan_our_loop": (f"llmtrain/{c}/selective", f"torchtitan/our-loop/{c}/selective"),
        "torchtitan_shipped_over_our_loop": (f"torchtitan/shipped/{c}/selective", f"torchtitan/our-loop/{c}/selective"),
        "llmtrain_compile_over_eager": ("llmtrain/compile/selective", "llmtrain/eager/selective"),
        "llmtrain_over_plain": (f"llmtrain/{c}/selective", "plain"),
        "float8_over_bf16": ("llmtrain/compile/selective/float8", "llmtrain/compile/selective"),
    }
    out: dict = {k: r for k, (x, y) in pairs.items() if (r := ratio(x, y)) is not None}
    if gpu:
        ours = ok.get("llmtrain/compile/selective", {})
        vs = out.get("llmtrain_over_torchtitan_shipped")
        out["targets"] = {
            "llmtrain_over_torchtitan_shipped_at_least_1.0": None if vs is None else vs >= 1.0,
            "llmtrain_compile_mfu_at_least_0.45": None if ours.get("mfu") is None else ours["mfu"] >= 0.45,
        }
    return out


def table(report: dict) -> str:
    """The docs table of a report (docs/performance/gpu.md)."""
    env = report["env"]
    head = (
        f"{env.get('gpu', 'cpu')}, torch {env.get('torch')}, python {env.get('python')}; "
        f"{report['params']:,} parameters, seq {report['seq_len']} × batch {report['batch']}, "
        f"{report['steps']} steps with the first {report['warmup']} dropped; peak {report['peak_source']}"
    )
    out = [
        head,
        "",
        "| row | tokens/s per device | MFU | s/step | peak GiB | first step at (s) | status |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, r in report["results"].items():
        if r.get("status") == "ok":
            mfu = "–" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
            out.append(
                f"| {name} | {r['tokens_per_second_per_device']:,.0f} | {mfu} | {r['step_seconds']:.4f} | "
                f"{r['peak_memory_gib']:.1f} | {r['first_step_end_seconds']:.0f} | ok |"
            )
        else:
            why = r.get("error") or r.get("reason") or ""
            out.append(f"| {name} | – | – | – | – | – | {r['status']}: {why.replace('|', '/')} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for kind in ("llmtrain", "plain", "torchtitan", "probe"):
        p.add_argument(f"--run-{kind}", help=argparse.SUPPRESS)
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--batch", type=int, default=2, help="sequences per step")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10, help="steps dropped (compile happens in the first)")
    p.add_argument(
        "--log-freq", type=int, default=10, help="torchtitan's log cadence (its default); divides warmup and steps"
    )
    p.add_argument("--budget", type=float, help="seconds for the probe and all rows (scripts/gpu-bench.sh: 420)")
    p.add_argument("--rows", help="comma-separated row names to run (default: all)")
    p.add_argument("--cpu-compile", action="store_true", help="on the CPU, compile rows too (needs a C++ compiler)")
    p.add_argument("--torchtitan-path", help="a directory with torchtitan installed (scripts/torchtitan.sh)")
    p.add_argument("--quick", action="store_true", help="the tiny shape and 4 steps: the CPU path, for tests")
    p.add_argument("--out", default="gpu-bench.json")
    p.add_argument("--table", help="also write the docs table (markdown) here")
    p.add_argument("--table-from", help="print the docs table of a result file and exit")
    a = p.parse_args(argv)
    if a.table_from:
        print(table(json.loads(Path(a.table_from).read_text())), end="")
        return 0
    if a.run_probe:
        worker_probe(a.run_probe)
        return 0
    for kind in ("llmtrain", "plain", "torchtitan"):
        if getattr(a, f"run_{kind}"):
            globals()[f"worker_{kind}"](getattr(a, f"run_{kind}"))
            return 0

    t_start = time.time()
    if a.quick:
        a.seq_len, a.batch, a.steps, a.warmup, a.log_freq = min(a.seq_len, 64), 2, 4, 1, 1
    if a.warmup % a.log_freq or a.steps % a.log_freq or not 0 < a.warmup < a.steps:
        p.error("--warmup and --steps must be multiples of --log-freq, with 0 < warmup < steps")
    found = probe(a)  # imports torch in a process of its own: the driver never does
    env, missing = found["env"], found["missing"]
    if env.get("device") is None:
        sys.exit(f"bench/gpu.py: {missing.get('torch')}")
    if a.device == "cuda" and env["device"] != "cuda":
        sys.exit("bench/gpu.py --device cuda: no GPU visible")
    a.device = env["device"]
    gpu = a.device == "cuda"
    a.shape = SHAPE_1B if gpu and not a.quick else SHAPE_CPU
    if gpu:
        a.peak_flops, peak_source, a.instance_type = peak_for(env["gpu"])
    else:
        from llmtrain.catalog import instance_type

        a.instance_type, peak_source = "cpu", "catalog cpu (a nominal 100 GFLOP/s per process)"
        a.peak_flops = instance_type("cpu").peak_flops_per_device
    from llmtrain import flops
    from llmtrain.catalog import ModelDims

    dims = ModelDims(
        hidden_size=a.shape["hiddenSize"],
        intermediate_size=a.shape["intermediateSize"],
        num_layers=a.shape["numLayers"],
        num_heads=a.shape["numHeads"],
        num_kv_heads=a.shape["numKvHeads"],
        vocab_size=a.shape["vocabSize"],
    )
    a.flops_per_token = flops.flops_per_token(dims, a.seq_len)

    rows = rows_for(gpu, a.cpu_compile)
    if a.rows:
        wanted = a.rows.split(",")
        unknown = set(wanted) - {r.name for r in rows}
        if unknown:
            p.error(f"--rows: unknown {sorted(unknown)}; rows here: {', '.join(r.name for r in rows)}")
        rows = [r for r in rows if r.name in wanted]
    report = {
        "bench": "gpu",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_start)),
        "env": env,
        "missing": {k: v for k, v in missing.items() if v},
        "quick": a.quick,
        "model": a.shape,
        "params": flops.num_params(dims),
        "flops_per_token": a.flops_per_token,
        "peak_flops_per_device": a.peak_flops,
        "peak_source": peak_source,
        "seq_len": a.seq_len,
        "batch": a.batch,
        "steps": a.steps,
        "warmup": a.warmup,
        "log_freq": a.log_freq,
        "timer": f"wall seconds from the end of step {a.warmup} to the end of step {a.steps}, each end read "
        "on the host after the step's results came back; ÷ the steps in between",
        "budget_seconds": a.budget,
        "results": {},
    }

    def write() -> None:
        report["comparisons"] = comparisons(report["results"], gpu)
        report["seconds"] = round(time.time() - t_start, 1)
        Path(a.out).write_text(json.dumps(report, indent=1) + "\n")
        if a.table:
            Path(a.table).write_text(table(report))

    # A GPU row's box covers its start and cold compile; the CPU's tiny rows get more room on a shared CPU.
    scale = 1.0 if gpu else 3.0
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for row in rows:
            left = None if a.budget is None else a.budget - (time.time() - t_start)
            why = next((missing[f] for f in row.needs if missing.get(f)), None)
            if why:
                res = {"what": row.what, "status": "skipped", "reason": why}
            elif left is not None and left < 30:
                res = {"what": row.what, "status": "skipped", "reason": f"out of the {a.budget:.0f} s budget"}
            else:
                box = row.box_s * scale if left is None else min(row.box_s * scale, left)
                res = run_row(row, a, Path(tmp), box)
            report["results"][row.name] = res
            print(f"{row.name:38} {json.dumps(res)}", flush=True)
            write()
    write()
    print(table(report), end="")
    print(json.dumps(report["comparisons"]))
    print(f"wrote {a.out} ({report['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
