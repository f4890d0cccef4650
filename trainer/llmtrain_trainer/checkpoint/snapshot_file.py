"""One rank's in-memory snapshot on disk (a tmpfs: the pod's /dev/shm): its layout, and the checks
every snapshot passes before a byte of it is loaded.

Rank R's snapshots are kept in two slots of the snapshot folder, each two files:

    rank-R.slot-X       the payload: the rank's local tensors (its shard of every model parameter and
                        optimizer state, its RNG state), each at a 64-byte aligned offset, raw bytes
    rank-R.slot-X.json  the slot's header, written last (a rename): its step, whose it is (job,
                        attempt, rendezvous run, world size, rank), the data position, the payload's
                        size and CRC-32, and the manifest (each tensor's state-dict path, dtype,
                        shape and offset)

A snapshot goes into the slot holding the older step, whose header is removed first, and is
committed by its header's rename: the newer committed snapshot is never the one being written, and
a process killed at any point leaves every header it did not remove pointing at a whole payload.
Both committed steps stay listed, so that when a rank's newest snapshot has not reached its partner
yet, the step before it can still be restored everywhere.

Nothing here unpickles. The header is JSON of bounded size, every field type-checked; dtypes come
from an allow-list; every tensor must lie inside the payload; and the payload's CRC-32 must match
before it is loaded. A snapshot whose identity differs from the reader's (another job, attempt,
rendezvous run or world size) is never loaded (`Identity.matches`).
"""

from __future__ import annotations

import json
import mmap
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

FORMAT = "llmtrain-snapshot/1"
ALIGN = 64
MAX_HEADER_BYTES = 16 << 20
MAX_TENSORS = 1_000_000
MAX_DIMS = 8
MAX_PATH_PARTS = 16
MAX_PART_CHARS = 1000
CRC_CHUNK = 64 << 20  # zlib releases the GIL per call: chunks keep the training thread running
SLOTS = ("a", "b")
HEADER_RE = re.compile(r"^rank-(\d{1,7})\.slot-([ab])\.json$")

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_NAMES = {v: k for k, v in DTYPES.items()}


class BadSnapshot(ValueError):
    """A snapshot that must not be loaded: what is wrong, and which file."""


@dataclass(frozen=True)
class Identity:
    """Whose snapshots a process may load: its job, attempt, rendezvous run and world size."""

    job: str
    attempt: int
    run: str
    world_size: int

    def as_dict(self) -> dict[str, Any]:
        return {"job": self.job, "attempt": self.attempt, "run": self.run, "world_size": self.world_size}

    def mismatch(self, header: dict[str, Any]) -> str | None:
        """None when `header` is this identity's; else which field differs."""
        for key, mine in self.as_dict().items():
            if header.get(key) != mine:
                return f"{key} {header.get(key)!r} is not this process's {mine!r}"
        return None


# -- the state as a flat list of tensors ----------------------------------------------------------


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)  # a DTensor: this rank's shard
    return to_local() if to_local is not None else t


def flatten(state: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], torch.Tensor]]:
    """Every tensor leaf of a nested state dict with its path, DTensors as their local shards, in the
    dict's order (the same on every process of one program). Non-tensor leaves (the optimizer's
    param_groups: hyperparameters from the spec) are not part of a snapshot."""
    out: list[tuple[tuple[str, ...], torch.Tensor]] = []
    for key, value in state.items():
        path = (*prefix, str(key))
        if isinstance(value, torch.Tensor):
            out.append((path, _local(value)))
        elif isinstance(value, dict):
            out.extend(flatten(value, path))
    return out


@dataclass(frozen=True)
class Entry:
    path: tuple[str, ...]
    dtype: str
    shape: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        n = DTYPES[self.dtype].itemsize
        for d in self.shape:
            n *= d
        return n


