"""How right is `llmtrain plan`? Its predicted memory per worker vs the peak the trainer really reaches.

For each model (the `tiny` preset and a ~124M Llama), each sharding strategy and each activation
checkpointing mode, the real trainer (`torchrun -m llmtrain_trainer`, 2 CPU processes, gloo, fp32) runs
a few steps inside the PyTorch profiler with memory profiling on. Measured = the peak of the bytes
torch's CPU allocator holds during the run, rebuilt from the profiler's allocation and free events
in time order (`allocator_peak`: not the events' running counter, which misses frees made on gloo's
threads) — i.e. every tensor the trainer holds at its worst moment (parameters, gradients, AdamW
state, activations, FSDP's gathered parameters and communication buffers, logits), and nothing else
(no Python heap, no allocator caching). The larger of the two ranks is taken. A second, independent
figure comes from glibc (`MallocSampler`: bytes in use, sampled every 0.5 ms), which also holds the
Python heap the run grows and the profiler's own buffers (~25-35 MiB: meaningless for the tiny
model, within a few % on the 124M one). On a GPU the same quantity is `torch.cuda.max_memory_allocated`
(see bench/gpu.py).

Predicted = `llmtrain.planner.plan_for(...)`.total_bytes for the same dims, strategy, checkpointing,
precision (fp32), sequence length, micro-batch and shard group. Ratio = predicted / measured; the
planner is considered accurate within ±15%.

    .venv/bin/python bench/planner_accuracy.py                 # table for both models (~25-40 min on 2 busy cores)
    .venv/bin/python bench/planner_accuracy.py --quick         # tiny model, FULL_SHARD, 2 cases (tests)
    .venv/bin/python bench/planner_accuracy.py --measured bench/results/planner_accuracy.json  # re-predict
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ports import metrics_port

REPO = Path(__file__).resolve().parents[1]


MODELS = {
    "tiny": {"preset": "tiny"},
    # ~124M parameters, Llama-3-shaped (GQA 12/4 heads, SwiGLU), 32k vocabulary.
    "124m": {
        "dims": {
            "hiddenSize": 768,
            "intermediateSize": 2048,
            "numLayers": 12,
            "numHeads": 12,
            "numKvHeads": 4,
            "vocabSize": 32000,
            "maxSeqLen": 1024,
        }
    },
}
STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD")
CHECKPOINTING = ("none", "selective", "full")
TOLERANCE = 0.15


def job_spec(model: dict, strategy: str, ckpt: str, seq_len: int, micro_batch: int, nproc: int, steps: int) -> dict:
    return {
        "model": model,
        "data": {"uri": "synthetic", "seqLen": seq_len},
        "cluster": {"instanceType": "cpu", "processesPerNode": nproc},
        "fsdp": {"shardingStrategy": strategy, "mixedPrecision": "fp32", "activationCheckpointing": ckpt},
        "training": {
            "maxSteps": steps,
            "globalBatchTokens": seq_len * micro_batch * nproc,
            "microBatchSize": micro_batch,
            "learningRate": 3e-4,
            "warmupSteps": 1,
            "seed": 0,
        },
        "rendezvous": {"backend": "c10d"},
    }


def worker(spec_path: str, out_dir: str) -> None:
    """One torchrun worker: the real trainer's `run()` inside the profiler; writes this rank's peak."""
    from torch.profiler import ProfilerActivity, profile

    from llmtrain_trainer.config import JobIdentity, load_spec
    from llmtrain_trainer.train import run

    spec = load_spec(spec_path)
    rank = os.environ["RANK"]
    sampler = MallocSampler()
    with sampler, profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run(spec, JobIdentity("planner-accuracy", "bench", 0))
        # The model and optimizer sit in reference cycles: free them while the profiler still
        # records, so that what stays allocated after this is what was freed where it cannot see.
        gc.collect()
    trace = os.path.join(out_dir, f"trace-{rank}.json")
    prof.export_chrome_trace(trace)
    trace_events = json.loads(Path(trace).read_text())["traceEvents"]
    os.remove(trace)
    peak, top, peak_upper = allocator_peak(trace_events)
    # Where the peak happens: the operators running at that instant, outermost first (for --explain).
    at = sorted(
        (
            e
            for e in trace_events
            if e.get("ph") == "X" and e.get("tid") == top["tid"] and e["ts"] <= top["ts"] <= e["ts"] + e.get("dur", 0)
        ),
        key=lambda e: e["ts"],
    )
    Path(out_dir, f"peak-{rank}.json").write_text(
        json.dumps(
            {
                "peak_bytes": peak,
                "peak_with_unfreed_bytes": peak_upper,
                "at": [e["name"] for e in at][:12],
                "malloc_peak_delta_bytes": sampler.peak_delta,
            }
        )
    )


def allocator_peak(trace_events: list[dict]) -> tuple[int, dict, int]:
    """(the peak of the bytes torch's CPU allocator holds, the memory event where it is reached, the
    peak if blocks the profiler never sees freed are counted until their address is reused),
    rebuilt from the profiler's allocation and free events in time order across threads.

    Not the events' own "Total Allocated" counter: the profiler records a free only on a thread it
    profiles, so a tensor freed on one of gloo's worker threads (the clone gloo's reduce-scatter makes
    of FSDP's gradient buffer, DTensor's all-gathers while the weights are initialised) is never
    subtracted and the counter drifts up (by 90-240 MiB on the 124M model under FULL_SHARD,
    HYBRID_SHARD and SHARD_GRAD_OP). Everything the trainer keeps (parameters, gradients, optimizer state, activations,
    gathered parameters, logits) is freed on the main thread, the model and optimizer by the
    gc.collect() at the end of the profiled run; blocks still allocated after it were freed on a
    thread the profiler does not see and are left out. Nor the first event in file order as the
    baseline: the trace lists events thread by thread, and a side thread's first event seconds into
    the run already saw the model state (for NO_SHARD on 124M, 1.4 GiB of it)."""
    events = sorted(
        (e for e in trace_events if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0),
        key=lambda e: e["ts"],
    )
    if not events:
        raise RuntimeError("the profiler recorded no CPU memory events")
    # Pass 1: which allocation events are never matched by a free on a profiled thread.
    unfreed: set[int] = set()
    live: dict[int, int] = {}
    for i, e in enumerate(events):
        addr, n = e["args"]["Addr"], e["args"]["Bytes"]
        if n > 0:
            if addr in live:
                unfreed.add(live[addr])  # handed out again without a free: freed out of sight
            live[addr] = i
        else:
            live.pop(addr, None)
    unfreed.update(live.values())
    # Pass 2: the peak, with and without those blocks.
    sizes: dict[int, tuple[int, bool]] = {}
    total = upper = peak = peak_upper = 0
    top = events[0]
    for i, e in enumerate(events):
        addr, n = e["args"]["Addr"], e["args"]["Bytes"]
        if n > 0:
            old, old_unfreed = sizes.get(addr, (0, False))
            upper -= old
            total -= 0 if old_unfreed else old
            sizes[addr] = (n, i in unfreed)
            upper += n
            total += 0 if i in unfreed else n
        elif addr in sizes:
            old, old_unfreed = sizes.pop(addr)
            upper -= old
            total -= 0 if old_unfreed else old
        if total > peak:
            peak, top = total, e
        peak_upper = max(peak_upper, upper)
    return peak, top, peak_upper


class MallocSampler:
    """A second, independent measurement: glibc's bytes in use (mallinfo2: uordblks + hblkhd, every
    arena and every mmapped chunk, whichever thread allocated them), sampled every 0.5 ms by a thread;
    its peak minus its value at the start. It also counts the Python heap the run grows and the
    profiler's own event buffers, so it reads a little above the allocator accounting, and a sampler
    can miss a peak shorter than its period; it does not depend on the profiler's bookkeeping."""

    PERIOD_S = 0.0005

    def __init__(self):
        import ctypes
        import threading

        class Mallinfo2(ctypes.Structure):
            _fields_ = [
                (name, ctypes.c_size_t)
                for name in (
                    "arena",
                    "ordblks",
                    "smblks",
                    "hblks",
                    "hblkhd",
                    "usmblks",
                    "fsmblks",
                    "uordblks",
                    "fordblks",
                    "keepcost",
                )
            ]

        self._mallinfo2 = ctypes.CDLL(None).mallinfo2
        self._mallinfo2.restype = Mallinfo2
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.start = self.peak = 0

    def in_use(self) -> int:
        m = self._mallinfo2()
        return m.uordblks + m.hblkhd

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.in_use())
            time.sleep(self.PERIOD_S)

    def __enter__(self):
        self.start = self.peak = self.in_use()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak_delta(self) -> int:
        return self.peak - self.start


