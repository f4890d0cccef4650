"""How fast a rank stages its checkpoint shard, and whether the 70B SIGTERM save fits the grace period.

Measured here, per process, for a state dict of fp32 tensors of `--gb` GB:

  host copy     tensor → another host buffer (what staging to host memory costs on CPU); on a GPU
                machine also device → pinned host memory (the real D2H of a shard)
  raw write     the same bytes written to the staging directory with plain file writes (baseline)
  dcp staging   `torch.distributed.checkpoint` writing the state dict into the staging directory
                exactly as the S3 checkpoint writer does (FileSystemWriter, one file per rank, no
                fsync) — the step that runs before the upload

and prints each as GB/s plus the ratio dcp/raw (the serialisation overhead over the disk itself),
then the arithmetic for examples/llama2-70b-p5-16nodes.yaml: bytes per node, stop latency, staging
and upload time against the pod's terminationGracePeriodSeconds.

    python bench/checkpoint_staging.py                 # 1 GB, staging dirs: $TMPDIR and /dev/shm
    python bench/checkpoint_staging.py --quick         # 0.25 GB
    python bench/checkpoint_staging.py --gb 4 --dir /mnt/nvme/staging
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

import torch

# AWS, "Best practices design patterns: optimizing Amazon S3 performance": about 85-90 MB/s per
# concurrent request. The trainer uploads each rank's file with 8 concurrent 64 MiB parts.
S3_MB_PER_CONNECTION = 85
UPLOAD_CONCURRENCY_PER_PROCESS = 8


def state_dict(gb: float, device: str) -> dict:
    n = int(gb * 1e9 / 4)
    tensors, per = {}, 64 << 20  # 256 MB tensors, like the large matrices of a shard
    i = 0
    while n > 0:
        k = min(per, n)
        tensors[f"t{i}"] = torch.rand(k, device=device)
        n -= k
        i += 1
    return tensors


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure(gb: float, staging: str, repeats: int) -> dict:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    sd = state_dict(gb, "cpu")
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    out = {"dir": staging, "gb": nbytes / 1e9}

    dst = {k: torch.empty_like(v) for k, v in sd.items()}
    out["host_copy_s"] = best_of(lambda: [dst[k].copy_(v) for k, v in sd.items()], repeats)
    dst.clear()  # free the copies before the next measurement

    root = tempfile.mkdtemp(prefix="llmtrain-staging-bench-", dir=staging)
    try:

        def raw():
            with open(os.path.join(root, "raw.bin"), "wb") as f:
                for v in sd.values():
                    f.write(memoryview(v.numpy()).cast("B"))

        def staged():
            path = os.path.join(root, "dcp")
            shutil.rmtree(path, ignore_errors=True)
            dcp.save(
                sd, storage_writer=FileSystemWriter(path, single_file_per_rank=True, sync_files=False), no_dist=True
            )

        out["raw_write_s"] = best_of(raw, repeats)
        out["dcp_staging_s"] = best_of(staged, repeats)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for k in ("host_copy", "raw_write", "dcp_staging"):
        out[f"{k}_gb_per_s"] = out["gb"] / out[f"{k}_s"]
    out["dcp_over_raw"] = out["dcp_staging_s"] / out["raw_write_s"]
    return out


def measure_d2h(gb: float, repeats: int) -> dict | None:
    if not torch.cuda.is_available():
        return None
    sd = state_dict(gb, "cuda")
    pinned = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=True) for k, v in sd.items()}
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())

    def d2h():
        for k, v in sd.items():
            pinned[k].copy_(v, non_blocking=True)
        torch.cuda.synchronize()

    def pageable():
        for v in sd.values():
            v.cpu()
        torch.cuda.synchronize()

    return {
        "gpu": torch.cuda.get_device_name(),
        "gb": nbytes / 1e9,
        "d2h_pinned_gb_per_s": nbytes / 1e9 / best_of(d2h, repeats),
        "d2h_pageable_gb_per_s": nbytes / 1e9 / best_of(pageable, repeats),
    }


def seventy_b_arithmetic(staging_gb_per_s: float, grace_s: int) -> dict:
    """examples/llama2-70b-p5-16nodes.yaml: 16 × p5.48xlarge (8 H100 each), FULL_SHARD, seqLen 4096,
    4 Mi tokens per step, microBatchSize 1; a step takes ~37 s (the issue's figure)."""
    from llmtrain.catalog import model_preset
    from llmtrain.flops import num_params

    nodes, gpus = 16, 8
    params = num_params(model_preset("llama2-70b"))
    total = params * 12  # fp32 master weights + AdamW exp_avg + exp_avg_sq
    per_node, per_process = total / nodes, total / nodes / gpus
    accum = 4 * 2**20 // 4096 // (nodes * gpus)  # micro-batches per rank and step
    stop_s = 37.0 / accum  # worst case: the signal lands just after a boundary
    staging_s = per_process / 1e9 / staging_gb_per_s  # the 8 ranks of a node stage in parallel
    upload_gb_per_s = gpus * UPLOAD_CONCURRENCY_PER_PROCESS * S3_MB_PER_CONNECTION / 1000
    upload_s = per_node / 1e9 / upload_gb_per_s
    exit_s = 5.0
    total_s = stop_s + staging_s + upload_s + exit_s
    return {
        "params": params,
        "checkpoint_gb": total / 1e9,
        "per_node_gb": per_node / 1e9,
        "per_process_gb": per_process / 1e9,
        "micro_batches_per_step": accum,
        "stop_latency_s": stop_s,
        "staging_s": staging_s,
        "upload_gb_per_s_per_node": upload_gb_per_s,
        "upload_s": upload_s,
        "exit_s": exit_s,
        "total_s": total_s,
        "grace_s": grace_s,
        "fits": total_s < grace_s,
        "s3_put_per_s_all_nodes": nodes * per_node / (64 << 20) / upload_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--quick", action="store_true", help="0.25 GB, one repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", action="append", help="staging directory (repeatable)")
    args = ap.parse_args()
    gb, repeats = (0.25, 1) if args.quick else (args.gb, args.repeats)
    dirs = args.dir or [tempfile.gettempdir()] + (["/dev/shm"] if os.path.isdir("/dev/shm") else [])
    results = [measure(gb, d, repeats) for d in dirs]
    for r in results:
        print(
            f"{r['dir']:>16}: {r['gb']:.2f} GB  host copy {r['host_copy_gb_per_s']:6.2f} GB/s  "
            f"raw write {r['raw_write_gb_per_s']:6.2f} GB/s  dcp staging {r['dcp_staging_gb_per_s']:6.2f} GB/s  "
            f"(dcp/raw time ratio {r['dcp_over_raw']:.2f}x)"
        )
    d2h = measure_d2h(gb, repeats)
    if d2h:
        print(
            f"{d2h['gpu']}: D2H pinned {d2h['d2h_pinned_gb_per_s']:.1f} GB/s, pageable "
            f"{d2h['d2h_pageable_gb_per_s']:.1f} GB/s"
        )
    try:
        from llmtrain.render import TERMINATION_GRACE_SECONDS

        grace = TERMINATION_GRACE_SECONDS
    except ImportError:  # pragma: no cover
        grace = 120
    slowest = min(r["dcp_staging_gb_per_s"] for r in results)
    a = seventy_b_arithmetic(slowest, grace)
    print(
        f"70B on 16 × p5: checkpoint {a['checkpoint_gb']:.0f} GB = {a['per_node_gb']:.1f} GB/node = "
        f"{a['per_process_gb']:.2f} GB/process\n"
        f"  stop at next micro-batch boundary  ≤ {a['stop_latency_s']:5.1f} s  (37 s step / "
        f"{a['micro_batches_per_step']} micro-batches)\n"
        f"  stage shard (slowest measured dir)    {a['staging_s']:5.1f} s  ({slowest:.2f} GB/s per process)\n"
        f"  upload per node @ {a['upload_gb_per_s_per_node']:.1f} GB/s           {a['upload_s']:5.1f} s  "
        f"(8 processes × 8 parts × {S3_MB_PER_CONNECTION} MB/s; "
        f"{a['s3_put_per_s_all_nodes']:.0f} PUT/s over all nodes)\n"
        f"  exit                                  {a['exit_s']:5.1f} s\n"
        f"  total                                 {a['total_s']:5.1f} s  vs terminationGracePeriodSeconds "
        f"{grace}: {'fits' if a['fits'] else 'DOES NOT FIT'}"
    )
    print(json.dumps({"staging": results, "d2h": d2h, "llama2_70b_16xp5": a}))


if __name__ == "__main__":
    main()
