"""What does the trainer cost per step? Its step time vs a minimal FSDP loop, same model, data, processes.

ONE `torchrun --nproc-per-node=N` launch (default 2, gloo on CPU) per step size; inside the same worker
processes the two loops take turns, `--repeats` times, in alternating order (B T, T B, B T, ...), each
turn `--steps` steps of which the first `--warmup` are dropped. Both train the same Llama model
(`llmtrain_trainer.models.llama`) from the same initial weights on the same synthetic samples with FSDP2
(`fully_shard` per block, then the root), AdamW, the LR schedule and gradient clipping:

- baseline: a minimal loop — every batch is generated BEFORE its timed loop, then per step only
  forward/backward, clip, optimizer step, zero_grad and `loss.item()`; no metrics, logging, agreement
  all-reduce or checkpointing;
- trainer:  `llmtrain_trainer.train.run()`, the real trainer, unchanged (prefetching data loader,
  Prometheus metrics server, one structured log line and one 3-float all-reduce per step). Its
  batches come from the loader's prefetch threads, off the timed path as well (their CPU counts
  against the trainer in the CPU clock).

Why interleaved turns in the same processes: on a 2-core machine shared with other work the load
drifts over seconds. Separate launches per side compare different minutes and different process
placements; short alternating turns in one pair of processes compare neighbouring seconds, and the
ratio of each (baseline, trainer) pair cancels drift slower than a turn. Reported per clock (wall, and
the CPU time of rank 0's process, all threads): the median of the per-pair ratios with its
interquartile range and min–max, the ratio of pooled medians and of pooled minima (least-disturbed
step), and the load average before and after.

Step time = time between the ends of consecutive steps on rank 0, so everything each loop does per
step counts.

    .venv/bin/python bench/trainer_overhead.py                 # both sizes, 2 processes, CPU
    .venv/bin/python bench/trainer_overhead.py --quick         # a smoke run for the test suite
    .venv/bin/python bench/trainer_overhead.py --sizes large --repeats 12
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ports import metrics_port

REPO = Path(__file__).resolve().parents[1]

# name: (hidden, layers, heads, kv_heads, vocab, seq_len, sequences per step)
SIZES = {
    "small": {"hidden": 128, "layers": 2, "heads": 4, "kv_heads": 2, "vocab": 256, "seq_len": 64, "batch": 8},  # 512
    "large": {
        "hidden": 256,
        "layers": 4,
        "heads": 8,
        "kv_heads": 4,
        "vocab": 1024,
        "seq_len": 256,
        "batch": 8,
    },  # 2048 tokens
}
TARGETS = {"small": 1.10, "large": 1.02}
# --quick's large size: half the sequence (1024 tokens a step, still twice the small one's 512). The
# smoke run only asks whether the trainer's CPU per step stays under twice the minimal loop's at a
# step larger than the small one; the 2048-token steps (0.45-0.52 CPU-s each on each of 2 ranks, 24
# of them) were a third of the test's CPU for that question, the 1024-token ones 0.29-0.33.
QUICK_LARGE = {**SIZES["large"], "seq_len": 128}


def job_spec(size: dict, steps: int, nproc: int) -> dict:
    h = size["hidden"]
    return {
        "model": {
            "dims": {
                "hiddenSize": h,
                "intermediateSize": int(h * 8 / 3 // 64 * 64),
                "numLayers": size["layers"],
                "numHeads": size["heads"],
                "numKvHeads": size["kv_heads"],
                "vocabSize": size["vocab"],
                "maxSeqLen": size["seq_len"],
            }
        },
        "data": {"uri": "synthetic", "seqLen": size["seq_len"]},
        "cluster": {"instanceType": "cpu", "processesPerNode": nproc},
        "fsdp": {"shardingStrategy": "FULL_SHARD", "mixedPrecision": "fp32", "activationCheckpointing": "none"},
        "training": {
            "maxSteps": steps,
            "globalBatchTokens": size["batch"] * size["seq_len"],
            "microBatchSize": size["batch"] // nproc,
            "learningRate": 3e-4,
            "warmupSteps": 2,
            "seed": 0,
        },
        "rendezvous": {"backend": "c10d"},
    }


def baseline_turn(spec) -> dict:
    """The minimal FSDP loop, one turn: its own model and batches (made up front); destroys the turn's
    process group at the end, as the trainer's `run()` does."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from llmtrain.spec import resolve_dims
    from llmtrain_trainer.config import global_batch_seqs, lr_at
    from llmtrain_trainer.data.loader import SyntheticDataset
    from llmtrain_trainer.models.init import init_weights
    from llmtrain_trainer.models.llama import Llama, cross_entropy
    from llmtrain_trainer.train import build_optimizer

    rank, world = dist.get_rank(), dist.get_world_size()
    t = spec.training
    dims = resolve_dims(spec.model)
    mesh = init_device_mesh("cpu", (world,))
    with torch.device("meta"):
        model = Llama(dims)
    layers = model.model.layers
    for i, block in enumerate(layers):
        fully_shard(block, mesh=mesh, reshard_after_forward=i < len(layers) - 1)
    fully_shard(model, mesh=mesh, reshard_after_forward=False)
    model.to_empty(device="cpu")
    model.init_rope(torch.device("cpu"))
    init_weights(model, t.seed)
    opt = build_optimizer(model, spec)
    g = global_batch_seqs(spec)
    per_rank = g // world
    accum = per_rank // t.micro_batch_size
    ds = SyntheticDataset(dims.vocab_size, spec.data.seq_len, t.seed)
    # Off the timed path: every step's batch, made up front.
    batches = [torch.from_numpy(ds.read_segment(0, s * g + rank * per_rank, per_rank)) for s in range(t.max_steps)]
    lrs = [lr_at(s + 1, t) for s in range(t.max_steps)]
    ends, cpu = [], []
    for s in range(t.max_steps):
        for group in opt.param_groups:
            group["lr"] = lrs[s]
        for mb in batches[s].split(t.micro_batch_size):
            loss = cross_entropy(model(mb[:, :-1]), mb[:, 1:]) / accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        ends.append(time.time())
        cpu.append(time.process_time())
    dist.destroy_process_group()
    return {"ends": ends, "cpu": cpu}


