"""What a checkpoint may contain, and the only unpicklers that read one.

A checkpoint is input from whoever can write its location (any job or person with write access to
the prefix), and loading a pickle runs whatever functions it names. DCP itself reads `.metadata`
with `pickle.load` and non-tensor records with `torch.load(weights_only=False)`; the trainer's
reader (reader.py) replaces both, for automatic resume and for `llmtrain export`:

- `.metadata` may name only DCP's own metadata dataclasses, `torch.Size`, torch dtypes and
  layouts, the memory-format enum, and a path (`StorageMeta.checkpoint_id`): `METADATA_GLOBALS`.
  Every record it lists must lie in a shard file of the checkpoint itself (`__<rank>_<n>.distcp`,
  no directories), since the reader opens that name and, for S3, writes its download there.
- A non-tensor record (step, world size, data position, the optimizer's param_groups) is the
  `torch.save` of plain values: numbers, strings, None, bools, lists, tuples, dicts. It may name no
  global at all and hold no tensor storage, and its zip entry must be stored, not compressed.
- Tensor records are read by checkpoint_reader's own three-global unpickler, or (records it does
  not read itself) by torch's `weights_only=True` loader.

Anything else is refused with `UnsafeCheckpoint`, which names the file and what was refused, and
the load stops there: nothing falls back to an unrestricted unpickler, and a resume does not skip
to an older checkpoint (a checkpoint llmtrain cannot have written means someone wrote into the
location; see docs/trainer/checkpoint-safety.md).

The allow-lists hold only callables that build data (dataclass constructors, `torch.Size`, an enum
lookup, `pathlib.PosixPath`, `torch.serialization._get_layout`'s dict lookup), looked up by exact
(module, name): a pickle can reach nothing else, not even an attribute of an allowed object.
"""

from __future__ import annotations

import io
import pathlib
import pickle
import re
import zipfile
from typing import Any

import torch
from torch.distributed.checkpoint import metadata as _md
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo

DOCS = "docs/trainer/checkpoint-safety.md"

# DCP's writer names every shard file `__<rank>_<n>.distcp` (FileSystemWriter: prefix `__<rank>_`).
SHARD_FILE = re.compile(r"^__\d+_\d+\.distcp$")

METADATA_GLOBALS: dict[tuple[str, str], Any] = {
    **{
        ("torch.distributed.checkpoint.metadata", c.__name__): c
        for c in (
            _md.Metadata,
            _md.StorageMeta,
            _md.MetadataIndex,
            _md.TensorStorageMetadata,
            _md.BytesStorageMetadata,
            _md.ChunkStorageMetadata,
            _md.TensorProperties,
            _md._MEM_FORMAT_ENCODING,
        )
    },
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): _StorageInfo,
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,
    ("pathlib", "PosixPath"): pathlib.PosixPath,
    **{("torch", name): v for name, v in vars(torch).items() if isinstance(v, torch.dtype)},
}
RECORD_GLOBALS: dict[tuple[str, str], Any] = {}


class UnsafeCheckpoint(ValueError):
    """A checkpoint file holds something llmtrain never writes there; it was not loaded."""

    def __init__(self, where: str, what: str):
        self.where, self.what = where, what
        super().__init__(
            f"{where}: refused {what}: not something llmtrain writes into a checkpoint, so the "
            f"checkpoint is not loaded (nothing in it was run). If you did not write it, someone "
            f"else wrote into this location; see {DOCS}"
        )

    def __reduce__(self):  # DCP gathers every rank's failure to every rank as a pickle
        return UnsafeCheckpoint, (self.where, self.what)


class _AllowListUnpickler(pickle.Unpickler):
    def __init__(self, file, allowed: dict, where: str):
        super().__init__(file)
        self._allowed, self._where = allowed, where

    def find_class(self, module, name):
        try:
            return self._allowed[(module, name)]
        except (KeyError, TypeError):
            raise UnsafeCheckpoint(self._where, f"global {module}.{name}") from None

    def persistent_load(self, pid):
        raise UnsafeCheckpoint(self._where, "a tensor storage (persistent id) in a non-tensor record")


def load_metadata(data: bytes, where: str) -> _md.Metadata:
    """DCP's `.metadata` (the bytes of the file `where`), unpickled with `METADATA_GLOBALS` only, and
    checked to list records in this checkpoint's own shard files."""
    md = _AllowListUnpickler(io.BytesIO(data), METADATA_GLOBALS, where).load()
    if not isinstance(md, _md.Metadata):
        raise UnsafeCheckpoint(where, f"a {type(md).__name__} where DCP's Metadata belongs")
    if not isinstance(md.storage_data, dict):
        raise UnsafeCheckpoint(where, "storage_data that is not a dict")
    for index, info in md.storage_data.items():
        if not isinstance(info, _StorageInfo):
            raise UnsafeCheckpoint(where, f"a {type(info).__name__} as the storage of {getattr(index, 'fqn', index)!r}")
        rel = info.relative_path
        if not (isinstance(rel, str) and SHARD_FILE.match(rel)):
            raise UnsafeCheckpoint(
                where,
                f"record file {rel!r} (of {getattr(index, 'fqn', index)!r}): records "
                "must lie in the checkpoint's own __<rank>_<n>.distcp files",
            )
        if not all(type(v) is int and v >= 0 for v in (info.offset, info.length)):
            raise UnsafeCheckpoint(where, f"offset/length {info.offset!r}/{info.length!r} of a record in {rel}")
    return md


