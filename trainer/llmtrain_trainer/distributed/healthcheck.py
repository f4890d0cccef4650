"""Preflight health check: `torchrun ... -m llmtrain_trainer healthcheck`, on the nodes an attempt got.

Run by every rank before training, it answers "can these nodes train together at full speed?" in
seconds, and names the node to avoid when the answer is no:

1. **Devices**: every GPU the node should have is visible (`torch.cuda.device_count()` against
   LOCAL_WORLD_SIZE, i.e. one worker per GPU).
2. **Compute and memory smoke test**: a matmul whose exact result is known (entries that are powers
   of two, so any correct device reproduces it bit for bit) and a large allocation written and read
   back. A GPU with broken SMs or failing HBM fails here rather than as NaN losses an hour later.
3. **All-reduce bus bandwidth** across all ranks, with nccl-tests' definition, so the figure compares
   with the `all_reduce_perf` numbers people already know:
       algbw = bytes / time,   busbw = algbw · 2(n−1)/n
   (a ring all-reduce moves 2(n−1)/n of the buffer over each rank's slowest link).
4. **Per-link test**, because an all-reduce is only as fast as its slowest member and cannot say
   which one that is: every link (r, r+1) of the ring exchanges a buffer both ways, timed alone
   (see `link_schedule`); the link's figure is the median of its `--iters` exchanges. A slow rank
   slows both of its links, each neighbour only one, so "both links slow" isolates it (needs ≥ 3
   ranks).

Verdicts: a rank is *slow* when both its links are below `min_fraction` × the median of the other
links (its own two are left out of its yardstick: at 3 ranks they are two of the three links, and a
median over all of them would be the slow rank's own speed, so it would never be flagged); the
attempt is *degraded* when the all-reduce bus bandwidth is below `min_fraction` × the instance type's
expected bus bandwidth (catalog `allreduce_busbw_gbps`, only checked on GPUs across nodes: on one
node NVLink dominates, and on CPU there is no datasheet figure to hold loopback to).

Output: rank 0 prints one JSON line (`{"event": "healthcheck", ...}`); local rank 0 of every node
writes the verdict to `--report` and, where the pod has one, a compact form (`termination_message`,
within Kubernetes' 4096-byte limit) to its termination-message file, which is how the operator reads
it without scraping logs. Suspect nodes carry the Kubernetes node name (LLMTRAIN_NODE_NAME, from the
downward API) so the operator can keep the next attempt off them. Each worker exits 0 when healthy,
3 when unhealthy (a check failed or a node is slow), 1 on an error; torchrun then exits 0 or 1.

Fault injection (tests and game days only): LLMTRAIN_HEALTHCHECK_FAULT="slow=<rank>:<factor>" makes
that rank's link exchanges take `factor` times as long (before each one it waits out `factor` − 1 times
its previous exchange, so the slowdown holds however loaded the host is),
the CPU stand-in for a degraded EFA link; "gpu=<rank>" makes that rank report a failed device check.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist

from llmtrain.pod_contract import NODE_NAME_ENV, SPEC_ENV

EXIT_UNHEALTHY = 3
TERMINATION_LOG = "/dev/termination-log"
TERMINATION_MESSAGE_BYTES = 4096  # the kubelet truncates a container's termination message here


@dataclass
class RankResult:
    rank: int
    node: int
    host: str
    devices_ok: bool
    compute_ok: bool
    memory_ok: bool
    link_gbps: float = 0.0  # the link to rank+1, both directions at once, timed alone
    problems: list[str] = field(default_factory=list)
    node_name: str | None = None  # the Kubernetes node (downward API), where known


def _fault() -> dict[str, str]:
    raw = os.environ.get("LLMTRAIN_HEALTHCHECK_FAULT", "")
    return dict(item.split("=", 1) for item in raw.split(",") if "=" in item)


def _slow_factor(rank: int) -> float:
    spec = _fault().get("slow")
    if not spec:
        return 1.0
    r, factor = spec.split(":")
    return float(factor) if int(r) == rank else 1.0


def check_devices(device: torch.device, rank: int) -> tuple[bool, str | None]:
    if _fault().get("gpu") == str(rank):
        return False, "device check failed (injected fault)"
    if device.type != "cuda":
        return True, None
    expected = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    visible = torch.cuda.device_count()
    if visible < expected:
        return False, f"{visible} GPU(s) visible, {expected} expected (one per local worker)"
    return True, None


def check_compute(device: torch.device, n: int = 512) -> tuple[bool, str | None]:
    """A @ B with A = 2 everywhere and B = 0.5 everywhere: every entry is exactly n, on any correct
    device and dtype that holds n exactly."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.full((n, n), 2.0, dtype=dtype, device=device)
    b = torch.full((n, n), 0.5, dtype=dtype, device=device)
    c = (a @ b).float()
    wrong = int((c != float(n)).sum())
    return (wrong == 0, None if wrong == 0 else f"matmul: {wrong} of {n * n} entries wrong")


