"""One storage layer under the trainer: training data, `llmtrain prepare`'s inputs and outputs,
checkpoints and pretrained weights all read and write through it.

A `Storage` is a directory (local disk, FSx, a PVC mount; `local.py`) or an S3 prefix (`s3.py`),
holding objects by names relative to it ("/"-separated). `open_storage(uri)` gives the one a URI
names (`s3://bucket/prefix/`, `file:///abs`, `file://rel`, a plain path); `locate(uri)` the storage
and name of one object or file.

The same guarantees on both backends:

- **ranged reads** (`read_range`) return exactly the bytes asked for, or raise `ShortRead` naming the
  object and the range; `open` gives a seekable binary file over an object (parquet's footer);
- **bounded reads**: `read(name, limit)` refuses an object larger than `limit` bytes (tenant data:
  an index or a manifest must not exhaust memory);
- **atomic writes** (`write`, `upload`): a reader sees the old object or the whole new one, never
  part of it — local: a temporary file in the same directory, fsynced, renamed over the name, the
  directory fsynced; S3: one PUT or one multipart upload, which S3 makes visible only when complete;
- **errors name the object**: every failure is an `OSError` that says which object (path or s3://
  URI) and why. S3's are `StorageError`s (`s3://b/k: read: NoSuchKey: ...`), as are local failures
  the OS reports without a file name (a write running out of space); a local error that names its
  file is the OS's own, unchanged (`FileNotFoundError: [Errno 2] No such file or directory: '...'`).
  A missing object is a `FileNotFoundError` on both (S3: `NotFound`; a missing bucket is not: that
  is a wrong location), a short read a `ShortRead` (also an `EOFError`);
- **one S3 configuration** (`s3.client`): credentials and region from boto3's chain (IRSA / Pod
  Identity on EKS), the endpoint from `AWS_ENDPOINT_URL`, adaptive retries of every request,
  explicit connect and read timeouts, and a re-read of a response body that broke off mid-transfer,
  which botocore's retries do not cover.
"""

from __future__ import annotations

from .base import Entry, NotFound, ShortRead, Storage, StorageError
from .local import LocalStorage
from .s3 import S3Storage

__all__ = [
    "Entry",
    "LocalStorage",
    "NotFound",
    "S3Storage",
    "ShortRead",
    "Storage",
    "StorageError",
    "locate",
    "open_storage",
]


def open_storage(uri: str, **kw) -> Storage:
    """The storage `uri` names: an S3 prefix, or a local directory (`file://` or a plain path)."""
    if uri.startswith("s3://"):
        return S3Storage(uri, **kw)
    from ..config import local_path

    return LocalStorage(local_path(uri))


def locate(uri: str) -> tuple[Storage, str]:
    """(the storage holding the object or file `uri`, its name there): `s3://b/k/x` → (s3://b/, "k/x")."""
    import os

    if uri.startswith("s3://"):
        bucket, _, key = uri[5:].partition("/")
        return S3Storage(f"s3://{bucket}/"), key
    from ..config import local_path

    path = os.path.abspath(local_path(uri))
    return LocalStorage(os.path.dirname(path)), os.path.basename(path)
