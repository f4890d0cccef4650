"""What does the trainer cost? Its step time vs a minimal hand-written PyTorch loop, same model and data.

Both sides train the same Llama model (`llmtrain_trainer.model`) from the same initial weights on the
same synthetic samples with the same AdamW, LR schedule and gradient clipping, on one device:

- baseline: a plain loop in its own process — no FSDP, no metrics, no logging, no checkpointing;
- trainer:  `torchrun --nproc-per-node=1 -m llmtrain_trainer` with the job spec (FSDP2 FULL_SHARD on a
            1-rank mesh, Prometheus metrics, one structured log line and one all-reduce per step).

Step time = wall time between the ends of consecutive steps, so everything each loop does per step
counts; the first `--warmup` steps are dropped. The two are run alternately `--repeats` times. Reported:
the ratio of medians (typical step) and the ratio of minima (the least-disturbed step: on a shared
machine other processes only ever add time, so the minimum is the cleanest estimate of each loop's
own cost).

    .venv/bin/python bench/trainer_overhead.py            # CPU
    .venv/bin/python bench/trainer_overhead.py --device cuda --hidden 2048 --layers 16 --seq-len 2048
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

REPO = Path(__file__).resolve().parents[1]


def job_spec(a: argparse.Namespace) -> dict:
    gpu = a.device == "cuda"
    return {
        "model": {"dims": {"hiddenSize": a.hidden, "intermediateSize": a.ffn or int(a.hidden * 8 / 3 // 64 * 64),
                           "numLayers": a.layers, "numHeads": a.heads, "numKvHeads": a.kv_heads,
                           "vocabSize": a.vocab, "maxSeqLen": a.seq_len}},
        "data": {"uri": "synthetic", "seqLen": a.seq_len},
        "cluster": {"instanceType": "p5.48xlarge" if gpu else "cpu", "processesPerNode": 1},
        "fsdp": {"shardingStrategy": "FULL_SHARD", "mixedPrecision": "bf16" if gpu else "fp32",
                 "activationCheckpointing": "none"},
        "training": {"maxSteps": a.steps, "globalBatchTokens": a.batch * a.seq_len, "microBatchSize": a.batch,
                     "learningRate": 3e-4, "warmupSteps": 2, "seed": 0},
        "rendezvous": {"backend": "c10d"},
    }


def baseline(spec_path: str) -> None:
    """The minimal loop (runs in a subprocess); prints one JSON line with its step end times."""
    import torch

    from llmtrain.spec import LLMTrainingJobSpec, resolve_dims
    from llmtrain_trainer.config import global_batch_seqs, lr_at
    from llmtrain_trainer.data import SyntheticDataset
    from llmtrain_trainer.init import init_weights
    from llmtrain_trainer.model import Llama, cross_entropy
    from llmtrain_trainer.train import build_optimizer

    spec = LLMTrainingJobSpec.model_validate(json.loads(Path(spec_path).read_text()))
    t = spec.training
    dev = torch.device("cuda" if torch.cuda.is_available() and spec.cluster.instance_type != "cpu" else "cpu")
    dims = resolve_dims(spec.model)
    model = Llama(dims)
    init_weights(model, t.seed)
    model.to(dev)
    model.init_rope(dev)
    opt = build_optimizer(model, spec)
    ds = SyntheticDataset(dims.vocab_size, spec.data.seq_len, t.seed)
    g = global_batch_seqs(spec)
    amp = torch.autocast("cuda", torch.bfloat16) if dev.type == "cuda" else torch.autocast("cpu", enabled=False)
    ends = []
    for s in range(t.max_steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(s + 1, t)
        batch = torch.from_numpy(ds.read_segment(0, s * g, g)).to(dev)
        accum = g // t.micro_batch_size
        for mb in batch.split(t.micro_batch_size):
            with amp:
                loss = cross_entropy(model(mb[:, :-1]), mb[:, 1:]) / accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()  # the trainer reads its loss every step too
        ends.append(time.time())
    print(json.dumps({"ends": ends, "loss": loss.item() * accum}))


def run_baseline(spec_file: str, env: dict) -> list[float]:
    out = subprocess.run([sys.executable, __file__, "--run-baseline", spec_file], env=env, cwd=REPO,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["ends"]


def run_trainer(spec_file: str, env: dict, nproc: int) -> list[float]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "llmtrain_trainer", "--spec", spec_file]
    out = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"trainer failed:\n{out.stderr[-4000:]}")
    events = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
    return [e["time"] for e in events if e.get("event") == "step"]


def step_times(ends: list[float], warmup: int) -> list[float]:
    return [b - a for a, b in zip(ends[warmup:], ends[warmup + 1:])]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-baseline", help=argparse.SUPPRESS)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--ffn", type=int, default=0, help="MLP width (default ≈ 8/3·hidden, multiple of 64)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=8, help="sequences per step (one micro-batch)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")),
                   help="intra-op threads for both (CPU)")
    a = p.parse_args()
    if a.run_baseline:
        baseline(a.run_baseline)
        return 0

    spec = job_spec(a)
    with tempfile.TemporaryDirectory() as tmp:
        spec_file = os.path.join(tmp, "spec.json")
        Path(spec_file).write_text(json.dumps(spec))
        env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), LLMTRAIN_METRICS_PORT="0", PYTHONUNBUFFERED="1")
        base_all, trn_all = [], []
        for r in range(a.repeats):
            base = step_times(run_baseline(spec_file, env), a.warmup)
            trn = step_times(run_trainer(spec_file, env, 1), a.warmup)
            base_all += base
            trn_all += trn
            print(f"repeat {r + 1}: median baseline {statistics.median(base) * 1e3:8.2f} ms/step, trainer "
                  f"{statistics.median(trn) * 1e3:8.2f} ms/step; min {min(base) * 1e3:8.2f} vs "
                  f"{min(trn) * 1e3:8.2f}", flush=True)
    med = statistics.median(trn_all) / statistics.median(base_all)
    best = min(trn_all) / min(base_all)
    print(json.dumps({"device": a.device, "threads": a.threads, "model": spec["model"]["dims"],
                      "tokens_per_step": a.batch * a.seq_len, "steps": a.steps, "warmup": a.warmup,
                      "repeats": a.repeats,
                      "baseline_ms": {"median": round(statistics.median(base_all) * 1e3, 2),
                                      "min": round(min(base_all) * 1e3, 2)},
                      "trainer_ms": {"median": round(statistics.median(trn_all) * 1e3, 2),
                                     "min": round(min(trn_all) * 1e3, 2)},
                      "ratio_median": round(med, 3), "ratio_min": round(best, 3)}))
    print(f"trainer / minimal loop step time: {med:.3f}x (medians), {best:.3f}x (minima); target ≤ 1.05x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