def check_memory(device: torch.device, mib: int) -> tuple[bool, str | None]:
    """Write a known ramp into a large buffer and read its checksum back."""
    count = mib * 1024 * 1024 // 4
    x = torch.arange(count, dtype=torch.int32, device=device) % 65536
    got = int(x.sum(dtype=torch.int64))
    full, rest = divmod(count, 65536)
    expected = full * (65535 * 65536 // 2) + rest * (rest - 1) // 2
    del x
    return (got == expected, None if got == expected else f"memory: checksum {got} != {expected}")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def allreduce_busbw(buf: torch.Tensor, iters: int) -> float:
    """nccl-tests' bus bandwidth in GB/s (see the module docstring)."""
    n = dist.get_world_size()
    dist.all_reduce(buf)  # warm-up: connection set-up is not bandwidth
    _sync(buf.device)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    _sync(buf.device)
    elapsed = (time.perf_counter() - t0) / iters
    nbytes = buf.numel() * buf.element_size()
    return nbytes / elapsed * (2 * (n - 1) / n) / 1e9 if n > 1 else 0.0


def link_schedule(n: int) -> list[list[tuple[int, int]]]:
    """The ring's links (i, i+1 mod n), grouped into phases in which no rank is in two links, so
    every link is timed alone: a slow rank cannot make an unrelated link look slow (in a free-running
    ring exchange it would, by delaying its neighbours' next round and so on around the ring)."""
    if n < 2:
        return []
    links = [(i, (i + 1) % n) for i in range(n if n > 2 else 1)]
    phases: list[list[tuple[int, int]]] = [[], [], []]
    for i, link in enumerate(links):
        phases[2 if (n % 2 and i == n - 1) else i % 2].append(link)
    return [p for p in phases if p]


def link_bandwidths(buf: torch.Tensor, recv: torch.Tensor, iters: int) -> float:
    """GB/s of this rank's link to rank+1 (both directions at once), timed by this rank."""
    rank, n = dist.get_rank(), dist.get_world_size()
    slow = _slow_factor(rank)
    mine = 0.0
    for phase in link_schedule(n):
        dist.barrier()
        link = next((lk for lk in phase if rank in lk), None)
        if link is None:
            continue
        peer = link[1] if link[0] == rank else link[0]

        def once(peer: int = peer) -> float:
            start = time.perf_counter()
            for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, buf, peer), dist.P2POp(dist.irecv, recv, peer)]):
                req.wait()
            _sync(buf.device)
            return time.perf_counter() - start

        # Each exchange is timed alone and the link gets the median: one exchange stalled by the
        # scheduler (a busy host, a noisy neighbour) cannot make a healthy link look slow, while a
        # degraded link is slow on every exchange.
        prev = once()  # untimed: connection set-up
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            if slow > 1.0:  # the stand-in for a degraded link: each exchange takes `slow`x its own time
                time.sleep(prev * (slow - 1.0))
            prev = once()
            times.append(time.perf_counter() - start)
        if link[0] == rank:
            mine = buf.numel() * buf.element_size() / statistics.median(times) / 1e9
    dist.barrier()
    return mine


def judge(results: list[RankResult], busbw: float, expected_busbw: float | None, min_fraction: float) -> dict:
    """Turn every rank's measurements into the attempt's verdict (pure: unit-tested on its own).

    `link_gbps` of rank r is the link (r, r+1). A rank is slow when both of its links (to r-1 and to
    r+1) are below `min_fraction` of the median of the other links: its neighbours then have one
    slow link each.
    With two ranks there is one link and nothing to compare it with, so only the absolute check
    (all-reduce against the catalog) applies."""
    n = len(results)
    by_rank = {r.rank: r for r in results}
    suspects: dict[int, list[str]] = {}
    for r in results:
        if r.problems:
            suspects.setdefault(r.rank, []).extend(r.problems)
    if n >= 3:
        for r in results:
            left = by_rank[(r.rank - 1) % n].link_gbps
            others = [o.link_gbps for o in results if o.rank not in (r.rank, (r.rank - 1) % n)]
            median = statistics.median(others)
            if r.link_gbps < min_fraction * median and left < min_fraction * median:
                suspects.setdefault(r.rank, []).append(
                    f"links {left:.3f} and {r.link_gbps:.3f} GB/s, below {min_fraction:.0%} of the "
                    f"median of the other links ({median:.3f} GB/s)"
                )
    degraded = expected_busbw is not None and busbw < min_fraction * expected_busbw
    nodes: dict[tuple, dict] = {}
    for k in sorted(suspects):
        r = by_rank[k]
        entry = nodes.setdefault((r.node, r.host), {"node": r.node, "host": r.host, "problem": suspects[k][0]})
        if r.node_name:
            entry["nodeName"] = r.node_name
    return {
        "event": "healthcheck",
        "healthy": not suspects and not degraded,
        "worldSize": n,
        "busBandwidthGBps": round(busbw, 3),
        "expectedBusBandwidthGBps": expected_busbw,
        "degraded": degraded,
        "suspectRanks": {str(k): v for k, v in sorted(suspects.items())},
        "suspectNodes": [nodes[k] for k in sorted(nodes)],
        "linkGBps": {str(r.rank): round(r.link_gbps, 3) for r in results},
    }


