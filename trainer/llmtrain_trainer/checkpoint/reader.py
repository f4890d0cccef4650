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
from concurrent.futures import ThreadPoolExecutor

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan

from .records import DIRECT_READS, _NotPlain, _Stored, parse_record
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
