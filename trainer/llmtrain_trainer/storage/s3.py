"""S3 (or a server speaking its API, such as moto) as a `Storage`, and the one S3 client configuration.

Credentials and region come from boto3's usual chain (IRSA / Pod Identity on EKS; AWS_* variables or
~/.aws elsewhere); the endpoint from `AWS_ENDPOINT_URL` (or `AWS_ENDPOINT_URL_S3`), which boto3 reads
itself, so a local S3 server works without code changes.

Retries: every request through botocore's adaptive mode, up to MAX_ATTEMPTS (S3 answers 503 SlowDown
when a prefix exceeds its request rate, ≈3,500 PUT / 5,500 GET per second). A response body that
breaks off while it is being read (a reset connection, a read timeout) is not a failed request to
botocore, which has already returned the response: `_get` asks again, up to READ_ATTEMPTS times.
Timeouts: CONNECT_TIMEOUT_S to open a connection, READ_TIMEOUT_S of silence on an open one.
Transfers of whole files (`upload`, `download`, `copy`): 64 MiB parts, 8 concurrent per process.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import time
from collections.abc import Iterable, Iterator

from .base import Entry, NotFound, ShortRead, Storage, StorageError, bounded

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 10  # per request, botocore's adaptive retry mode
READ_ATTEMPTS = 5  # per GET whose body breaks off mid-transfer
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0
PART_BYTES = 64 << 20  # few large PUTs per checkpoint file

# NoSuchBucket is not among them: a missing bucket is a wrong location, not a missing object
_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}
_DENIED = {"403", "AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"}
CREDENTIALS = "credentials come from boto3's chain: IRSA or Pod Identity on EKS, AWS_* variables or ~/.aws elsewhere"


def split_uri(uri: str) -> tuple[str, str]:
    """s3://bucket/a/b → ("bucket", "a/b/") (a prefix always ends with "/", or is empty)."""
    if not uri.startswith("s3://"):
        raise ValueError(f"not an s3:// URI: {uri}")
    bucket, _, prefix = uri[5:].partition("/")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return bucket, prefix


@functools.cache
def _session():
    import boto3

    return boto3.session.Session()


def client():
    """A boto3 S3 client (clients are thread-safe; sessions are not, so one session per process)."""
    from botocore.config import Config

    return _session().client(
        "s3",
        region_name=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
        config=Config(
            retries={"max_attempts": MAX_ATTEMPTS, "mode": "adaptive"},
            connect_timeout=CONNECT_TIMEOUT_S,
            read_timeout=READ_TIMEOUT_S,
            max_pool_connections=32,
        ),
    )


def transfer_config(concurrency: int = 8):
    from boto3.s3.transfer import TransferConfig

    # large parts: few PUTs per checkpoint file; bounded concurrency per process
    return TransferConfig(
        multipart_threshold=PART_BYTES, multipart_chunksize=PART_BYTES, max_concurrency=concurrency, use_threads=True
    )


@contextlib.contextmanager
def _errors(url: str, op: str) -> Iterator[None]:
    """botocore's and boto3's errors as StorageErrors naming `url`, `op` and S3's error code."""
    from boto3.exceptions import Boto3Error
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    try:
        yield
    except StorageError:
        raise
    except ClientError as err:
        e = err.response.get("Error", {})
        code, msg = str(e.get("Code", "")), e.get("Message") or ""
        why = f"{code}: {msg}" if msg else code
        if code in _NOT_FOUND:
            raise NotFound(url, op, why) from err
        if code == "InvalidRange":
            raise ShortRead(url, op, f"{why} (the object ends before the range)") from err
        if code in _DENIED:
            why += f" ({CREDENTIALS})"
        raise StorageError(url, op, why) from err
    except NoCredentialsError as err:
        raise StorageError(url, op, f"no AWS credentials found ({CREDENTIALS})") from err
    except (BotoCoreError, Boto3Error) as err:  # no endpoint, timeouts after the retries, failed transfers
        raise StorageError(url, op, f"{type(err).__name__}: {err}") from err


def _broken_body() -> tuple[type[BaseException], ...]:
    from botocore.exceptions import (
        ConnectionClosedError,
        IncompleteReadError,
        ReadTimeoutError,
        ResponseStreamingError,
    )

    return ResponseStreamingError, IncompleteReadError, ReadTimeoutError, ConnectionClosedError