def expected_bus_bandwidth(instance_type: str | None, device: torch.device, nodes: int) -> float | None:
    """The catalog's expected all-reduce bus bandwidth in GB/s; None where no datasheet figure
    applies (CPU, a single node, an instance type without one)."""
    if device.type != "cuda" or nodes < 2 or not instance_type:
        return None
    from llmtrain.catalog import instance_type as lookup

    return lookup(instance_type).allreduce_busbw_gbps


def termination_message(verdict: dict, limit: int = TERMINATION_MESSAGE_BYTES) -> str:
    """The verdict as compact JSON within `limit` bytes: per-link figures go first, then suspect
    ranks beyond the first few; the suspect nodes and the bandwidth figures always stay."""
    v = {k: val for k, val in verdict.items() if k != "linkGBps"}
    text = json.dumps(v, separators=(",", ":"))
    ranks = dict(v.get("suspectRanks") or {})
    while len(text.encode()) > limit and ranks:
        ranks.pop(next(reversed(ranks)))
        v["suspectRanks"] = ranks
        v["truncated"] = True
        text = json.dumps(v, separators=(",", ":"))
    nodes = list(v.get("suspectNodes") or [])
    while len(text.encode()) > limit and nodes:
        nodes.pop()
        v["suspectNodes"] = nodes
        v["truncated"] = True
        text = json.dumps(v, separators=(",", ":"))
    return text


def _instance_type_from_spec() -> str | None:
    if not os.environ.get(SPEC_ENV):
        return None
    from ..config import load_spec

    return load_spec(None).cluster.instance_type


def run(
    size_mib: int = 16, iters: int = 5, memory_mib: int = 256, min_fraction: float = 0.5, report: str | None = None
) -> int:
    from .parallel import device_for_rank, init_distributed

    device = device_for_rank()
    init_distributed(device, timeout_minutes=float(os.environ.get("LLMTRAIN_HEALTHCHECK_TIMEOUT_MIN", "5")))
    rank, n = dist.get_rank(), dist.get_world_size()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    node = int(os.environ.get("GROUP_RANK", str(rank // max(local_world, 1))))
    result = RankResult(
        rank=rank,
        node=node,
        host=os.environ.get("HOSTNAME") or os.uname().nodename,
        devices_ok=True,
        compute_ok=True,
        memory_ok=True,
        node_name=os.environ.get(NODE_NAME_ENV) or None,
    )
    for attr, check in (
        ("devices_ok", lambda: check_devices(device, rank)),
        ("compute_ok", lambda: check_compute(device)),
        ("memory_ok", lambda: check_memory(device, memory_mib)),
    ):
        ok, problem = check()
        setattr(result, attr, ok)
        if problem:
            result.problems.append(problem)

    count = size_mib * 1024 * 1024 // 4
    buf = torch.ones(count, dtype=torch.float32, device=device)
    recv = torch.empty_like(buf)
    busbw = allreduce_busbw(buf, iters)
    result.link_gbps = link_bandwidths(buf, recv, iters)

    gathered: list[dict] = [None] * n  # type: ignore[list-item]  # all_gather_object fills every slot
    dist.all_gather_object(gathered, asdict(result))
    verdicts: list[dict | None] = [None]
    if rank == 0:
        verdicts[0] = judge(
            [RankResult(**g) for g in gathered],
            busbw,
            expected_bus_bandwidth(_instance_type_from_spec(), device, n // max(local_world, 1)),
            min_fraction,
        )
        print(json.dumps(verdicts[0], separators=(",", ":")), flush=True)
    # every node gets the verdict: each pod reports it (the operator may see any one of them first)
    dist.broadcast_object_list(verdicts, src=0)
    verdict = verdicts[0]
    assert verdict is not None  # rank 0 set it; the broadcast gave it to every rank
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        if report:
            with open(report, "w") as f:
                f.write(json.dumps(verdict, separators=(",", ":")))
        log = os.environ.get("LLMTRAIN_TERMINATION_LOG", TERMINATION_LOG)
        if os.access(log, os.W_OK):
            with open(log, "w") as f:
                f.write(termination_message(verdict))
    dist.destroy_process_group()
    return 0 if verdict["healthy"] else EXIT_UNHEALTHY


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m llmtrain_trainer healthcheck",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--size-mib", type=int, default=64, help="all-reduce and link-test buffer (default 64 MiB)")
    p.add_argument("--iters", type=int, default=5, help="timed repetitions of each transfer")
    p.add_argument("--memory-mib", type=int, default=1024, help="memory test allocation per rank")
    p.add_argument(
        "--min-fraction",
        type=float,
        default=0.5,
        help="a rank with both links below this fraction of the median of the other links, or an "
        "all-reduce below this fraction of the catalog's EFA bandwidth, is unhealthy (default 0.5)",
    )
    p.add_argument("--report", help="also write rank 0's JSON verdict to this file")
    a = p.parse_args(argv)
    if not 0 < a.min_fraction <= 1:
        p.error(f"--min-fraction must be in (0, 1], got {a.min_fraction}")
    return run(a.size_mib, a.iters, a.memory_mib, a.min_fraction, a.report)
