"""`llmtrain prepare`: text corpora → token shards in the `llmtrain-tokens/v1` format (see `loader.py`).

Inputs (formats, local paths and s3:// prefixes, order, bounds): see `sources.py`; the tokenizer:
`tokenizer.py`.

Pipeline on one machine:

    reader (this process)         workers (one process per core)        writer (this process)
    list → read/decompress/frame  → decode, parse, encode_batch → ids  → shards, in input order
           batches of ~512 KiB

The reader only frames raw records (a line, a file, a parquet row batch); parsing, UTF-8
validation and tokenization run in the workers, so one reader feeds many cores (it moves bytes at
hundreds of MB/s, a tokenizer core moves a few). At most `workers + 2` batches are in flight, so
memory is bounded by those batches plus one shard buffer whatever the corpus size. Results are
consumed in submission order, and a document's tokens do not depend on which batch or worker
encoded it (padding and truncation are switched off), so the output — shards, index.json,
document order — is identical byte for byte for any worker count.

Why processes and not threads: `encode_batch` releases the GIL and runs on Rayon's threads, but
turning its Encoding objects into ids runs under the GIL and is a large share of the time for BPE
tokenizers; one single-threaded tokenizer per process scales that part too (bench/prepare_throughput.py
measures both). Each worker sets TOKENIZERS_PARALLELISM=false so N processes don't each start N threads.
"""

from __future__ import annotations

import collections
import json
import multiprocessing
import os
import shutil
import tempfile
import time
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from .loader import FORMAT, INDEX
from .sources import (
    DEFAULT_BATCH_BYTES,
    DEFAULT_EXTENSIONS,
    DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_TEXT_FIELD,
    Batch,
    Source,
    batches,
    list_sources,
    texts,
)
from .tokenizer import Tokenizer, hf_tokenizer

DEFAULT_SHARD_TOKENS = 1 << 26
# ----------------------------------------------------------------------------------------------
# Workers: a batch of raw records → the documents' ids, each followed by eos.

_WORKER: dict = {}


def _init_worker(tok_json: str | None, eos_id: int, dtype: str, text_field: str, single_threaded: bool) -> None:
    if single_threaded:  # before tokenizers starts its Rayon pool in this process
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        os.environ["RAYON_NUM_THREADS"] = "1"
    _WORKER.update(
        tok=hf_tokenizer(tok_json, "tokenizer") if tok_json else None,
        eos=eos_id,
        dtype=np.dtype(dtype),
        text_field=text_field,
    )


@dataclass
class Encoded:
    ids: np.ndarray
    documents: int
    text_bytes: int  # UTF-8 bytes of the documents' text (for bytes per token)
    seconds: float  # worker time: parse + tokenize
    in_bytes: int  # input bytes this batch accounts for (progress)


def _encode(batch: Batch) -> Encoded:
    t0 = time.perf_counter()
    w = _WORKER
    docs = texts(batch, w["text_field"])
    dtype, eos, tok = w["dtype"], w["eos"], w["tok"]
    if tok is None:  # byte-level: the UTF-8 bytes are the ids
        raw = [d.encode("utf-8") for d in docs]
        nbytes = sum(map(len, raw))
        ids = np.frombuffer(b"\0".join(raw) + b"\0", dtype=np.uint8) if raw else np.empty(0, np.uint8)
        if eos != 0:
            ids = ids.copy()
            ids[ids == 0] = eos  # NUL never occurs in a document (refused), so every 0 is a separator
        ids = ids.astype(dtype)
    else:
        nbytes = sum(len(d.encode("utf-8")) for d in docs)
        # encode_batch_fast: the same ids without the offsets, which nothing here reads. `llmtrain
        # prepare` on 24 MB of Python sources took 4.9 s instead of 6.4-6.7 s with it (2 workers);
        # on the English-like corpus the two were level.
        encs = tok.encode_batch_fast(docs, add_special_tokens=False)
        # len(e), not len(e.ids): .ids builds a Python list of the ids, once is enough (below)
        lens = np.fromiter((len(e) + 1 for e in encs), dtype=np.int64, count=len(encs))
        ids = np.empty(int(lens.sum()), dtype=dtype)
        ends = np.cumsum(lens)
        pos = 0
        for e, end in zip(encs, ends.tolist(), strict=True):
            ids[pos : end - 1] = e.ids
            ids[end - 1] = eos
            pos = end
    return Encoded(ids, len(docs), nbytes, time.perf_counter() - t0, batch.in_bytes)