def trainer_turn(spec, port: int) -> dict:
    """The real trainer, one turn (`run()` finds the turn's process group and destroys it). Its step lines
    still go to stdout as in production; each is also stamped with this process's CPU time."""
    import llmtrain_trainer.train as train
    from llmtrain_trainer.config import JobIdentity

    ends, cpu = [], []

    def emit_stamped(event: dict) -> None:
        train.emit(event)
        if event.get("event") == "step":
            ends.append(time.time())
            cpu.append(time.process_time())

    os.environ["LLMTRAIN_METRICS_PORT"] = str(port)  # a fresh port per turn: the last turn's server lives on
    rc = train.run(spec, JobIdentity.from_env(), emit=emit_stamped)
    if rc:
        raise SystemExit(f"trainer turn failed with {rc}")
    return {"ends": ends, "cpu": cpu}


def worker(spec_path: str, repeats: int) -> None:
    """One torchrun worker: alternating turns of both loops; rank 0 prints one JSON line per turn."""
    import faulthandler
    import logging
    import signal

    from llmtrain_trainer.config import load_spec

    faulthandler.register(signal.SIGUSR1)  # `kill -USR1` a worker to see where it is
    import torch.distributed as dist

    logging.basicConfig(level=os.environ.get("LLMTRAIN_LOG_LEVEL", "WARNING"), stream=sys.stderr)
    spec = load_spec(spec_path)
    base_port = int(os.environ["LLMTRAIN_METRICS_PORT"])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # torchrun's store, with a fresh key prefix per turn: re-creating process groups on the same keys
    # would make a new gloo group connect to the previous turn's (closed) addresses.
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, False)
    for r in range(repeats):
        order = ("baseline", "trainer") if r % 2 == 0 else ("trainer", "baseline")
        for side in order:
            dist.init_process_group(
                "gloo", store=dist.PrefixStore(f"turn-{r}-{side}", store), rank=rank, world_size=world
            )
            got = baseline_turn(spec) if side == "baseline" else trainer_turn(spec, base_port + 8 * r)
            if rank == 0:
                print(json.dumps({"turn": r, "side": side, "load": os.getloadavg()[0], **got}), flush=True)


