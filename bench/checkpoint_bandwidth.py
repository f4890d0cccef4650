"""Checkpoint bandwidth: the trainer's save and load speed vs what the storage itself does, same run.

1. The storage's own speed, measured first, in the same directory (or moto bucket): sequential write
   of one file per worker process with fsync, then a cold sequential read (the files are evicted
   from the page cache with posix_fadvise(DONTNEED) before reading); for S3, a multipart
   upload_file / download_file of the same bytes with the trainer's TransferConfig.
2. The trainer (`torchrun -m llmtrain_trainer`, 2 CPU processes, gloo) on a model whose state
   (fp32 parameters + AdamW m and v) is `--state-gib` in all, saving asynchronously every
   `--interval` steps and once more, blocking, at the end. Save bandwidth = checkpoint bytes / the
   blocking save's seconds (from the trainer's `checkpoint` event); load bandwidth = bytes / the
   `resume` event's seconds of a second run, with the checkpoint evicted from the page cache first.
   That run times the parts of the resume on every rank (`resume_phases_s`, see
   trainer_with_resume_timers); `load_MBps_into_existing_state` leaves out the first one, creating
   the optimizer state the load fills (fresh memory: the kernel faults in and zeroes every page,
   which a fresh run pays at its first optimizer step too, and which the disk's read into a reused
   buffer does not pay).
3. The step-time cost of asynchronous checkpointing: the median step that overlaps a save in
   flight (its interval intersects [save start, commit]) vs the median step that doesn't.

Ratios: trainer bandwidth ÷ storage bandwidth (target ≥ 0.8×), overlapped ÷ clean step (target < 1.05×).

    .venv/bin/python bench/checkpoint_bandwidth.py                    # local disk, ~2 GiB of state
    .venv/bin/python bench/checkpoint_bandwidth.py --target s3        # the same against moto S3
    .venv/bin/python bench/checkpoint_bandwidth.py --quick            # small, for the test suite
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

from ports import free_port, metrics_port

REPO = Path(__file__).resolve().parents[1]


BLOCK = 8 << 20


def model_dims(state_gib: float) -> dict:
    """A Llama whose fp32 params + AdamW state (12 bytes/param) is about `state_gib` GiB."""
    params = state_gib * (1 << 30) / 12
    d, ffn, vocab, heads = (1024, 2816, 8192, 16) if state_gib >= 0.5 else (256, 704, 2048, 4)
    per_layer = 4 * d * d + 3 * d * ffn  # attention (MHA) + SwiGLU MLP
    layers = max(1, round((params - 2 * vocab * d) / per_layer))
    return {
        "hiddenSize": d,
        "intermediateSize": ffn,
        "numLayers": layers,
        "numHeads": heads,
        "numKvHeads": heads,
        "vocabSize": vocab,
        "maxSeqLen": 64,
    }


def state_bytes(dims: dict) -> int:
    from llmtrain.catalog import ModelDims
    from llmtrain.flops import num_params

    d = ModelDims(
        hidden_size=dims["hiddenSize"],
        intermediate_size=dims["intermediateSize"],
        num_layers=dims["numLayers"],
        num_heads=dims["numHeads"],
        num_kv_heads=dims["numKvHeads"],
        vocab_size=dims["vocabSize"],
    )
    return 12 * num_params(d)


def job_spec(dims: dict, ckpt_uri: str, steps: int, interval: int, nproc: int, seqs_per_rank: int = 1) -> dict:
    return {
        "model": {"dims": dims},
        "data": {"uri": "synthetic", "seqLen": 32},
        "cluster": {"instanceType": "cpu", "processesPerNode": nproc},
        "fsdp": {"shardingStrategy": "FULL_SHARD", "mixedPrecision": "fp32", "activationCheckpointing": "none"},
        "training": {
            "maxSteps": steps,
            "globalBatchTokens": 32 * nproc * seqs_per_rank,
            "microBatchSize": 1,
            "learningRate": 3e-4,
            "warmupSteps": 1,
            "seed": 0,
        },
        "checkpoint": {"uri": ckpt_uri, "intervalMinutes": 600, "intervalSteps": interval, "keep": 2},
        "rendezvous": {"backend": "c10d"},
    }


# -- the storage's own speed -----------------------------------------------------------------------


def _evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def evict_tree(root: str) -> None:
    for dirpath, _, files in os.walk(root):
        for f in files:
            _evict(os.path.join(dirpath, f))


def disk_speed(directory: str, nbytes: int, files: int) -> dict:
    """Sequential write (+fsync) and cold read of `files` files written concurrently, like the ranks do."""
    from concurrent.futures import ThreadPoolExecutor

    buf = os.urandom(BLOCK)
    paths = [os.path.join(directory, f"disk-speed-{i}") for i in range(files)]
    per_file = nbytes // files

    def write(path: str) -> None:
        with open(path, "wb", buffering=0) as f:
            left = per_file
            while left > 0:
                left -= f.write(memoryview(buf)[: min(BLOCK, left)])
            os.fsync(f.fileno())

    def read(path: str) -> None:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(bytearray(BLOCK)):
                pass

    with ThreadPoolExecutor(files) as pool:
        t0 = time.perf_counter()
        list(pool.map(write, paths))
        w = time.perf_counter() - t0
        for p in paths:
            _evict(p)
        t0 = time.perf_counter()
        list(pool.map(read, paths))
        r = time.perf_counter() - t0
    for p in paths:
        os.remove(p)
    total = per_file * files
    return {"bytes": total, "write_MBps": total / w / 1e6, "read_MBps": total / r / 1e6}


def s3_speed(bucket: str, directory: str, nbytes: int, files: int) -> dict:
    """upload_file / download_file of `files` files concurrently, with the trainer's TransferConfig."""
    from concurrent.futures import ThreadPoolExecutor

    from llmtrain_trainer.storage import s3

    client, cfg = s3.client(), s3.transfer_config()
    per_file = nbytes // files
    paths = []
    for i in range(files):
        p = os.path.join(directory, f"s3-speed-{i}")
        with open(p, "wb") as f:
            for _ in range(per_file // BLOCK):
                f.write(os.urandom(BLOCK))
            f.write(os.urandom(per_file % BLOCK))
        paths.append(p)
    with ThreadPoolExecutor(files) as pool:
        t0 = time.perf_counter()
        list(pool.map(lambda p: client.upload_file(p, bucket, "speed/" + os.path.basename(p), Config=cfg), paths))
        w = time.perf_counter() - t0
        t0 = time.perf_counter()
        list(
            pool.map(
                lambda p: client.download_file(bucket, "speed/" + os.path.basename(p), p + ".back", Config=cfg), paths
            )
        )
        r = time.perf_counter() - t0
    for p in paths:
        os.remove(p)
        os.remove(p + ".back")
        client.delete_object(Bucket=bucket, Key="speed/" + os.path.basename(p))
    total = per_file * files
    return {"bytes": total, "write_MBps": total / w / 1e6, "read_MBps": total / r / 1e6}


# -- the trainer -----------------------------------------------------------------------------------


def run_trainer(spec: dict, work: str, env: dict, nproc: int, phases_dir: str | None = None) -> list[dict]:
    """The trainer under torchrun; with `phases_dir`, with the resume's phase timers (below), each
    rank writing its times to `phases_dir/phases.r<rank>.json`."""
    spec_file = os.path.join(work, "spec.json")
    Path(spec_file).write_text(json.dumps(spec))
    entry = ["-m", "llmtrain_trainer"]
    if phases_dir:
        entry = [__file__, TIMED_TRAINER]
        env = dict(env, CHECKPOINT_BENCH_PHASES=phases_dir)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        *entry,
        "--spec",
        spec_file,
    ]
    out = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"trainer failed:\n{out.stderr[-4000:]}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