class _InProcess:
    """The worker pool of one worker: the same code in this process (no pickling, easy to profile)."""

    def __init__(self, *init_args):
        _init_worker(*init_args[:4], single_threaded=False)

    def submit(self, fn, *args) -> Future:
        f: Future = Future()
        try:
            f.set_result(fn(*args))
        except BaseException as err:  # noqa: BLE001 - raised at .result(), as a pool would
            f.set_exception(err)
        return f

    def shutdown(self, **_):
        pass


def _pool(workers: int, pool: str, init_args: tuple):
    if workers == 1:
        return _InProcess(*init_args)
    if pool == "thread":
        tok_json, eos_id, dtype, text_field = init_args[:4]
        _init_worker(tok_json, eos_id, dtype, text_field, single_threaded=False)  # one tokenizer shared; Rayon inside
        return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="llmtrain-prepare")
    # spawn: fork would copy this process's threads (tqdm's monitor, boto3's, a test's servers) mid-state
    return ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_init_worker,
        initargs=(*init_args[:4], True),
    )


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


# ----------------------------------------------------------------------------------------------
# Shards.


class _ShardWriter:
    """Tokens → fixed-size shard files through one preallocated buffer of `shard_tokens`; a full
    shard is handed to `on_shard` (the S3 upload, in the background: at most one in flight)."""

    def __init__(self, out_dir: str, shard_tokens: int, dtype: np.dtype, on_shard=None, prefix: str = ""):
        self.out_dir, self.dtype, self.on_shard, self.prefix = out_dir, dtype, on_shard, prefix
        self.buf = np.empty(shard_tokens, dtype=dtype)
        self.fill = 0
        self.shards: list[dict] = []
        self._uploads = ThreadPoolExecutor(max_workers=1) if on_shard else None
        self._pending: Future | None = None
        self.upload_wait = 0.0

    def add(self, ids) -> None:
        ids = np.asarray(ids, dtype=self.dtype)
        while len(ids):
            take = min(len(ids), len(self.buf) - self.fill)
            self.buf[self.fill : self.fill + take] = ids[:take]
            self.fill += take
            ids = ids[take:]
            if self.fill == len(self.buf):
                self.flush()

    def flush(self) -> None:
        if self.fill:
            name = f"shard-{len(self.shards):05d}.bin"
            self.buf[: self.fill].tofile(os.path.join(self.out_dir, name))
            self.shards.append({"file": self.prefix + name, "tokens": int(self.fill)})
            self.fill = 0
            if self._uploads is not None:
                self.wait()  # bounds local disk to two shards
                self._pending = self._uploads.submit(self.on_shard, name)

    def wait(self) -> None:
        if self._pending is not None:
            t0 = time.perf_counter()
            self._pending.result()
            self._pending = None
            self.upload_wait += time.perf_counter() - t0

    def close(self) -> None:
        if self._uploads is not None:
            self.wait()
            self._uploads.shutdown()


# ----------------------------------------------------------------------------------------------
# The run.