def bookkeeping(n: int = 3000) -> dict:
    """CPU microseconds per step of the trainer's own per-step bookkeeping, each piece timed alone in
    this process with the trainer's own objects (what the side-by-side ratio cannot resolve on a
    loaded machine): the throughput/MFU arithmetic, the Prometheus updates the loop makes, the memory
    read, building the agreement flags, and the JSON step line (to /dev/null). Not included: the
    agreement all-reduce itself (a collective; it is in the side-by-side figure)."""
    import torch

    from llmtrain.defaults import resolve
    from llmtrain.spec import LLMTrainingJobSpec, resolve_dims
    from llmtrain_trainer.config import dumps
    from llmtrain_trainer.metrics.memory import MemoryGauge
    from llmtrain_trainer.metrics.prometheus import TrainerMetrics
    from llmtrain_trainer.metrics.throughput import step_throughput

    spec = resolve(LLMTrainingJobSpec.model_validate(job_spec(SIZES["small"], 10, 2)))
    dims = resolve_dims(spec.model)
    m = TrainerMetrics(job="bench", rank=0)
    dev = torch.device("cpu")
    mem = MemoryGauge(dev)
    loss_sum = torch.zeros(())
    null = open(os.devnull, "w")
    event = {
        "event": "step",
        "step": 1,
        "loss": 5.123456,
        "lr": 3e-4,
        "grad_norm": 0.98,
        "tokens_per_second": 5413.55,
        "tflops_per_device": 0.0066,
        "mfu": 0.066,
        "step_seconds": 0.03,
        "data_wait_seconds": 1e-5,
        "sample_start": 8,
        "samples": 8,
        "tokens": 512,
        "max_steps": 40,
        "time": 1796042737.47,
    }

    def metrics():
        m.step.set(1)
        m.loss.set(1.0)
        m.tokens_per_second.set(1.0)
        m.tokens_total.inc(256)
        m.tflops_per_device.set(1.0)
        m.mfu.set(0.1)
        m.step_seconds.observe(0.03)
        m.data_wait_seconds.observe(1e-5)
        m.memory_allocated_bytes.set(1)
        m.memory_reserved_bytes.set(1)
        m.heartbeat_timestamp_seconds.set(time.time())

    def flags():
        f = torch.tensor([0.0, 0.0, 0.0], device=dev)
        f[0] += loss_sum
        f.tolist()

    def emit():
        null.write(dumps(event) + "\n")
        null.flush()

    parts = {
        "throughput": lambda: step_throughput(512, 0.03, 2, dims, 64, 1e12),
        "metrics": metrics,
        "memory": mem.read,
        "flags": flags,
        "step_line": emit,
    }
    out = {}
    for name, fn in parts.items():
        fn()
        t0 = time.process_time()
        for _ in range(n):
            fn()
        out[name] = round((time.process_time() - t0) / n * 1e6, 1)
    out["total"] = round(sum(out.values()), 1)
    mem.close()
    return out


def step_deltas(stamps: list[float], warmup: int) -> list[float]:
    return [b - a for a, b in zip(stamps[warmup:], stamps[warmup + 1 :], strict=False)]


def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    i = (len(xs) - 1) * q
    lo = int(i)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (i - lo)


def _stats(base: list[float], trn: list[float], pairs: list[float]) -> dict:
    bm, tm = statistics.median(base), statistics.median(trn)
    return {
        "baseline_ms": {"median": round(bm * 1e3, 3), "min": round(min(base) * 1e3, 3)},
        "trainer_ms": {"median": round(tm * 1e3, 3), "min": round(min(trn) * 1e3, 3)},
        "overhead_ms_median": round((tm - bm) * 1e3, 3),
        "ratio_paired_median": round(statistics.median(pairs), 3),
        "ratio_paired_iqr": [round(_q(pairs, 0.25), 3), round(_q(pairs, 0.75), 3)],
        "ratio_paired_range": [min(pairs), max(pairs)],
        "ratio_pooled_median": round(tm / bm, 3),
        "ratio_pooled_min": round(min(trn) / min(base), 3),
        "ratio_per_pair": pairs,
    }


