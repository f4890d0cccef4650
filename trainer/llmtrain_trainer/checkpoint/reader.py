"""DCP checkpoint reads straight into the destination tensors (no per-record `torch.load`).

torch's `FileSystemReader.read_data` handles every tensor record of a `.distcp` file the same way:
`torch.load` of the record (a small zip: a pickle naming dtype/shape/strides, and the tensor's
storage stored uncompressed), then `narrow` to the part this rank needs and `copy_` into the
destination. That is ~0.5 ms of Python per record plus two copies of every byte (file → a
temporary tensor → the destination), and the disk idles while it runs.

`DirectFileReader` reads the same files — the format is unchanged, so every checkpoint written by
DCP's `FileSystemWriter` (before or after this module existed) loads — but for each tensor record
it only reads the record's head (a few hundred bytes: the zip's local headers and the pickle),
unpickles the tensor's metadata with a restricted unpickler (dtype, size, strides, storage offset:
never code), and then `preadv`s the bytes straight from the file into the destination tensor when
the stored part it needs is contiguous and the destination is a contiguous CPU tensor of the same
dtype (the common case: the same or another world size resharding along dim 0). Otherwise (a
strided source or destination, another dtype, a GPU destination) it reads the stored span into one
temporary tensor and `copy_`s the strided view, as DCP does. Tensor records it does not recognise
(compressed, transformed by a DCP extension, an unknown pickle) go through DCP's own reader, whose
`torch.load` is `weights_only=True`, so nothing it cannot read exactly is ever read differently.
`.metadata` and non-tensor records never reach DCP's unpickling (`pickle.load`,
`torch.load(weights_only=False)`): they are read through safety.py's allow-lists.

The reads of one rank are sorted by file offset and issued from a worker thread (`preadv`
releases the GIL), so a read is in flight while Python resolves the next destination; the kernel
reads ahead of it (the local reader's fadvise). One worker read faster than four: 1.6-2.0 vs
1.3-1.6 GB/s for two ranks on 2 cores (the reader alone, a 0.5 GB checkpoint, cold page cache): more
threads only add contention; on a many-core host with striped NVMe more could help.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import os
import pickle
import re
import struct
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan

from .safety import (
    UnsafeCheckpoint,
    load_metadata,
    load_record,
    trusted_record,
)

_ONE_PLAN = LoadPlan([])

# A record's zip local headers and pickle come first, its central directory last: a few hundred
# bytes each for a tensor record in practice.
HEAD_BYTES = TAIL_BYTES = 4096
READ_THREADS = 1
_LOCAL_HEADER = b"PK\x03\x04"

# The storage class names DCP's pickles reference (FloatStorage, BFloat16Storage, ...), from a torch
# internal. A torch without it must still start and resume: every record then goes through DCP's
# own reader (slower, same result). docs/trainer/checkpointing.md has the torch-upgrade checklist.
try:
    _STORAGE_DTYPES: dict[str, torch.dtype] | None = {
        name: dtype for dtype, name in torch.storage._dtype_to_storage_type_map().items()
    }
except (AttributeError, TypeError) as _err:
    _STORAGE_DTYPES = None
    warnings.warn(
        f"llmtrain checkpoint reader: torch {torch.__version__} lacks "
        f"torch.storage._dtype_to_storage_type_map ({_err}); checkpoints load through DCP's "
        "own FileSystemReader instead of the direct reader",
        RuntimeWarning,
        stacklevel=2,
    )
DIRECT_READS = _STORAGE_DTYPES is not None


class _NotPlain(Exception):
    """A record this reader does not read itself; DCP's reader handles it."""


@dataclasses.dataclass(frozen=True)
class _Stored:
    """Where a record's tensor lies in its file, and its layout over that storage."""

    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int  # storage offset, elements
    data_pos: int  # absolute file position of the storage's first byte
    data_len: int  # bytes of storage in the record


def _rebuild_tensor(storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None, metadata=None):
    if backward_hooks or metadata:
        raise _NotPlain("tensor with hooks or metadata")
    return _PickledTensor(storage, int(storage_offset), tuple(int(s) for s in size), tuple(int(s) for s in stride))


@dataclasses.dataclass(frozen=True)
class _PickledTensor:
    storage: tuple  # (dtype, key), from _MetaUnpickler.persistent_load
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