@dataclass
class Report:
    documents: int = 0
    tokens: int = 0
    shards: int = 0
    text_bytes: int = 0
    input_bytes: int = 0
    files: int = 0
    workers: int = 1
    stages: dict = field(default_factory=dict)  # stage → seconds (wall, except "tokenize": worker time)

    @property
    def bytes_per_token(self) -> float:
        body = self.tokens - self.documents  # without the end-of-document tokens
        return self.text_bytes / body if body > 0 else 0.0

    def lines(self) -> list[str]:
        s = self.stages
        wall = s.get("total", 0.0) or 1e-9
        return [
            (
                f"{self.documents:,} documents, {self.tokens:,} tokens in {self.shards} shard(s) from {self.files} "
                f"file(s), {self.input_bytes / 1e6:,.1f} MB; {self.bytes_per_token:.2f} bytes per token"
            ),
            (
                f"{self.text_bytes / 1e6 / wall:,.2f} MB/s of text, {self.tokens / wall:,.0f} tokens/s on "
                f"{self.workers} worker(s)"
            ),
            "time: "
            + ", ".join(f"{k} {v:.2f} s" for k, v in s.items())
            + " (tokenize: summed over the workers; the other stages: this process)",
        ]


@dataclass
class Result:
    index: dict
    report: Report


def prepare(inputs: list[str], output: str, **kw) -> dict:
    """Write the shards and index.json to `output` (a directory, or s3://bucket/prefix/); the index."""
    return run_prepare(inputs, output, **kw).index