def layout(tensors: list[tuple[tuple[str, ...], torch.Tensor]]) -> tuple[list[Entry], int]:
    """Each tensor's place in the payload (64-byte aligned), and the payload's size."""
    entries, offset = [], 0
    for path, t in tensors:
        if t.dtype not in _NAMES:
            raise TypeError(f"snapshot of {'/'.join(path)}: dtype {t.dtype} is not one a snapshot holds")
        e = Entry(path, _NAMES[t.dtype], tuple(t.shape), offset)
        entries.append(e)
        offset += -(-e.nbytes // ALIGN) * ALIGN
    return entries, offset


# -- slots: the payload files, mapped once and reused ----------------------------------------------


class Slot:
    """One payload file, memory-mapped for the life of the process (its pages stay faulted in)."""

    def __init__(self, path: Path, nbytes: int):
        self.path, self.nbytes = path, nbytes
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, max(nbytes, 1))
            self.map = mmap.mmap(fd, max(nbytes, 1))
        finally:
            os.close(fd)
        self.bytes = torch.frombuffer(self.map, dtype=torch.uint8)[:nbytes]

    def view(self, e: Entry) -> torch.Tensor:
        return self.bytes[e.offset : e.offset + e.nbytes].view(DTYPES[e.dtype]).view(e.shape)

    def crc(self) -> int:
        return crc32(memoryview(self.map)[: self.nbytes])

    def close(self) -> None:
        del self.bytes
        try:
            self.map.close()
        except BufferError:  # a view still alive elsewhere: the mapping goes with it
            pass


def crc32(buf) -> int:
    mv = memoryview(buf).cast("B")
    crc = 0
    for i in range(0, len(mv), CRC_CHUNK):
        crc = zlib.crc32(mv[i : i + CRC_CHUNK], crc)
    return crc


def copy_into(slot: Slot, entries: list[Entry], tensors: list[tuple[tuple[str, ...], torch.Tensor]]) -> None:
    """The snapshot's blocking part: every local tensor copied into the slot."""
    for e, (_, t) in zip(entries, tensors, strict=True):
        slot.view(e).copy_(t)


# -- headers ---------------------------------------------------------------------------------------


def header_path(folder: Path, rank: int, slot: str) -> Path:
    return folder / f"rank-{rank}.slot-{slot}.json"


def slot_path(folder: Path, rank: int, slot: str) -> Path:
    return folder / f"rank-{rank}.slot-{slot}"


def make_header(
    identity: Identity,
    rank: int,
    step: int,
    data: dict[str, int],
    slot: str,
    entries: list[Entry],
    nbytes: int,
    crc: int,
) -> dict[str, Any]:
    return {
        "format": FORMAT,
        **identity.as_dict(),
        "rank": rank,
        "step": step,
        "data": data,
        "slot": slot,
        "nbytes": nbytes,
        "crc32": crc,
        "tensors": [
            {"path": list(e.path), "dtype": e.dtype, "shape": list(e.shape), "offset": e.offset} for e in entries
        ],
    }


def header_bytes(header: dict[str, Any]) -> bytes:
    """A header as its file holds it and as it is sent to a partner (without parse_header's entries)."""
    return json.dumps({k: v for k, v in header.items() if k != "entries"}, separators=(",", ":")).encode()


def write_header(folder: Path, header: dict[str, Any]) -> None:
    """Commit: the header replaces the previous one atomically (a rename on the same filesystem)."""
    final = header_path(folder, header["rank"], header["slot"])
    tmp = final.with_suffix(".json.tmp")
    tmp.write_bytes(header_bytes(header))
    os.replace(tmp, final)


def _int(h: dict, key: str, lo: int = 0, hi: int = 1 << 62) -> int:
    v = h.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise BadSnapshot(f"header field {key!r} is {v!r}, not an integer in [{lo}, {hi}]")
    return v