class S3Storage(Storage):
    """Objects under s3://bucket/prefix/, the name of each being its key after the prefix."""

    def __init__(self, uri: str):
        self.bucket, self.prefix = split_uri(uri)
        self.uri = f"s3://{self.bucket}/{self.prefix}"
        self.client = client()
        self.transfer = transfer_config()

    def key(self, name: str) -> str:
        return self.prefix + name

    def url(self, name: str) -> str:
        return f"s3://{self.bucket}/{self.key(name)}"

    def _get(self, name: str, op: str, limit: int | None = None, **kw) -> bytes:
        """A GET's body; one that breaks off mid-transfer is asked for again (see the module docstring)."""
        url = self.url(name)
        for attempt in range(1, READ_ATTEMPTS + 1):
            with _errors(url, op):
                body = self.client.get_object(Bucket=self.bucket, Key=self.key(name), **kw)["Body"]
                try:
                    return body.read() if limit is None else body.read(limit + 1)
                except _broken_body() as err:
                    if attempt == READ_ATTEMPTS:
                        raise StorageError(url, op, f"the response broke off {attempt} times; last: {err}") from err
                    log.warning("%s: %s: the response broke off (%s); reading it again", url, op, err)
                finally:
                    body.close()
            time.sleep(min(2.0, 0.1 * 2**attempt))
        raise AssertionError("unreachable")

    def read_range(self, name: str, offset: int, length: int) -> bytes:
        if length == 0:
            return b""
        op = f"read bytes {offset}-{offset + length - 1}"
        data = self._get(name, op, Range=f"bytes={offset}-{offset + length - 1}")
        if len(data) != length:
            raise ShortRead(self.url(name), op, f"the object ends at byte {offset + len(data)}")
        return data

    def read(self, name: str, limit: int | None = None) -> bytes:
        return bounded(self._get(name, "read", limit), limit, self.url(name))

    def size(self, name: str) -> int:
        with _errors(self.url(name), "size"):
            return int(self.client.head_object(Bucket=self.bucket, Key=self.key(name))["ContentLength"])

    def list(self, prefix: str = "") -> list[Entry]:
        out = []
        with _errors(self.url(prefix), "list"):
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.key(prefix))
            for page in pages:
                out += [Entry(o["Key"][len(self.prefix) :], int(o["Size"])) for o in page.get("Contents", [])]
        return sorted(out, key=lambda e: e.name)

    def open(self, name: str, *, size: int | None = None, buffer_size: int = io.DEFAULT_BUFFER_SIZE):
        return io.BufferedReader(_RangeFile(self, name, self.size(name) if size is None else size), buffer_size)

    def write(self, name: str, data: bytes) -> None:
        with _errors(self.url(name), "write"):
            self.client.put_object(Bucket=self.bucket, Key=self.key(name), Body=data)

    def upload(self, path: str, name: str) -> None:
        with _errors(self.url(name), f"upload {path}"):
            self.client.upload_file(path, self.bucket, self.key(name), Config=self.transfer)

    def download(self, name: str, path: str) -> None:
        with _errors(self.url(name), f"download to {path}"):
            self.client.download_file(self.bucket, self.key(name), path, Config=self.transfer)

    def delete(self, names: Iterable[str]) -> None:
        names = list(names)
        for i in range(0, len(names), 1000):  # DeleteObjects takes at most 1,000 keys
            batch = names[i : i + 1000]
            with _errors(self.url(batch[0]), f"delete {len(batch)} objects"):
                r = self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": self.key(n)} for n in batch]}
                )
            failed = r.get("Errors") or []
            if failed:
                first = failed[0]
                raise StorageError(
                    f"s3://{self.bucket}/{first.get('Key')}",
                    "delete",
                    f"{first.get('Code')}: {first.get('Message')} (and {len(failed) - 1} more)",
                )

    def copy(self, src: str, dest: str) -> None:
        with _errors(self.url(src), f"copy to {self.url(dest)}"):
            self.client.copy(
                {"Bucket": self.bucket, "Key": self.key(src)}, self.bucket, self.key(dest), Config=self.transfer
            )


class _RangeFile(io.RawIOBase):
    """A read-only, seekable file over one object of `size` bytes: each read is a ranged GET (wrap it
    in an io.BufferedReader to read in large ranges)."""

    def __init__(self, storage: S3Storage, name: str, size: int):
        self.storage, self.name, self.size, self.pos = storage, name, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buf) -> int:
        n = min(len(buf), self.size - self.pos)
        if n <= 0:
            return 0
        buf[:n] = self.storage.read_range(self.name, self.pos, n)
        self.pos += n
        return n