def load_record(data: bytes, where: str) -> Any:
    """A non-tensor record (the `torch.save` zip of a plain value) → the value; `RECORD_GLOBALS`
    only (none), no tensor storages, no compressed entries."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        infos = [i for i in zf.infolist() if i.filename.rpartition("/")[2] == "data.pkl"]
    except (zipfile.BadZipFile, ValueError) as err:
        raise ValueError(f"{where}: not a torch.save record: {err}") from None
    if len(infos) != 1:
        raise ValueError(f"{where}: not a torch.save record: {len(infos)} data.pkl entries")
    if any(i.compress_type != zipfile.ZIP_STORED for i in zf.infolist()):
        raise UnsafeCheckpoint(where, "a compressed zip entry (torch.save stores, never compresses)")
    if infos[0].file_size > len(data):
        raise ValueError(f"{where}: record pickle larger than the record")
    return _AllowListUnpickler(io.BytesIO(zf.read(infos[0])), RECORD_GLOBALS, where).load()


def trusted_record(value: Any) -> io.BytesIO:
    """`value` (a plain value from `load_record`) as the `torch.save` bytes a DCP planner takes:
    what any planner then unpickles was written here, not read from the checkpoint."""
    buf = io.BytesIO()
    torch.save(value, buf)
    buf.seek(0)
    return buf


class RecordLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, but a non-tensor record is decoded by `load_record`, never by
    `torch.load(weights_only=False)`: the last unrestricted unpickler on a load path."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        obj = load_record(value.getvalue(), f"record {read_item.dest_index.fqn}")
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def refusal(err: BaseException) -> UnsafeCheckpoint | None:
    """The `UnsafeCheckpoint` behind a (possibly DCP-wrapped, multi-rank) load failure, if any."""
    seen: set[int] = set()
    todo: list[Any] = [err]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, UnsafeCheckpoint):
            return e
        if isinstance(e, tuple):  # DCP's failures: rank → (exception, traceback)
            todo.extend(x for x in e if isinstance(x, BaseException))
            continue
        if not isinstance(e, BaseException):
            continue
        failures = getattr(e, "failures", None) or getattr(e, "_failures", None)
        if isinstance(failures, dict):
            todo.extend(failures.values())
        todo.extend([e.__cause__, e.__context__])
    return None


def check_directory(path: str) -> dict[str, int]:
    """Read a local checkpoint step directory the way a resume does, record by record, without
    loading it into a model: raises UnsafeCheckpoint at the first refusal (ValueError/OSError for a
    damaged one); returns how many records of each kind it holds."""
    import os

    from .records import _NotPlain, parse_record

    where = os.path.join(path, ".metadata")
    with open(where, "rb") as f:
        md = load_metadata(f.read(), where)
    counts = {"tensor records": 0, "value records": 0, "tensor records read by torch's weights-only loader": 0}
    for index, info in md.storage_data.items():
        name = f"{os.path.join(path, info.relative_path)} (record {index.fqn})"
        with open(os.path.join(path, info.relative_path), "rb") as f:
            f.seek(info.offset)
            raw = f.read(info.length)
        if len(raw) != info.length:
            raise OSError(f"{name}: the file ends before the record does (truncated?)")
        if isinstance(md.state_dict_metadata.get(index.fqn), _md.BytesStorageMetadata):
            load_record(raw, name)
            counts["value records"] += 1
            continue
        try:
            parse_record(raw, raw[-4096:], 0, len(raw))
            counts["tensor records"] += 1
        except _NotPlain:
            try:
                torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
            except pickle.UnpicklingError as err:
                found = re.search(r"Unsupported global: GLOBAL (\S+)", str(err))
                raise UnsafeCheckpoint(
                    name, f"global {found.group(1)}" if found else "a pickle torch's weights-only loader refuses"
                ) from None
            counts["tensor records read by torch's weights-only loader"] += 1
    return counts


def main(argv: list[str] | None = None) -> int:
    """`python -m llmtrain_trainer.checkpoint.safety DIR...`: check checkpoints you received before
    resuming from or exporting them. DIR is a step directory (with .metadata) or a checkpoint root."""
    import glob
    import os
    import sys

    dirs = []
    for d in sys.argv[1:] if argv is None else argv:
        dirs += [d] if os.path.exists(os.path.join(d, ".metadata")) else sorted(glob.glob(os.path.join(d, "step-*")))
    if not dirs:
        print(
            "usage: python -m llmtrain_trainer.checkpoint.safety CHECKPOINT_DIR... (a step-N directory "
            "or the directory holding them)",
            file=sys.stderr,
        )
        return 2
    bad = 0
    for d in dirs:
        try:
            counts = check_directory(d)
        except (ValueError, OSError) as err:
            print(f"REFUSED {d}: {err}")
            bad += 1
            continue
        print(f"ok {d}: " + ", ".join(f"{n} {k}" for k, n in counts.items() if n))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
