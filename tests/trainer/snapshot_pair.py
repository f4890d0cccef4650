"""One rank of a two-rank snapshot swap, for tests/trainer/test_snapshot_partners.py:
`python snapshot_pair.py RANK PORT FOLDER SCENARIO`; prints what it saw as one JSON line.

SCENARIO "cannot-commit": rank 1 cannot write its own snapshot's header (a full /dev/shm) at step 2,
then can at step 4. "silent": rank 1's commit takes SILENT_S seconds before it swaps (a partner
that does not answer), while rank 0 watches its own snapshot stay busy.
"""

from __future__ import annotations

import errno
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from llmtrain_trainer.checkpoint import snapshots
from llmtrain_trainer.checkpoint.snapshots import SnapshotConfig, Snapshotter

SILENT_S = 6.0


def state(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {
        "model": {"w": torch.randn(1000, generator=g)},
        "optim": {"state": {"w": {"step": torch.tensor(float(step)), "exp_avg": torch.randn(1000, generator=g)}}},
        "train": {
            "step": 0,
            "world_size": 2,
            "data": {"step": step, "samples_consumed": step},
            "rng": torch.get_rng_state(),
        },
    }


def main() -> None:
    rank, port, folder, scenario = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    events: list[dict] = []
    cfg = SnapshotConfig(folder, "ns/job", 1, "run", 2, None, True, 2.0)
    snaps = Snapshotter(cfg, local_world=1, emit=events.append)
    out: dict = {"rank": rank}
    real_write, real_crc = snapshots.write_header, snapshots.Slot.crc
    if rank == 1 and scenario == "cannot-commit":

        def full(folder: Path, header: dict) -> None:
            if header["rank"] == 1:
                raise OSError(errno.ENOSPC, "No space left on device", str(folder))
            real_write(folder, header)

        snapshots.write_header = full  # type: ignore[assignment]
    if rank == 1 and scenario == "silent":

        def slow_crc(self) -> int:
            time.sleep(SILENT_S)
            return real_crc(self)

        snapshots.Slot.crc = slow_crc  # type: ignore[method-assign]
    t0 = time.monotonic()
    snaps.take(2, state(2))
    if scenario == "silent" and rank == 0:
        time.sleep(2.0)
        out["busy_while_partner_silent"] = snaps.busy()
        out["wait_1s_while_partner_silent"] = snaps.wait(timeout=1.0)
    out["step2_done"] = snaps.wait(timeout=60.0)
    out["step2_seconds"] = round(time.monotonic() - t0, 2)
    out["busy_after"] = snaps.busy()
    out["held_after_step2"] = snaps.inventory()
    snapshots.write_header, snapshots.Slot.crc = real_write, real_crc  # type: ignore[method-assign]
    snaps.take(4, state(4))
    out["step4_done"] = snaps.wait(timeout=60.0)
    out["held_after_step4"] = snaps.inventory()
    out["events"] = events
    snaps.close()
    dist.destroy_process_group()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