def run_prepare(
    inputs: list[str] | None,
    output: str,
    *,
    tokenizer: str | None = None,
    eos_id: int | None = None,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    extensions: tuple[str, ...] = DEFAULT_EXTENSIONS,
    text_field: str = DEFAULT_TEXT_FIELD,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    workers: int | None = None,
    pool: str = "process",
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    progress: bool = False,
    sources: list[Source] | None = None,
    tok: Tokenizer | None = None,
    shard_prefix: str = "",
    copy_tokenizer: bool = True,
    extra: dict | None = None,
) -> Result:
    """Streaming: memory is bounded by the batches in flight and one shard buffer (2^26 tokens = 128
    MiB of uint16 by default) whatever the corpus size. Documents are written in input order; the
    reader shuffles at sample level across all shards (see `loader.py`).

    `sources`/`tok`/`shard_prefix`/`extra` are for the distributed prepare (prepare_cluster.py):
    one slice of a listed corpus, written with its shard names under a prefix."""
    if shard_tokens < 1:  # 0 would never fill a shard: an endless stream of empty files
        raise ValueError(f"shard_tokens must be at least 1 (got {shard_tokens}); default {DEFAULT_SHARD_TOKENS}")
    if max_record_bytes < 1:
        raise ValueError(f"max_record_bytes must be at least 1 (got {max_record_bytes})")
    if pool not in ("process", "thread"):
        raise ValueError(f"pool must be 'process' or 'thread', got {pool!r}")
    t_start = time.perf_counter()
    tok = tok or Tokenizer.load(tokenizer, eos_id)
    t0 = time.perf_counter()
    if sources is None:
        sources = list_sources(list(inputs or []), extensions)
    listed = time.perf_counter() - t0
    if workers is None:  # starting a process costs more than tokenizing a few batches
        workers = max(1, min(default_workers(), sum(s.size for s in sources) // (4 * batch_bytes)))
    rep = Report(files=len(sources), workers=workers, input_bytes=sum(s.size for s in sources))
    out = _Output(output, shard_prefix)
    writer = _ShardWriter(out.dir, shard_tokens, tok.dtype, on_shard=out.upload_shard, prefix=shard_prefix)
    try:
        stages = _tokenize_into(
            writer,
            batches(sources, text_field=text_field, max_record_bytes=max_record_bytes, batch_bytes=batch_bytes),
            _pool(workers, pool, (tok.json, tok.eos_id, tok.dtype.str, text_field)),
            rep,
            workers=workers,
            progress=progress,
            t_start=t_start,
        )
    except BaseException:
        out.discard()
        raise
    shards = writer.shards
    index = {
        "format": FORMAT,
        "dtype": tok.dtype.name.replace("<", ""),
        "vocab_size": tok.vocab_size,
        "eos_id": tok.eos_id,
        "tokenizer": tok.name,
        "documents": rep.documents,
        "tokens": sum(s["tokens"] for s in shards),
        "shards": shards,
        **(extra or {}),
    }
    t = time.perf_counter()
    out.finish(index, tokenizer if copy_tokenizer else None)
    rep.shards = len(shards)
    rep.stages = {
        "list": listed,
        **stages,
        "write": stages["write"] + time.perf_counter() - t,
        "upload-wait": writer.upload_wait,
        "total": time.perf_counter() - t_start,
    }
    return Result(index, rep)


class _Output:
    """Where the shards go: the output directory itself, or (S3) a local staging directory whose
    shards go up one by one as they fill, so local disk holds at most two; index.json last."""

    def __init__(self, output: str, shard_prefix: str):
        from ..config import local_path
        from ..storage import open_storage

        self.storage = open_storage(output)  # the output directory or S3 prefix (llmtrain_trainer/storage)
        self.to_s3 = output.startswith("s3://")
        self.prefix = shard_prefix
        local = os.path.join(local_path(output), shard_prefix)
        self.dir = tempfile.mkdtemp(prefix="llmtrain-prepare-") if self.to_s3 else local
        os.makedirs(self.dir, exist_ok=True)
        self.upload_shard = self._upload if self.to_s3 else None

    def _upload(self, name: str) -> None:
        self.storage.upload(os.path.join(self.dir, name), self.prefix + name)
        os.remove(os.path.join(self.dir, name))

    def finish(self, index: dict, tokenizer: str | None) -> None:
        if tokenizer:
            self.storage.upload(tokenizer, os.path.basename(tokenizer))
        # index.json last, atomically: a reader that finds it finds complete data
        self.storage.write(self.prefix + INDEX, json.dumps(index, indent=1).encode())
        self.discard()

    def discard(self) -> None:
        if self.to_s3:
            shutil.rmtree(self.dir, ignore_errors=True)


def _tokenize_into(writer: _ShardWriter, stream, executor, rep: Report, *, workers: int, progress: bool, t_start):
    """The batches of `stream` through the workers of `executor`, their ids into `writer` in input
    order, at most `workers + 2` batches in flight; counts into `rep`; the stages' seconds."""
    from tqdm import tqdm

    read_s = wait_s = write_s = tokenize_s = 0.0
    in_flight: collections.deque[Future] = collections.deque()
    bar = tqdm(
        total=rep.input_bytes,
        unit="B",
        unit_scale=True,
        desc="tokenizing",
        disable=not progress,
        dynamic_ncols=True,
        smoothing=0.1,
    )

    def take() -> None:
        nonlocal wait_s, write_s, tokenize_s
        t = time.perf_counter()
        enc: Encoded = in_flight.popleft().result()
        t1 = time.perf_counter()
        writer.add(enc.ids)
        write_s += time.perf_counter() - t1
        wait_s += t1 - t
        tokenize_s += enc.seconds
        rep.documents += enc.documents
        rep.text_bytes += enc.text_bytes
        rep.tokens += len(enc.ids)
        bar.update(enc.in_bytes)
        elapsed = time.perf_counter() - t_start
        bar.set_postfix_str(f"{rep.tokens / max(elapsed, 1e-9):,.0f} tokens/s, {rep.documents:,} docs", refresh=False)

    try:
        while True:
            t = time.perf_counter()
            batch = next(stream, None)
            read_s += time.perf_counter() - t
            if batch is None:
                break
            in_flight.append(executor.submit(_encode, batch))
            while len(in_flight) >= workers + 2:  # every worker busy, the next batches queued
                take()
        while in_flight:
            take()
        t = time.perf_counter()
        writer.flush()
        writer.close()
        write_s += time.perf_counter() - t
    except BaseException:
        for f in in_flight:
            f.cancel()
        writer.close()
        raise
    finally:
        bar.close()
        executor.shutdown(wait=True, cancel_futures=True)
    return {"read": read_s, "tokenize": tokenize_s, "wait": wait_s, "write": write_s}