def measure(name: str, size: dict, a: argparse.Namespace, env: dict) -> dict:
    spec = job_spec(size, a.steps, a.nproc)
    turns: dict[int, dict] = {}
    loads = []
    with tempfile.TemporaryDirectory() as tmp:
        spec_file = os.path.join(tmp, "spec.json")
        Path(spec_file).write_text(json.dumps(spec))
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={a.nproc}",
            __file__,
            "--run-worker",
            spec_file,
            "--repeats",
            str(a.repeats),
        ]
        errf = open(os.path.join(tmp, "stderr"), "w+")  # a file, not a pipe: nobody drains it while we read stdout
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=errf, text=True)
        for line in proc.stdout:
            if line.startswith('{"turn"'):
                d = json.loads(line)
                turns.setdefault(d["turn"], {})[d["side"]] = d
                loads.append(d["load"])
                if len(turns[d["turn"]]) == 2:
                    pair = turns[d["turn"]]
                    b, t = (statistics.median(step_deltas(pair[s]["ends"], a.warmup)) for s in ("baseline", "trainer"))
                    bc, tc = (statistics.median(step_deltas(pair[s]["cpu"], a.warmup)) for s in ("baseline", "trainer"))
                    print(
                        f"{name} pair {d['turn'] + 1}/{a.repeats}: wall {b * 1e3:7.2f} vs {t * 1e3:7.2f} ms "
                        f"({t / b:.3f}x)  cpu {bc * 1e3:7.2f} vs {tc * 1e3:7.2f} ms ({tc / bc:.3f}x)  "
                        f"load {d['load']:.1f}",
                        flush=True,
                    )
        if proc.wait():
            errf.seek(0)
            sys.exit(f"{name}: worker failed:\n{errf.read()[-4000:]}")
        errf.close()
    out = {
        "tokens_per_step": size["batch"] * size["seq_len"],
        "model": spec["model"]["dims"],
        "target": TARGETS[name],
        "load_during": [round(min(loads), 2), round(max(loads), 2)],
    }
    for kind, key in (("wall", "ends"), ("cpu", "cpu")):
        base, trn, pairs = [], [], []
        for r in sorted(turns):
            b, t = (step_deltas(turns[r][s][key], a.warmup) for s in ("baseline", "trainer"))
            base += b
            trn += t
            pairs.append(round(statistics.median(t) / statistics.median(b), 3))
        out[kind] = _stats(base, trn, pairs)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-worker", help=argparse.SUPPRESS)
    p.add_argument("--sizes", default="small,large", help="comma list of: " + ", ".join(SIZES))
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--steps", type=int, default=16, help="steps per turn")
    p.add_argument("--warmup", type=int, default=4, help="steps dropped at the start of each turn")
    p.add_argument("--repeats", type=int, default=16, help="(baseline, trainer) pairs of turns")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per process (both sides)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="6 steps per turn, 2 pairs, the large size at 1024 tokens a step (a smoke run, not a measurement)",
    )
    p.add_argument("--json", help="also write the result here")
    a = p.parse_args(argv)
    if a.run_worker:
        worker(a.run_worker, a.repeats)
        return 0
    if a.quick:
        a.steps, a.warmup, a.repeats = 6, 2, 2
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(a.threads),
        LLMTRAIN_METRICS_PORT=metrics_port(),
        PYTHONUNBUFFERED="1",
        LLMTRAIN_LOG_LEVEL="WARNING",
        PYTHONPATH=os.pathsep.join([str(REPO / "operator"), str(REPO / "trainer"), os.environ.get("PYTHONPATH", "")]),
    )
    load_before = os.getloadavg()
    t0 = time.time()
    sys.path[:0] = [str(REPO / "operator"), str(REPO / "trainer")]
    book = bookkeeping(300 if a.quick else 3000)
    print(f"bookkeeping, CPU µs per step (each piece alone, this process): {book}", flush=True)
    sizes = {**SIZES, "large": QUICK_LARGE} if a.quick else SIZES
    results = {name: measure(name, sizes[name], a, env) for name in a.sizes.split(",")}
    for r in results.values():
        r["bookkeeping_share_of_baseline_cpu"] = round(book["total"] / 1e3 / r["cpu"]["baseline_ms"]["median"], 4)
    out = {
        "bench": "trainer_overhead",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t0)),
        "cpus": os.cpu_count(),
        "nproc": a.nproc,
        "threads": a.threads,
        "steps": a.steps,
        "warmup": a.warmup,
        "repeats": a.repeats,
        "quick": a.quick,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "seconds": round(time.time() - t0, 1),
        "bookkeeping_us_per_step": book,
        "sizes": results,
    }
    print(json.dumps(out))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    for name, r in results.items():
        for kind in ("cpu", "wall"):
            k = r[kind]
            print(
                f"{name} ({r['tokens_per_step']} tokens/step) {kind:4}: trainer / minimal loop "
                f"{k['ratio_paired_median']:.3f}x (median of {a.repeats} pairs, IQR {k['ratio_paired_iqr']}, "
                f"range {k['ratio_paired_range']}); pooled minima {k['ratio_pooled_min']:.3f}x; "
                f"{k['overhead_ms_median']:+.2f} ms/step; target ≤ {r['target']:.2f}x; load {r['load_during']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
