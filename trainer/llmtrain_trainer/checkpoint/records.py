"""The format of one tensor record in a DCP `.distcp` file, read without running it: the record is
a small zip (`torch.save`'s) holding a pickle that names the tensor's dtype, size, strides and
storage, and the storage's bytes stored uncompressed. `parse_record` finds where those bytes lie
from the record's head and tail alone, through a restricted unpickler (three globals a plain tensor
uses; never code); anything else is `_NotPlain` and goes to torch's weights-only loader.

Shared by the direct reader (reader.py) and the checkpoint check (safety.py), which is why it is a
module of its own: the reader uses safety's allow-lists, and safety's check reads records.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import pickle
import struct
import sys
import warnings

import torch

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