TIMED_TRAINER = "--trainer-with-resume-timers"


def trainer_with_resume_timers(argv: list[str]) -> None:
    """Run the trainer (this process is one torchrun rank) with wall-clock timers around the parts
    of a resume, written to $CHECKPOINT_BENCH_PHASES/phases.r<rank>.json at exit (seconds):

      optimizer_state   creating the optimizer state DCP loads into (init_optimizer_state)
      metadata          reading and unpickling the checkpoint's .metadata
      plan              this rank's load plan (set_up_planner, create_local_plan; global plan on rank 0)
      plan_wait         the plan collective, less the two above: waiting for the other ranks
      read              the storage reader's read_data: reads, deserialisation, copies into the state
      read_wait         the collective after the reads, less `read`: waiting for the slower rank
      set_state_dict    handing the loaded state to the model and optimizer
      gc                garbage collection during all of the above
      total             Checkpointer.resume + set_state_dict
    A few hundred Python-level calls are wrapped; the timers' own cost is microseconds."""
    import atexit
    import collections
    import functools
    import gc
    import runpy

    import torch.distributed.checkpoint.default_planner as dp
    import torch.distributed.checkpoint.state_dict as sd
    import torch.distributed.checkpoint.utils as du

    import llmtrain_trainer.checkpoint.checkpointer as ck
    import llmtrain_trainer.checkpoint.reader as cr
    import llmtrain_trainer.checkpoint.stores as cs
    import llmtrain_trainer.train as tr

    t: dict[str, float] = collections.defaultdict(float)
    active = [0]

    def timed(name, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            active[0] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                active[0] -= 1
                t[name] += time.perf_counter() - t0

        return wrapper

    gc_start = [0.0]

    def on_gc(phase, info):
        if phase == "start":
            gc_start[0] = time.perf_counter()
        elif active[0]:
            t["gc"] += time.perf_counter() - gc_start[0]

    gc.callbacks.append(on_gc)
    tr.init_optimizer_state = timed("optimizer_state", tr.init_optimizer_state)
    # The trainer's readers read .metadata through DirectFileReader (checkpoint_safety's allow-list).
    cr.DirectFileReader.read_metadata = timed("metadata", cr.DirectFileReader.read_metadata)
    for name in ("set_up_planner", "create_local_plan", "create_global_plan"):
        setattr(dp.DefaultLoadPlanner, name, timed("plan", getattr(dp.DefaultLoadPlanner, name)))
    du._DistWrapper.reduce_scatter = timed("plan_collective", du._DistWrapper.reduce_scatter)
    du._DistWrapper.all_gather = timed("read_collective", du._DistWrapper.all_gather)
    for cls in (cs._LocalReader, cs._S3Reader):
        cls.read_data = timed("read", cls.read_data)
    sd.set_state_dict = timed("set_state_dict", sd.set_state_dict)
    ck.Checkpointer.resume = timed("resume", ck.Checkpointer.resume)

    def dump() -> None:
        out = {k: t[k] for k in ("optimizer_state", "metadata", "plan")}
        out["plan_wait"] = t["plan_collective"] - t["metadata"] - t["plan"]
        out["read"] = t["read"]
        out["read_wait"] = t["read_collective"] - t["read"]
        out["set_state_dict"], out["gc"] = t["set_state_dict"], t["gc"]
        out["total"] = t["resume"] + t["set_state_dict"]
        path = os.path.join(os.environ["CHECKPOINT_BENCH_PHASES"], f"phases.r{os.environ['RANK']}.json")
        Path(path).write_text(json.dumps({k: round(v, 4) for k, v in out.items()}))

    atexit.register(dump)
    sys.argv = ["llmtrain_trainer", *argv]
    runpy.run_module("llmtrain_trainer", run_name="__main__")


def overlap_cost(events: list[dict], interval: int) -> dict:
    """Steps whose interval overlaps an asynchronous save in flight vs steps that overlap none."""
    steps = {e["step"]: e["time"] for e in events if e.get("event") == "step"}
    saves = {e["step"]: e["seconds"] for e in events if e.get("event") == "checkpoint"}
    windows = [(steps[s], steps[s] + sec) for s, sec in saves.items() if s in steps and s % interval == 0]
    overlapped, clean = [], []
    for s in sorted(steps)[2:]:  # the first steps include warm-up
        if s - 1 not in steps:
            continue
        a, b = steps[s - 1], steps[s]
        (overlapped if any(a < w1 and b > w0 for w0, w1 in windows) else clean).append(b - a)
    if not overlapped or not clean:
        return {"overlapped_steps": len(overlapped), "clean_steps": len(clean)}
    return {
        "overlapped_steps": len(overlapped),
        "clean_steps": len(clean),
        "overlapped_step_s": round(statistics.median(overlapped), 4),
        "clean_step_s": round(statistics.median(clean), 4),
        "ratio": round(statistics.median(overlapped) / statistics.median(clean), 3),
    }


def tree_bytes(root: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", choices=["disk", "s3"], default="disk")
    p.add_argument("--dir", help="where to write (default: a temporary directory under $TMPDIR)")
    p.add_argument("--state-gib", type=float, default=2.0, help="model + optimizer state, all ranks")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--steps", type=int, default=13)
    p.add_argument("--interval", type=int, default=4, help="asynchronous save every N steps")
    p.add_argument(
        "--seqs-per-rank",
        type=int,
        default=1,
        help="32-token sequences per rank per step (micro-batches of 1): longer steps, so the "
        "asynchronous save's cost is a fraction of a step it overlaps",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="0.05 GiB of state, 6 steps, a save at step 4: steps 3-4 run before any save and step 5 "
        "overlaps it, so both kinds exist however slow the disk",
    )
    p.add_argument("--json", help="also write the result here")
    a = p.parse_args(argv)
    if a.quick:
        # A save every 2 steps left no clean step once a loaded machine made each save outlast a step.
        a.state_gib, a.steps, a.interval = 0.05, 6, 4
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        LLMTRAIN_METRICS_PORT=metrics_port(),
        LLMTRAIN_LOG_LEVEL="WARNING",
        PYTHONPATH=os.pathsep.join([str(REPO / "operator"), str(REPO / "trainer"), os.environ.get("PYTHONPATH", "")]),
    )
    dims = model_dims(a.state_gib)
    load_before = os.getloadavg()
    t_start = time.time()
    with tempfile.TemporaryDirectory(dir=a.dir) as work, _s3_server(a.target == "s3", env) as bucket:
        os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
        if a.target == "s3":
            storage = s3_speed(bucket, work, state_bytes(dims), a.nproc)
            uri = f"s3://{bucket}/ckpt"
        else:
            storage = disk_speed(work, state_bytes(dims), a.nproc)
            uri = os.path.join(work, "ckpt")
        events = run_trainer(job_spec(dims, uri, a.steps, a.interval, a.nproc, a.seqs_per_rank), work, env, a.nproc)
        final = [e for e in events if e.get("event") == "checkpoint" and e["step"] == a.steps]
        if not final:
            sys.exit(f"no final checkpoint event in {events[-3:]}")
        save_s = final[0]["seconds"]
        # the step's directory as the trainer named it (its checkpoint event's uri): importing the
        # checkpointer here for its step_name() cost this driver a torch import (~4 s of CPU)
        name = final[0]["uri"].rstrip("/").rsplit("/", 1)[-1]
        if a.target == "s3":
            from llmtrain_trainer.storage import s3

            objs = s3.client().list_objects_v2(Bucket=bucket, Prefix=f"ckpt/{name}/").get("Contents", [])
            nbytes = sum(o["Size"] for o in objs)
        else:
            nbytes = tree_bytes(os.path.join(uri, name))
            evict_tree(uri)
        if not nbytes:
            sys.exit(f"checkpoint {name} not found under {uri}")
        resumed = run_trainer(
            job_spec(dims, uri, a.steps + 1, a.interval, a.nproc, a.seqs_per_rank), work, env, a.nproc, phases_dir=work
        )
        phases = {
            r: json.loads(Path(work, f"phases.r{r}.json").read_text())
            for r in range(a.nproc)
            if Path(work, f"phases.r{r}.json").exists()
        }
        resume = [e for e in resumed if e.get("event") == "resume"]
        if not resume:
            sys.exit("the second run did not resume")
        load_s = resume[0]["seconds"]
    save_bw, load_bw = nbytes / save_s / 1e6, nbytes / load_s / 1e6
    state_s = phases.get("0", phases.get(0, {})).get("optimizer_state")
    into_existing_bw = nbytes / (load_s - state_s) / 1e6 if state_s is not None and load_s > state_s else None
    out = {
        "bench": "checkpoint_bandwidth",
        "target": a.target,
        "date": time.strftime("%Y-%m-%d", time.gmtime(t_start)),
        "cpus": os.cpu_count(),
        "nproc": a.nproc,
        "quick": a.quick,
        "seqs_per_rank": a.seqs_per_rank,
        "model": dims,
        "checkpoint_bytes": nbytes,
        "storage": {k: (round(v, 1) if isinstance(v, float) else v) for k, v in storage.items()},
        "save_seconds": save_s,
        "load_seconds": load_s,
        "save_MBps": round(save_bw, 1),
        "load_MBps": round(load_bw, 1),
        "save_ratio": round(save_bw / storage["write_MBps"], 3),
        "load_ratio": round(load_bw / storage["read_MBps"], 3),
        "load_MBps_into_existing_state": into_existing_bw and round(into_existing_bw, 1),
        "load_ratio_into_existing_state": into_existing_bw and round(into_existing_bw / storage["read_MBps"], 3),
        "resume_phases_s": phases,
        "async_step_cost": overlap_cost(events, a.interval),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "seconds": round(time.time() - t_start, 1),
    }
    print(json.dumps(out))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    c = out["async_step_cost"]
    print(
        f"{a.target}: checkpoint {nbytes / 1e9:.2f} GB; save {save_bw:,.0f} MB/s = {out['save_ratio']:.2f}x the "
        f"storage's {storage['write_MBps']:,.0f} MB/s; load {load_bw:,.0f} MB/s = {out['load_ratio']:.2f}x its "
        f"{storage['read_MBps']:,.0f} MB/s (target ≥ 0.8x; {out['load_ratio_into_existing_state']}x leaving out "
        f"creating the optimizer state); step overlapping an async save: "
        f"{c.get('ratio', 'n/a')}x a clean step (target < 1.05x)"
    )
    return 0


class _s3_server:  # noqa: N801 — used as a function: `with _s3_server(...) as bucket`
    """A moto S3 server on a free loopback port when `enabled`; yields the bucket name (or None)."""

    def __init__(self, enabled: bool, env: dict):
        self.enabled, self.env, self.server = enabled, env, None

    def __enter__(self):
        if not self.enabled:
            return None
        from moto.server import ThreadedMotoServer

        port = free_port()
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        self.server.start()
        self.env.update(
            {
                "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
                "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_REGION": "us-east-1",
            }
        )
        os.environ.update({k: v for k, v in self.env.items() if k.startswith("AWS_")})
        from llmtrain_trainer.storage import s3

        s3.client().create_bucket(Bucket="bench")
        return "bench"

    def __exit__(self, *exc):
        if self.server is not None:
            self.server.stop()
        return False


if __name__ == "__main__":
    if sys.argv[1:2] == [TIMED_TRAINER]:
        trainer_with_resume_timers(sys.argv[2:])
    else:
        sys.exit(main())
