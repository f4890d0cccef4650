"""A local directory as a `Storage`: a node's disk, an FSx for Lustre or other PVC mount."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator

from .base import Entry, NotFound, ShortRead, Storage, StorageError, bounded


@contextlib.contextmanager
def _errors(url: str, op: str) -> Iterator[None]:
    """The OS's own error when it names the file (`FileNotFoundError: [Errno 2] No such file or
    directory: '/fsx/data/index.json'`, as users and tools know it); otherwise (a write, fsync or
    pread failing: EFBIG, ENOSPC, EIO) a StorageError naming `url` and `op`."""
    try:
        yield
    except StorageError:
        raise
    except OSError as err:
        if err.filename is not None:
            raise
        cls = NotFound if err.errno == errno.ENOENT else StorageError
        raise cls(url, op, err.strerror or str(err), errno=err.errno) from err


def fsync_dir(path: str) -> None:
    """Make a rename or a new entry in directory `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalStorage(Storage):
    """Files under `root`. Ranged reads use pread on descriptors kept open per file (no shared file
    offset: safe from the data loader's reader threads)."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self.uri = self.root
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()

    def path(self, name: str) -> str:
        return os.path.join(self.root, name) if name else self.root

    def url(self, name: str) -> str:
        return self.path(name)

    def _fd(self, name: str) -> int:
        with self._lock:
            fd = self._fds.get(name)
            if fd is None:
                fd = self._fds[name] = os.open(self.path(name), os.O_RDONLY)
            return fd

    def read_range(self, name: str, offset: int, length: int) -> bytes:
        op = f"read bytes {offset}-{offset + length - 1}"
        with _errors(self.url(name), op):
            fd = self._fd(name)
            out = bytearray()
            while len(out) < length:
                chunk = os.pread(fd, length - len(out), offset + len(out))
                if not chunk:
                    raise ShortRead(self.url(name), op, f"the file ends at byte {offset + len(out)}")
                out += chunk
        return bytes(out)

    def read(self, name: str, limit: int | None = None) -> bytes:
        with _errors(self.url(name), "read"), open(self.path(name), "rb") as f:
            data = f.read() if limit is None else f.read(limit + 1)
        return bounded(data, limit, self.url(name))

    def size(self, name: str) -> int:
        with _errors(self.url(name), "size"):
            return os.stat(self.path(name)).st_size

    def list(self, prefix: str = "") -> list[Entry]:
        top = self.path(prefix.rpartition("/")[0])
        out = []
        with _errors(top, "list"):
            if not os.path.isdir(top):
                return []
            for d, _, files in os.walk(top):
                for f in files:
                    p = os.path.join(d, f)
                    name = os.path.relpath(p, self.root).replace(os.sep, "/")
                    if name.startswith(prefix) and os.path.isfile(p):
                        out.append(Entry(name, os.path.getsize(p)))
        return sorted(out, key=lambda e: e.name)

    def open(self, name: str, *, size: int | None = None, buffer_size: int = io.DEFAULT_BUFFER_SIZE):
        with _errors(self.url(name), "open"):
            return open(self.path(name), "rb", buffering=buffer_size)

    def _atomic(self, name: str, op: str, fill: Callable[[io.BufferedWriter], object]) -> None:
        """A temporary file beside `name`, filled, fsynced, then renamed over it (and the directory
        fsynced): `name` is the old file or the whole new one, whatever fails when."""
        path = self.path(name)
        with _errors(path, op):
            parent = os.path.dirname(path)
            os.makedirs(parent, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{os.path.basename(path)}.tmp-")
            try:
                with os.fdopen(fd, "wb") as f:
                    fill(f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            fsync_dir(parent)

    def write(self, name: str, data: bytes) -> None:
        self._atomic(name, "write", lambda f: f.write(data))

    def upload(self, path: str, name: str) -> None:
        def fill(f) -> None:
            with _errors(path, "read"), open(path, "rb") as src:
                shutil.copyfileobj(src, f, 8 << 20)

        self._atomic(name, f"write (from {path})", fill)

    def download(self, name: str, path: str) -> None:
        with _errors(self.url(name), f"copy to {path}"):
            shutil.copyfile(self.path(name), path)

    def delete(self, names: Iterable[str]) -> None:
        for name in names:
            with _errors(self.url(name), "delete"), contextlib.suppress(FileNotFoundError):
                os.unlink(self.path(name))

    def copy(self, src: str, dest: str) -> None:
        self.upload(self.path(src), dest)

    # Directories: what a local checkpoint is (DCP's file writer fills one; a rename commits it).

    def rename(self, src: str, dest: str) -> None:
        """Move `src` (a file or directory) to `dest`, atomically (POSIX rename), durably."""
        with _errors(self.url(src), f"rename to {self.path(dest)}"):
            os.rename(self.path(src), self.path(dest))
            for d in {os.path.dirname(self.path(dest)), os.path.dirname(self.path(src))}:
                fsync_dir(d)

    def remove_tree(self, name: str) -> None:
        """Remove the directory `name` and everything in it (missing: nothing to do)."""
        shutil.rmtree(self.path(name), ignore_errors=True)

    def close(self) -> None:
        with self._lock:
            fds, self._fds = list(self._fds.values()), {}
        for fd in fds:
            os.close(fd)
