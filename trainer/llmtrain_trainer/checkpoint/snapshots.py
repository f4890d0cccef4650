"""In-memory snapshots (spec.checkpoint.memory): restarts that read no durable checkpoint.

Every `intervalSteps` (or, with "auto", every √(2 × blocking cost × MTBF) seconds, the cost measured
on each snapshot) each rank copies its local state — its shard of every parameter and optimizer
state, its RNG state — into a slot file in the snapshot folder, the pod's /dev/shm, which outlives
the worker processes (snapshot_file.py: the layout and the checks). That copy is the only part
training waits for. A background thread then checksums the slot, commits it (the header's rename),
and, with `partner`, sends it to the same local rank on the next node (rank + processes per node, a
ring), receiving the previous node's in turn: a node lost with its /dev/shm leaves a copy of each of
its ranks on the next node. The thread's collectives run on their own gloo group; the next snapshot
(or the end of training) waits for the thread first.

`restore` (collective, when a process starts): every process lists the committed snapshots its
folder holds whose identity is its own (job, attempt, rendezvous run, world size: a snapshot of
anything else is never loaded); the processes exchange these lists and pick the newest step for which
every rank's snapshot exists somewhere (`choose`, pure). A rank whose own process holds it reads it
locally; any other is sent by a process that holds it. Each payload's CRC-32 is checked, then copied
into the fresh state's local shards; a snapshot that fails any check on any rank makes every rank
fall back to the durable checkpoint, with an event saying which rank and why. A snapshot no newer
than the newest durable checkpoint is not used.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from llmtrain.cadence import AutoInterval

from .snapshot_file import (
    MAX_HEADER_BYTES,
    SLOTS,
    BadSnapshot,
    Identity,
    Slot,
    copy_into,
    flatten,
    header_bytes,
    header_path,
    held_slots,
    layout,
    load_into,
    make_header,
    parse_header,
    read_header,
    slot_path,
    write_header,
)

log = logging.getLogger(__name__)
# How long the end of training waits for a snapshot still in flight: a healthy swap takes seconds
# (0.76 GB per rank on loopback, a p5 rank's 6 GiB over EFA in less), a silent partner for ever.
CLOSE_WAIT_S = 20.0

Holding = tuple[int, int]  # (rank whose snapshot, step)


@dataclass(frozen=True)
class Choice:
    """What `restore` loads: the step, and for each rank the process that holds its snapshot."""

    step: int
    holders: dict[int, int]

    @property
    def moved(self) -> int:
        """Ranks whose snapshot comes from another process (a partner's copy)."""
        return sum(1 for rank, holder in self.holders.items() if holder != rank)


def choices(inventories: list[list[Holding]], world: int) -> list[Choice]:
    """Every step at which every rank's snapshot is held by some process, newest first, and who
    sends each (the rank's own process when it holds it, else the lowest-numbered holder).
    `inventories[p]`: what process p's folder holds."""
    holders: dict[tuple[int, int], list[int]] = {}
    for proc, held in enumerate(inventories):
        for rank, step in held:
            holders.setdefault((rank, step), []).append(proc)
    steps = sorted({s for _, s in holders}, reverse=True)
    return [
        Choice(step, {r: r if r in holders[(r, step)] else min(holders[(r, step)]) for r in range(world)})
        for step in steps
        if all((r, step) in holders for r in range(world))
    ]


def choose(inventories: list[list[Holding]], world: int) -> Choice | None:
    """The newest of `choices`; None: none."""
    found = choices(inventories, world)
    return found[0] if found else None


def partner_of(rank: int, world: int, local_world: int) -> int | None:
    """The rank that keeps a copy of `rank`'s snapshots: the same local rank on the next node."""
    if world <= local_world:
        return None  # one node: no other node to keep it
    return (rank + local_world) % world


@dataclass(frozen=True)
class SnapshotConfig:
    """spec.checkpoint.memory as the snapshotter takes it (job_config.py builds it)."""

    folder: Path
    job: str  # namespace/name
    attempt: int
    run: str  # the rendezvous run (TORCHELASTIC_RUN_ID): one per attempt
    interval_steps: int  # 0: by time (auto)
    auto: AutoInterval | None
    partner: bool
    timeout_minutes: float


def auto_snapshot_interval(spec, env_auto) -> AutoInterval:
    """intervalSteps auto: the job's MTBF as the operator rendered it (or the instance type's prior)
    and, until the first snapshot is measured, the planner's estimate of the copy
    (llmtrain/snapshot_plan.py)."""
    from llmtrain import cadence
    from llmtrain.catalog import instance_type
    from llmtrain.snapshot_plan import snapshot_blocking_estimate

    try:
        mtbf = float(env_auto.get(cadence.MTBF_ENV) or "nan")
    except ValueError:
        mtbf = float("nan")
    if not mtbf > 0 or mtbf == float("inf"):
        inst = instance_type(spec.cluster.instance_type)
        mtbf = cadence.node_mtbf(inst.name, inst.gpus_per_node).job_seconds(spec.cluster.nodes)
    return AutoInterval(mtbf, snapshot_blocking_estimate(spec))


class Snapshotter:
    """Takes a rank's snapshots, replicates them to its partner, and restores from them."""

    def __init__(self, cfg: SnapshotConfig, *, local_world: int, emit: Callable[[dict], None] | None = None):
        self.cfg = cfg
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.identity = Identity(cfg.job, cfg.attempt, cfg.run, self.world)
        self.to = partner_of(self.rank, self.world, local_world) if cfg.partner else None
        # ... and the rank whose copies this rank keeps: the same local rank on the previous node
        self.frm = (self.rank - local_world) % self.world if self.to is not None else None
        self.emit = emit or (lambda event: None)
        self.folder = cfg.folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.pg = dist.new_group(backend="gloo", timeout=dt.timedelta(minutes=cfg.timeout_minutes))
        self._slots: dict[tuple[int, str], Slot] = {}
        self._layout: tuple[list, int] | None = None
        self._thread: threading.Thread | None = None
        self._skipping = False
        self._last = time.monotonic()
        self.nbytes = 0  # this rank's snapshot (0 before the first)

    # -- taking ----------------------------------------------------------------------------------

    def due(self, step: int) -> bool:
        """This rank's opinion (the trainer all-reduces it, so every rank snapshots the same step)."""
        if self.cfg.interval_steps:
            return step % self.cfg.interval_steps == 0
        auto = self.cfg.auto
        return auto is not None and time.monotonic() - self._last >= auto.seconds

    def take(self, step: int, state: dict[str, Any]) -> float:
        """Snapshot `state` (the trainer's state_dict of this step); returns the seconds it blocked:
        waiting for the previous snapshot's thread, and the copy into the slot."""
        t0 = time.perf_counter()
        self.wait()
        tensors = flatten(state)
        entries, nbytes = self._layout or layout(tensors)
        self._layout = (entries, nbytes)
        self.nbytes = nbytes
        letter = self._free_letter(self.rank)
        slot = self._slot(self.rank, letter, nbytes)
        header_path(self.folder, self.rank, letter).unlink(missing_ok=True)  # no header over a half-written slot
        copy_into(slot, entries, tensors)
        data = {k: int(v) for k, v in state["train"]["data"].items()}
        header = make_header(self.identity, self.rank, step, data, letter, entries, nbytes, 0)
        self._thread = threading.Thread(target=self._commit, args=(slot, header), name="snapshot", daemon=True)
        self._thread.start()
        self._skipping = False
        blocking = time.perf_counter() - t0
        self._last = time.monotonic()
        if self.cfg.auto is not None:
            self.cfg.auto.observe(blocking)
        return blocking

    def _commit(self, slot: Slot, header: dict[str, Any]) -> None:
        """Checksum and commit this rank's snapshot, then swap copies with the partners. A rank that
        cannot commit its own still takes part in the swap (it sends "nothing"): its partner would
        otherwise wait for it until the group's timeout, and the rank that sends to it as long."""
        committed = False
        try:
            header["crc32"] = slot.crc()
            write_header(self.folder, header)
            committed = True
        except Exception as err:  # noqa: BLE001 - a failed snapshot costs recovery speed, not the run
            self._failed(header["step"], err)
        if self.to is None:
            return
        try:
            self._exchange(slot.bytes if committed else None, header if committed else None)
        except Exception as err:  # noqa: BLE001 - as above
            self._failed(header["step"], err)

    def _failed(self, step: int, err: Exception) -> None:
        log.error("snapshot of step %d failed (the next one tries again): %s", step, err)
        self.emit({"event": "snapshot_failed", "step": step, "rank": self.rank, "error": str(err)[:240]})

    def _exchange(self, payload: torch.Tensor | None, header: dict[str, Any] | None) -> None:
        """Send this rank's committed snapshot (None: "nothing") to its partner; receive, check and
        commit the one of the rank whose partner this rank is."""
        assert self.to is not None and self.frm is not None  # only with a partner
        sends = _isend(payload, header, self.to, self.pg)
        try:
            got, received = _recv(self.frm, self.pg, self._receiving_slot)
            if got["rank"] != self.frm or (why := self.identity.mismatch(got)):
                raise BadSnapshot(f"rank {self.frm} sent a snapshot of rank {got['rank']}: {why or 'not its own'}")
            if received.crc() != got["crc32"]:
                raise BadSnapshot(f"the snapshot rank {self.frm} sent fails its CRC-32")
            write_header(self.folder, got)
        finally:
            for w in sends:
                w.wait()

    def _receiving_slot(self, header: dict[str, Any]) -> Slot:
        header["slot"] = letter = self._free_letter(header["rank"])
        header_path(self.folder, header["rank"], letter).unlink(missing_ok=True)
        return self._slot(header["rank"], letter, header["nbytes"])

    def _committed(self, rank: int) -> dict[str, dict[str, Any]]:
        """`rank`'s committed snapshots in this folder that are this identity's, by slot."""
        out = {}
        for letter in SLOTS:
            try:
                h = read_header(self.folder, rank, letter)
            except FileNotFoundError:
                continue
            except (OSError, BadSnapshot) as err:
                log.warning("snapshot header of rank %d slot %s skipped: %s", rank, letter, err)
                continue
            why = self.identity.mismatch(h)
            if why is None:
                out[letter] = h
            else:
                log.info("snapshot of rank %d in %s not loaded: %s", rank, self.folder, why)
        return out

    def _free_letter(self, rank: int) -> str:
        """The slot to write `rank`'s next snapshot into: an empty one, else the older one (the newer
        must survive until the new one is committed)."""
        held = self._committed(rank)
        empty = [letter for letter in SLOTS if letter not in held]
        return empty[0] if empty else min(held, key=lambda letter: held[letter]["step"])

    def _slot(self, rank: int, letter: str, nbytes: int) -> Slot:
        s = self._slots.get((rank, letter))
        if s is None or s.nbytes != nbytes:
            if s is not None:
                s.close()
            s = self._slots[(rank, letter)] = Slot(slot_path(self.folder, rank, letter), nbytes)
        return s

    def busy(self) -> bool:
        """The previous snapshot is still being checked or swapped (a slow or silent partner): the
        trainer skips a due snapshot rather than wait for it (`skipped`)."""
        return self._thread is not None and self._thread.is_alive()

    def skipped(self, step: int) -> None:
        """A due snapshot not taken because some rank was busy; said once per run of skips."""
        if not self._skipping:
            log.warning("snapshot of step %d skipped: a rank's previous snapshot is still being swapped", step)
            self.emit({"event": "snapshot_skipped", "step": step})
        self._skipping = True

    def wait(self, timeout: float | None = None) -> bool:
        """Join the snapshot in flight (at most `timeout` seconds); False if it is still running."""
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                return False
            self._thread = None
        return True

    def close(self, timeout: float = CLOSE_WAIT_S) -> None:
        """Wait a bounded time for the snapshot in flight: training is over, and a partner that never
        answers must not hold the process past its grace period. A snapshot still swapping then is
        left to die with the process (its own copy is already committed or not, atomically)."""
        if not self.wait(timeout):
            log.warning("the snapshot in flight did not finish in %.0f s; not waiting for it", timeout)
            return
        for s in self._slots.values():
            s.close()
        self._slots.clear()
        dist.destroy_process_group(self.pg)

    # -- restoring -------------------------------------------------------------------------------

    def inventory(self) -> list[Holding]:
        """The committed snapshots of this identity in this process's folder (headers only)."""
        ranks = sorted({rank for rank, _ in held_slots(self.folder)})
        return sorted({(rank, h["step"]) for rank in ranks for h in self._committed(rank).values()})

    def _header_at(self, rank: int, step: int) -> dict[str, Any]:
        for h in self._committed(rank).values():
            if h["step"] == step:
                return h
        raise BadSnapshot(f"the snapshot of rank {rank} at step {step} is gone from {self.folder}")

    def restore(self, make_state: Callable[[], dict[str, Any]], newer_than: int | None) -> tuple[Choice, dict] | None:
        """(what was chosen, the loaded state) or None (no usable snapshot newer than the durable
        checkpoint `newer_than`; the caller resumes from that). The newest step every rank's snapshot
        is held for first; when one fails a check on any rank, the next older one. Collective."""
        inventories: list[Any] = [None] * self.world
        dist.all_gather_object(inventories, self.inventory(), group=self.pg)
        found = choices(inventories, self.world)
        usable = [c for c in found if newer_than is None or c.step > newer_than]
        if found and not usable:
            self._said("snapshot_not_newer", step=found[0].step, durable_step=newer_than)
        for choice in usable:
            state = self._load(choice, make_state)
            if state is not None:
                return choice, state
        return None

    def _load(self, choice: Choice, make_state: Callable[[], dict[str, Any]]) -> dict | None:
        """The state of `choice` on every rank, or None on every rank (with the first rank's reason
        in an event) when any rank's snapshot fails a check."""
        error, state = None, None
        try:
            header, payload = self._fetch(choice)
            state = make_state()
            load_into(payload, header, flatten(state))
            state["train"].update(step=choice.step, world_size=self.world, data=header["data"])
        except (BadSnapshot, OSError, RuntimeError) as err:
            error = str(err)[:240]
        errors: list[Any] = [None] * self.world
        dist.all_gather_object(errors, error, group=self.pg)
        bad = [(r, e) for r, e in enumerate(errors) if e]
        if bad:
            rank, why = bad[0]
            log.warning("snapshot of step %d not loaded (rank %d: %s)", choice.step, rank, why)
            self._said("snapshot_refused", step=choice.step, rank=rank, error=why)
            return None
        return state

    def _fetch(self, choice: Choice) -> tuple[dict[str, Any], torch.Tensor]:
        """This rank's snapshot, read locally or received from its holder; sends the ones this
        process holds for others. Checked (header and CRC-32) before it is returned."""
        sends = []
        for rank, holder in choice.holders.items():
            if holder == self.rank and rank != self.rank:
                try:
                    h = self._header_at(rank, choice.step)
                    payload = self._slot(rank, h["slot"], h["nbytes"]).bytes
                except (OSError, BadSnapshot) as err:  # the needer must hear it, or it waits for ever
                    log.warning("cannot send the snapshot of rank %d: %s", rank, err)
                    h, payload = None, None
                sends += _isend(payload, h, rank, self.pg)
        try:
            holder = choice.holders[self.rank]
            if holder == self.rank:
                header = self._header_at(self.rank, choice.step)
                slot = self._slot(self.rank, header["slot"], header["nbytes"])
            else:
                header, slot = _recv(holder, self.pg, self._receiving_slot)
            if (why := self.identity.mismatch(header)) or header["rank"] != self.rank or header["step"] != choice.step:
                raise BadSnapshot(f"the snapshot of rank {self.rank} is not the one chosen: {why or header['step']}")
            if slot.crc() != header["crc32"]:
                raise BadSnapshot(f"the snapshot of rank {self.rank} ({slot.path}) fails its CRC-32")
            if holder != self.rank:
                write_header(self.folder, header)  # a copy of its own again, for the next restart
            return header, slot.bytes
        finally:
            for w in sends:
                w.wait()

    def _said(self, event: str, **fields) -> None:
        if self.rank == 0:
            self.emit({"event": event, **fields})


# -- the wire: a header's length, the header, the payload -------------------------------------------


def _isend(payload: torch.Tensor | None, header: dict[str, Any] | None, to: int, pg) -> list:
    """Sizes, header, payload; sizes (0, 0) alone: this process cannot send it."""
    if header is None or payload is None:
        return [dist.isend(torch.zeros(2, dtype=torch.int64), to, group=pg)]
    body = torch.frombuffer(bytearray(header_bytes(header)), dtype=torch.uint8)
    return [
        dist.isend(torch.tensor([body.numel(), payload.numel()], dtype=torch.int64), to, group=pg),
        dist.isend(body, to, group=pg),
        dist.isend(payload, to, group=pg),
    ]


def _recv(frm: int, pg, slot_for: Callable[[dict[str, Any]], Slot]) -> tuple[dict[str, Any], Slot]:
    sizes = torch.zeros(2, dtype=torch.int64)
    dist.recv(sizes, frm, group=pg)
    n_header, n_payload = (int(x) for x in sizes)
    if n_header == 0:
        raise BadSnapshot(f"rank {frm} sent no snapshot (it could not read or commit it)")
    if not 0 < n_header <= MAX_HEADER_BYTES:
        raise BadSnapshot(f"rank {frm} announced a header of {n_header} bytes")
    body = torch.empty(n_header, dtype=torch.uint8)
    dist.recv(body, frm, group=pg)
    header = parse_header(body.numpy().tobytes(), f"the snapshot header from rank {frm}")
    if header["nbytes"] != n_payload:
        raise BadSnapshot(f"rank {frm} announced {n_payload} payload bytes, its header says {header['nbytes']}")
    slot = slot_for(header)
    dist.recv(slot.bytes, frm, group=pg)
    return header, slot