class _MetaUnpickler(pickle.Unpickler):
    """Reads a `torch.save`d plain tensor's pickle into (storage key, dtype, layout); refuses
    every global but the three a plain tensor uses, so it never runs code from the file."""

    def find_class(self, module, name):
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch":
            if name in _STORAGE_DTYPES:
                return _STORAGE_DTYPES[name]
            if isinstance(getattr(torch, name, None), torch.dtype):
                return getattr(torch, name)
        raise _NotPlain(f"global {module}.{name}")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], torch.dtype)):
            raise _NotPlain(f"persistent id {pid!r}")
        return (pid[1], str(pid[2]))


def _zip_entries(tail: bytes, length: int) -> dict[str, tuple[int, int]]:
    """name → (local header offset, data length) of a record's zip entries, from its central
    directory (in `tail`, the record's last bytes).

    `torch.save` writes the local headers with a trailing data descriptor (sizes 0 there), so the
    sizes and header offsets come from the central directory at the end of the record."""
    eocd = tail.rfind(b"PK\x05\x06")
    if eocd < 0 or eocd + 22 > len(tail):
        raise _NotPlain("no end-of-central-directory record in the record's tail")
    count, cd_size, cd_off = struct.unpack_from("<HII", tail, eocd + 10)
    if 0xFFFFFFFF in (cd_size, cd_off) or count == 0xFFFF:  # zip64: a storage over 4 GiB
        loc = eocd - 20
        if loc < 0 or tail[loc : loc + 4] != b"PK\x06\x07":
            raise _NotPlain("zip64 locator missing")
        z64 = struct.unpack_from("<Q", tail, loc + 8)[0] - (length - len(tail))
        if z64 < 0 or tail[z64 : z64 + 4] != b"PK\x06\x06":
            raise _NotPlain("zip64 end record outside the tail read")
        count, cd_size, cd_off = struct.unpack_from("<QQQ", tail, z64 + 32)
    pos = cd_off - (length - len(tail))
    if pos < 0:
        raise _NotPlain("central directory outside the tail read")
    entries = {}
    for _ in range(count):
        if tail[pos : pos + 4] != b"PK\x01\x02":
            raise _NotPlain("bad central directory entry")
        flags, method = struct.unpack_from("<HH", tail, pos + 8)
        csize, usize, nlen, xlen, clen = struct.unpack_from("<IIHHH", tail, pos + 20)
        local = struct.unpack_from("<I", tail, pos + 42)[0]
        name = tail[pos + 46 : pos + 46 + nlen].decode("utf-8", "replace")
        extra = tail[pos + 46 + nlen : pos + 46 + nlen + xlen]
        if method != 0 or flags & 0x1 or csize != usize:
            raise _NotPlain(f"compressed or encrypted zip entry {name!r}")
        if 0xFFFFFFFF in (usize, local):
            usize, local = _zip64_fields(extra, usize, local)
        entries[name] = (local, usize)
        pos += 46 + nlen + xlen + clen
    return entries


def _entry_data(head: bytes, entries: dict[str, tuple[int, int]], name: str) -> tuple[int, int]:
    """(data start, data length) of entry `name`: its local header (in `head`) says where its
    data starts (its extra field pads the data to torch's alignment)."""
    local, size = entries[name]
    if local + 30 > len(head) or head[local : local + 4] != _LOCAL_HEADER:
        raise _NotPlain(f"local header of {name!r} outside the head read")
    nlen, xlen = struct.unpack_from("<HH", head, local + 26)
    return local + 30 + nlen + xlen, size


def _zip64_fields(extra: bytes, usize: int, local: int) -> tuple[int, int]:
    """The zip64 extra field holds, in order, the sizes and offset that read 0xFFFFFFFF."""
    i = 0
    while i + 4 <= len(extra):
        hid, n = struct.unpack_from("<HH", extra, i)
        if hid == 0x0001:
            vals = list(struct.unpack_from(f"<{n // 8}Q", extra, i + 4))
            if usize == 0xFFFFFFFF:
                usize = vals.pop(0)
                vals.pop(0)  # compressed size (the same: stored)
            if local == 0xFFFFFFFF:
                local = vals.pop(0)
            return usize, local
        i += 4 + n
    raise _NotPlain("zip64 entry without its extra field")