def measure(spec: dict, nproc: int, env: dict, explain: bool = False) -> dict:
    """The allocator peak of the rank with the larger one, the same counting the blocks freed out of
    the profiler's sight until their address is reused (an upper bound), and glibc's in-use peak."""
    with tempfile.TemporaryDirectory() as tmp:
        spec_file = os.path.join(tmp, "spec.json")
        Path(spec_file).write_text(json.dumps(spec))
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            __file__,
            "--run-worker",
            spec_file,
            tmp,
        ]
        out = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"trainer failed ({spec['fsdp']}):\n{out.stderr[-4000:]}")
        peaks = [json.loads(Path(tmp, f"peak-{r}.json").read_text()) for r in range(nproc)]
        top = max(peaks, key=lambda p: p["peak_bytes"])
        if explain:
            print(f"    peak inside: {' > '.join(top['at'])}", flush=True)
        return {
            "measured_bytes": top["peak_bytes"],
            "measured_with_unfreed_bytes": max(p["peak_with_unfreed_bytes"] for p in peaks),
            "malloc_peak_bytes": max(p["malloc_peak_delta_bytes"] for p in peaks),
        }


def predict(spec: dict, nproc: int) -> dict:
    from llmtrain.catalog import instance_type
    from llmtrain.defaults import resolve
    from llmtrain.planner import plan_for
    from llmtrain.spec import LLMTrainingJobSpec, resolve_dims

    s = resolve(LLMTrainingJobSpec.model_validate(spec))
    return plan_for(
        resolve_dims(s.model),
        instance_type("cpu"),
        1,
        s.fsdp.sharding_strategy,
        s.fsdp.mixed_precision,
        s.fsdp.activation_checkpointing,
        s.data.seq_len,
        s.training.micro_batch_size,
        per_node=nproc,
    ).as_dict()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-worker", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--models", default="tiny,124m")
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--checkpointing", default=",".join(CHECKPOINTING))
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--steps", type=int, default=2, help="the peak is reached in step 2 (AdamW state exists)")
    p.add_argument("--quick", action="store_true", help="tiny model, FULL_SHARD, no and full checkpointing")
    p.add_argument(
        "--measured",
        help="re-predict against the measurements of an earlier --json result (after a planner change; nothing is run)",
    )
    p.add_argument("--explain", action="store_true", help="print the operators running at each peak")
    p.add_argument("--json", help="also write the result here")
    a = p.parse_args(argv)
    if a.run_worker:
        worker(*a.run_worker)
        return 0
    if a.quick:
        a.models, a.strategies, a.checkpointing = "tiny", "FULL_SHARD", "none,full"
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        LLMTRAIN_METRICS_PORT=metrics_port(),
        LLMTRAIN_LOG_LEVEL="WARNING",
        PYTHONPATH=os.pathsep.join([str(REPO / "operator"), str(REPO / "trainer"), os.environ.get("PYTHONPATH", "")]),
    )
    reuse = None
    if a.measured:
        old = json.loads(Path(a.measured).read_text())
        a.seq_len, a.micro_batch, a.nproc = old["seq_len"], old["micro_batch"], old["nproc"]
        reuse = {
            (r["model"], r["strategy"], r["activation_checkpointing"]): {
                k: r.get(k) for k in ("measured_bytes", "measured_with_unfreed_bytes", "malloc_peak_bytes")
            }
            for r in old["rows"]
        }
        a.models = ",".join(dict.fromkeys(k[0] for k in reuse))
        a.strategies = ",".join(dict.fromkeys(k[1] for k in reuse))
        a.checkpointing = ",".join(dict.fromkeys(k[2] for k in reuse))
    t0 = time.time()
    rows = []
    print(
        f"{'model':6} {'strategy':14} {'AC':9} {'predicted MiB':>14} {'measured MiB':>13} {'ratio':>6} "
        f"{'with unfreed':>13} {'malloc MiB':>11}"
    )
    for model in a.models.split(","):
        for strategy in a.strategies.split(","):
            for ckpt in a.checkpointing.split(","):
                spec = job_spec(MODELS[model], strategy, ckpt, a.seq_len, a.micro_batch, a.nproc, a.steps)
                plan = predict(spec, a.nproc)
                if reuse is not None:  # the measurement does not depend on the planner: re-predict only
                    m = reuse[(model, strategy, ckpt)]
                else:
                    m = measure(spec, a.nproc, env, a.explain)
                measured, malloc = m["measured_bytes"], m["malloc_peak_bytes"]
                ratio = plan["total_bytes"] / measured
                rows.append(
                    {
                        "model": model,
                        "strategy": strategy,
                        "activation_checkpointing": ckpt,
                        "num_params": plan["num_params"],
                        "predicted_bytes": plan["total_bytes"],
                        **m,
                        "ratio": round(ratio, 3),
                        "within_tolerance": abs(ratio - 1) <= TOLERANCE,
                        "predicted_parts": {
                            k: plan[k]
                            for k in (
                                "params_bytes",
                                "grads_bytes",
                                "optimizer_bytes",
                                "activations_bytes",
                                "workspace_bytes",
                            )
                        },
                    }
                )
                print(
                    f"{model:6} {strategy:14} {ckpt:9} {plan['total_bytes'] / 2**20:14.1f} "
                    f"{measured / 2**20:13.1f} {ratio:6.2f} "
                    f"{(m['measured_with_unfreed_bytes'] or float('nan')) / 2**20:13.1f} "
                    f"{malloc / 2**20 if malloc is not None else float('nan'):11.1f}"
                    f"{'' if rows[-1]['within_tolerance'] else '  <-- off'}",
                    flush=True,
                )
    out = {
        "bench": "planner_accuracy",
        "date": time.strftime("%Y-%m-%d", time.gmtime(t0)),
        "cpus": os.cpu_count(),
        "nproc": a.nproc,
        "seq_len": a.seq_len,
        "micro_batch": a.micro_batch,
        "precision": "fp32",
        "tolerance": TOLERANCE,
        "seconds": round(time.time() - t0, 1),
        "rows": rows,
    }
    print(json.dumps(out))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