def parse_header(raw: bytes, where: str) -> dict[str, Any]:
    """A header's JSON, every field checked; the manifest as `Entry`s under "entries"."""
    if len(raw) > MAX_HEADER_BYTES:
        raise BadSnapshot(f"{where}: header of {len(raw)} bytes (at most {MAX_HEADER_BYTES})")
    try:
        h = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise BadSnapshot(f"{where}: header is not JSON: {err}") from None
    try:
        if not isinstance(h, dict) or h.get("format") != FORMAT:
            raise BadSnapshot(f"format is not {FORMAT!r}")
        for key in ("attempt", "world_size", "rank", "step", "nbytes", "crc32"):
            _int(h, key)
        if not isinstance(h.get("job"), str) or not isinstance(h.get("run"), str) or h.get("slot") not in SLOTS:
            raise BadSnapshot("job, run or slot is missing or malformed")
        data = h.get("data")
        if (
            not isinstance(data, dict)
            or len(data) > 16
            or not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in data.items())
        ):
            raise BadSnapshot("data is not a small map of integers")
        h["entries"] = _entries(h.get("tensors"), h["nbytes"])
    except BadSnapshot as err:
        raise BadSnapshot(f"{where}: {err}") from None
    return h


def _entries(raw: Any, nbytes: int) -> list[Entry]:
    if not isinstance(raw, list) or len(raw) > MAX_TENSORS:
        raise BadSnapshot("tensors is not a list of at most {MAX_TENSORS}")
    out = []
    for t in raw:
        if not isinstance(t, dict) or t.get("dtype") not in DTYPES:
            raise BadSnapshot(f"tensor entry {str(t)[:200]} has no allowed dtype ({', '.join(DTYPES)})")
        path, shape = t.get("path"), t.get("shape")
        if not (isinstance(path, list) and 0 < len(path) <= MAX_PATH_PARTS) or not all(
            isinstance(p, str) and len(p) <= MAX_PART_CHARS for p in path
        ):
            raise BadSnapshot(f"tensor path {str(path)[:200]} is malformed")
        if not (isinstance(shape, list) and len(shape) <= MAX_DIMS) or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 40 for d in shape
        ):
            raise BadSnapshot(f"tensor {'/'.join(path)}: shape {str(shape)[:200]} is malformed")
        e = Entry(tuple(path), t["dtype"], tuple(shape), _int(t, "offset"))
        if e.offset % ALIGN or e.offset + e.nbytes > nbytes:
            raise BadSnapshot(f"tensor {'/'.join(path)} lies outside the {nbytes}-byte payload")
        out.append(e)
    return out


def read_header(folder: Path, rank: int, slot: str) -> dict[str, Any]:
    p = header_path(folder, rank, slot)
    with open(p, "rb") as f:
        raw = f.read(MAX_HEADER_BYTES + 1)
    h = parse_header(raw, str(p))
    if h["rank"] != rank or h["slot"] != slot:
        raise BadSnapshot(f"{p}: the header is of rank {h['rank']} slot {h['slot']}")
    return h


def held_slots(folder: Path) -> list[tuple[int, str]]:
    """(rank, slot) of the committed snapshots this folder holds (headers present; not yet checked)."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return sorted((int(m.group(1)), m.group(2)) for n in names if (m := HEADER_RE.match(n)))


def load_into(
    payload: torch.Tensor, header: dict[str, Any], tensors: list[tuple[tuple[str, ...], torch.Tensor]]
) -> None:
    """Copy a checked payload (uint8) into `tensors` (the fresh state's local shards): the manifest must
    name exactly these tensors with these dtypes and shapes, or nothing is copied."""
    entries = {e.path: e for e in header["entries"]}
    if len(entries) != len(tensors) or any(p not in entries for p, _ in tensors):
        missing = sorted("/".join(p) for p, _ in tensors if p not in entries)[:3]
        raise BadSnapshot(
            f"the snapshot of rank {header['rank']} holds other tensors than this model (missing {missing})"
        )
    for path, t in tensors:
        e = entries[path]
        if DTYPES[e.dtype] != t.dtype or e.shape != tuple(t.shape):
            raise BadSnapshot(
                f"the snapshot of rank {header['rank']}: {'/'.join(path)} is {e.dtype}{list(e.shape)}, "
                f"this model's is {_NAMES.get(t.dtype, t.dtype)}{list(t.shape)}"
            )
    for path, t in tensors:
        e = entries[path]
        t.copy_(payload[e.offset : e.offset + e.nbytes].view(DTYPES[e.dtype]).view(e.shape))