def parse_record(head: bytes, tail: bytes, record_pos: int, length: int) -> _Stored:
    """The layout of the tensor in a `torch.save` record of `length` bytes at `record_pos` in its
    file, from its first (`head`) and last (`tail`) bytes. Raises _NotPlain for anything else."""
    entries = _zip_entries(tail, length)
    pkl_name = next((n for n in entries if n.rpartition("/")[2] == "data.pkl"), None)
    if pkl_name is None:
        raise _NotPlain("no data.pkl")
    prefix = pkl_name[: -len("data.pkl")]
    start, size = _entry_data(head, entries, pkl_name)
    if start + size > len(head):
        raise _NotPlain("pickle beyond the head read")
    try:
        t = _MetaUnpickler(io.BytesIO(head[start : start + size])).load()
    except (_NotPlain, pickle.UnpicklingError, ValueError, TypeError, EOFError) as err:
        raise _NotPlain(f"not a plain tensor pickle: {err}") from None
    if not isinstance(t, _PickledTensor):
        raise _NotPlain(f"the record holds a {type(t).__name__}, not a tensor")
    (dtype, key), offset, shape, stride = t.storage, t.offset, t.size, t.stride
    if f"{prefix}data/{key}" not in entries:
        raise _NotPlain("the tensor's storage is not in the record")
    if prefix + "byteorder" in entries:
        bstart, bsize = _entry_data(head, entries, prefix + "byteorder")
        if head[bstart : bstart + bsize] != b"little":
            raise _NotPlain("big-endian data")
    if sys.byteorder != "little":
        raise _NotPlain("big-endian host")
    data_start, data_len = _entry_data(head, entries, f"{prefix}data/{key}")
    return _Stored(dtype, shape, stride, offset, record_pos + data_start, data_len)


def _contiguous(size, stride) -> bool:
    expected = 1
    for n, s in zip(reversed(size), reversed(stride), strict=False):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


def _pread_into(fd: int, buf: memoryview, pos: int, path: str) -> None:
    done = 0
    while done < len(buf):
        n = os.preadv(fd, [buf[done:]], pos + done)
        if n <= 0:
            raise OSError(f"{path}: unexpected end of file at byte {pos + done} (the checkpoint is truncated?)")
        done += n


