"""S3 access shared by the data reader, the checkpointer and `llmtrain prepare`.

Credentials and region come from boto3's usual chain (IRSA / Pod Identity on EKS); the endpoint from
`AWS_ENDPOINT_URL` (or `AWS_ENDPOINT_URL_S3`), which boto3 reads itself, so a local S3 server such as
moto works without code changes. Retries use boto3's adaptive mode: S3 answers 503 SlowDown when a
prefix exceeds its request rate (≈3,500 PUT / 5,500 GET per second).
"""

from __future__ import annotations

import functools
import os
import threading

_local = threading.local()


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
        config=Config(retries={"max_attempts": 10, "mode": "adaptive"}, max_pool_connections=32),
    )


def transfer_config(concurrency: int = 8):
    from boto3.s3.transfer import TransferConfig

    # 64 MiB parts: few large PUTs per checkpoint file; bounded concurrency per process.
    return TransferConfig(
        multipart_threshold=64 << 20, multipart_chunksize=64 << 20, max_concurrency=concurrency, use_threads=True
    )
