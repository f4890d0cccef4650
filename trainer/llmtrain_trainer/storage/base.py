"""What every storage backend offers (`Storage`), and the errors it raises."""

from __future__ import annotations

import io
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass


class StorageError(OSError):
    """A storage operation failed. `url`: the object (a path or an s3:// URI); `op`: what was asked
    (`read bytes 0-99`, `write`, `list`, ...); `why`: the cause, as the backend said it."""

    def __init__(self, url: str, op: str, why: str, *, errno: int | None = None):
        super().__init__(f"{url}: {op}: {why}")
        self.url, self.op, self.why = url, op, why
        if errno is not None:
            self.errno = errno


class NotFound(StorageError, FileNotFoundError):
    """No such object (S3), or a local file whose error did not name it."""


class ShortRead(StorageError, EOFError):
    """Fewer bytes than asked for: the object is shorter than its reader expected (truncated)."""


@dataclass(frozen=True)
class Entry:
    name: str  # relative to the storage's root, "/"-separated
    size: int  # bytes


class Storage(ABC):
    """A directory or S3 prefix of objects, by names relative to it (see the package docstring)."""

    uri: str  # the root, as messages show it (a path, or s3://bucket/prefix/)

    def __str__(self) -> str:
        return self.uri

    @abstractmethod
    def url(self, name: str) -> str:
        """The object `name` as a path or s3:// URI (for messages and for other tools)."""

    @abstractmethod
    def read_range(self, name: str, offset: int, length: int) -> bytes:
        """Exactly bytes [offset, offset + length) of `name` (ShortRead if it ends before)."""

    @abstractmethod
    def read(self, name: str, limit: int | None = None) -> bytes:
        """The whole object; larger than `limit` bytes: ValueError (it is input, never read past that)."""

    @abstractmethod
    def size(self, name: str) -> int:
        """Bytes of `name` (a FileNotFoundError if there is none)."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[Entry]:
        """Every object whose name starts with `prefix` (a directory: end it with "/"), by name."""

    @abstractmethod
    def open(self, name: str, *, size: int | None = None, buffer_size: int = io.DEFAULT_BUFFER_SIZE):
        """A read-only, seekable binary file over `name`. `size`: as listed (saves a request); S3
        reads by ranges up to it, so an object that shrank since raises ShortRead, while a local file
        is read as it is."""

    @abstractmethod
    def write(self, name: str, data: bytes) -> None:
        """Create or replace `name` with `data`, atomically."""

    @abstractmethod
    def upload(self, path: str, name: str) -> None:
        """Create or replace `name` with the local file `path`, atomically."""

    @abstractmethod
    def download(self, name: str, path: str) -> None:
        """Copy `name` into the local file `path`."""

    @abstractmethod
    def delete(self, names: Iterable[str]) -> None:
        """Remove these objects, in order (a missing one is not an error)."""

    @abstractmethod
    def copy(self, src: str, dest: str) -> None:
        """Copy the object `src` to `dest` (S3: server-side)."""

    def exists(self, name: str) -> bool:
        try:
            self.size(name)
        except FileNotFoundError:
            return False
        return True

    def read_text(self, name: str, limit: int | None = None) -> str:
        return self.read(name, limit).decode()

    def check_writable(self) -> None:
        """Write and remove a probe object now (StorageError if that fails): a location that cannot
        be written is better found at start-up than at the first save an hour in."""
        probe = f".write-test-{os.getpid()}"
        self.write(probe, b"llmtrain")
        self.delete([probe])

    def close(self) -> None:  # noqa: B027 - most backends hold nothing to release
        """Release what reads keep open (file descriptors)."""


def bounded(data: bytes, limit: int | None, url: str) -> bytes:
    """`data`, read with at most limit + 1 bytes, unless that shows the object exceeds `limit`."""
    if limit is not None and len(data) > limit:
        raise ValueError(f"{url}: larger than {limit:,} bytes")
    return data