def _byte_view(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, writable."""
    return memoryview(t.reshape(-1).view(torch.uint8).numpy()).cast("B")


class DirectFileReader(FileSystemReader):
    """A `FileSystemReader` whose `read_data` reads plain tensor records without `torch.load`, and
    which reads `.metadata` and non-tensor records only through checkpoint_safety's allow-lists.

    `source` names the checkpoint in errors (the S3 reader's files are a local cache of it);
    `refused` keeps the first refusal, since DCP turns a failed metadata read into an
    AssertionError that only quotes it."""

    def __init__(self, path, source: str | None = None):
        super().__init__(path)
        self.source = str(source or path).rstrip("/")
        self.refused: UnsafeCheckpoint | None = None

    def _refuse(self, err: UnsafeCheckpoint) -> UnsafeCheckpoint:
        if self.refused is None:
            self.refused = err
        return err

    def read_metadata(self, *args, **kwargs):
        path = self._get_metadata_path(kwargs.get("rank"))
        with open(path, "rb") as f:
            data = f.read()
        try:
            metadata = load_metadata(data, f"{self.source}/{os.path.basename(path)}")
        except UnsafeCheckpoint as err:
            raise self._refuse(err) from None
        if getattr(metadata, "storage_meta", None) is None:  # as FileSystemReader.read_metadata
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def _record_name(self, req, info) -> str:
        return (
            f"{self.source}/{info.relative_path} (record {req.storage_index.fqn}, bytes "
            f"{info.offset}-{info.offset + info.length})"
        )

    def _read_record(self, req, info, planner) -> None:
        """A non-tensor record: decoded by `load_record`; the planner gets a re-encoding of the value."""
        with open(os.path.join(self.path, info.relative_path), "rb") as f:
            raw = os.pread(f.fileno(), info.length, info.offset)
        if len(raw) != info.length:
            raise OSError(f"{self._record_name(req, info)}: unexpected end of file (the checkpoint is truncated?)")
        if info.transform_descriptors:
            raw = self.transforms.transform_load_stream(req, info.transform_descriptors, io.BytesIO(raw)).read()
        try:
            value = load_record(raw, self._record_name(req, info))
        except UnsafeCheckpoint as err:
            raise self._refuse(err) from None
        planner.load_bytes(req, trusted_record(value))

    def _read_with_torch(self, reqs, planner) -> None:
        """Tensor records this reader does not read itself: DCP's reader, whose `torch.load` is
        `weights_only=True` (torch's allow-list); its refusal is a refusal here too."""
        for req in reqs:
            try:
                super().read_data(dataclasses.replace(_ONE_PLAN, items=[req]), planner).wait()
            except pickle.UnpicklingError as err:
                found = re.search(r"Unsupported global: GLOBAL (\S+)", str(err))
                what = f"global {found.group(1)}" if found else "a pickle torch's weights-only loader refuses"
                raise self._refuse(
                    UnsafeCheckpoint(self._record_name(req, self.storage_data[req.storage_index]), what)
                ) from None

    def read_data(self, plan, planner):
        if not DIRECT_READS:  # this torch lacks what the direct reads rely on (see above)
            return super().read_data(plan, planner)
        items, fallback = [], []
        for req in plan.items:
            info = self.storage_data[req.storage_index]
            if req.type == LoadItemType.BYTE_IO:
                self._read_record(req, info, planner)
            elif info.transform_descriptors:
                fallback.append(req)
            else:
                items.append((info.relative_path, info.offset, req, info))
        items.sort(key=lambda x: (x[0], x[1]))
        fds: dict[str, int] = {}
        try:
            for rel in {x[0] for x in items}:
                fds[rel] = os.open(os.path.join(self.path, rel), os.O_RDONLY)
            fallback += self._read_tensors(items, fds, planner)
        finally:
            for fd in fds.values():
                os.close(fd)
        if fallback:
            self._read_with_torch(fallback, planner)
        fut = torch.futures.Future()
        fut.set_result(None)
        return fut

    def _read_tensors(self, items, fds, planner) -> list:
        """Reads every item it can (in file order, reads in flight on a few threads); returns the rest."""
        rest: list = []
        pending: collections.deque = collections.deque()
        with ThreadPoolExecutor(READ_THREADS, thread_name_prefix="ckpt-read") as pool:
            for rel, _, req, info in items:
                path = os.path.join(self.path, rel)
                fd = fds[rel]
                try:
                    head = os.pread(fd, min(HEAD_BYTES, info.length), info.offset)
                    tail_len = min(TAIL_BYTES, info.length)
                    tail = os.pread(fd, tail_len, info.offset + info.length - tail_len)
                    stored = parse_record(head, tail, info.offset, info.length)
                    job = self._plan_read(stored, req, planner, fd, path, info)
                except _NotPlain:
                    rest.append(req)
                    continue
                pending.append((pool.submit(job), req))
                while len(pending) > 2 * READ_THREADS:  # bounded: temporaries of strided reads wait here
                    self._commit(pending.popleft(), planner)
            while pending:
                self._commit(pending.popleft(), planner)
        return rest

    @staticmethod
    def _commit(entry, planner) -> None:
        fut, req = entry
        target = fut.result()
        planner.commit_tensor(req, target)

    @staticmethod
    def _plan_read(stored: _Stored, req, planner, fd: int, path: str, info):
        """A function that reads `req`'s part of `stored` into its destination and returns it."""
        if len(req.storage_offsets) != len(stored.size):
            raise _NotPlain("rank mismatch")
        offset = stored.offset + sum(o * s for o, s in zip(req.storage_offsets, stored.stride, strict=True))
        size, stride = tuple(req.lengths), stored.stride
        itemsize = stored.dtype.itemsize
        numel = 1
        for n in size:
            numel *= n
        extent = 1 + sum((n - 1) * s for n, s in zip(size, stride, strict=False)) if numel else 0
        beyond_record = stored.data_pos + stored.data_len > info.offset + info.length
        if (offset + extent) * itemsize > stored.data_len or beyond_record:
            raise _NotPlain("tensor beyond its storage")
        target = planner.resolve_tensor(req).detach()
        if tuple(target.size()) != size:
            raise AssertionError(f"req {req.storage_index} mismatch sizes {tuple(target.size())} vs {size}")
        pos = stored.data_pos + offset * itemsize

        if (
            target.device.type == "cpu"
            and target.dtype == stored.dtype
            and target.is_contiguous()
            and _contiguous(size, stride)
        ):

            def direct():
                if numel:
                    _pread_into(fd, _byte_view(target), pos, path)
                return target

            return direct

        def via_temporary():
            tmp = torch.empty(extent, dtype=stored.dtype)
            if numel:
                _pread_into(fd, _byte_view(tmp), pos, path)
            target.copy_(tmp.as_strided(size, stride, 0))
            return target

        return via_temporary
