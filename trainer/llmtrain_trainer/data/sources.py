"""`llmtrain prepare`'s inputs: which files, in which order, read as which format, in bounded batches.

Formats, by suffix (a file is never guessed from its content):

    .txt .md                 one document per file (UTF-8)
    .jsonl .jsonl.gz .jsonl.zst   one document per line, its text in a string field (`text` by default)
    .parquet                 one document per row, its text in a string column (`text` by default)

An input is a local file or directory, or an `s3://bucket/key` object or `s3://bucket/prefix/`.
A directory or prefix expands to its files of the selected suffixes in sorted order (code-point
order of the relative path, which is also S3's key order), so the document order is a function of
the inputs alone. A file named explicitly must have a known suffix.

Everything is streamed: text and compressed JSONL are read sequentially, parquet one row group's
text column at a time (no other column is read), S3 objects through ranged GETs of at least
`READ_BUFFER` bytes; a batch handed to the tokenizer workers holds about `batch_bytes` of records.
Records are hostile input: a record longer than `max_record_bytes` is refused (a line is never
read past that bound), as are invalid UTF-8, NUL bytes, invalid JSON, and a missing or non-string
text field, each naming the file and its line or row.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMATS = {
    ".txt": "text",
    ".md": "text",
    ".jsonl": "jsonl",
    ".jsonl.gz": "jsonl",
    ".jsonl.zst": "jsonl",
    ".parquet": "parquet",
}
DEFAULT_EXTENSIONS = tuple(FORMATS)
DEFAULT_TEXT_FIELD = "text"
DEFAULT_MAX_RECORD_BYTES = 64 << 20
DEFAULT_BATCH_BYTES = 512 << 10
READ_BUFFER = 8 << 20  # S3 ranged GETs of 8 MiB: S3's own guidance for byte-range fetches
LOCAL_READ_BUFFER = 1 << 20  # a local file's read buffer, and a decompressed stream's


def suffix_of(name: str) -> str:
    """The known format suffix `name` ends with ('.jsonl.gz' before '.gz'), else its last suffix."""
    low = name.lower()
    for s in sorted(FORMATS, key=len, reverse=True):
        if low.endswith(s):
            return s
    return os.path.splitext(low)[1]


@dataclass(frozen=True)
class Source:
    uri: str  # a local path or s3://bucket/key
    size: int  # bytes as stored (compressed for .gz/.zst)

    @property
    def suffix(self) -> str:
        return suffix_of(self.uri)

    @property
    def format(self) -> str:
        return FORMATS[self.suffix]


def check_extensions(extensions) -> tuple[str, ...]:
    exts = tuple(e.lower() if e.startswith(".") else "." + e.lower() for e in extensions if e)
    unknown = [e for e in exts if e not in FORMATS]
    if unknown or not exts:
        raise ValueError(
            f"--extensions {','.join(unknown) or '(none)'}: unknown format; accepted: {', '.join(FORMATS)}"
        )
    return exts


def list_sources(inputs: list[str], extensions=DEFAULT_EXTENSIONS) -> list[Source]:
    exts = check_extensions(extensions)
    out: list[Source] = []
    for inp in inputs:  # a missing bucket, denied access, no endpoint: a StorageError naming the input
        out += _list_s3(inp, exts) if inp.startswith("s3://") else _list_local(inp, exts)
    if not out:
        raise FileNotFoundError(f"no {'/'.join(exts)} files in {' '.join(inputs)}")
    return out


def _refuse_unknown(name: str, exts) -> None:
    if suffix_of(name) not in exts:  # a parquet or binary file read as text is noise, silently
        raise ValueError(
            f"{name}: unknown input format {suffix_of(name) or '(no suffix)'!r}; accepted: {', '.join(exts)}"
        )


def _list_local(inp: str, exts) -> list[Source]:
    p = Path(inp)
    if p.is_dir():
        files = [(q.relative_to(p).as_posix(), q) for q in p.rglob("*") if q.is_file() and suffix_of(q.name) in exts]
        return [Source(str(q), q.stat().st_size) for _, q in sorted(files)]
    if p.is_file():
        _refuse_unknown(inp, exts)
        return [Source(str(p), p.stat().st_size)]
    raise FileNotFoundError(f"{inp}: no such file or directory")


def _list_s3(inp: str, exts) -> list[Source]:
    from ..storage import S3Storage

    bucket, key = inp[5:].partition("/")[::2]
    st = S3Storage(f"s3://{bucket}/")
    if key and not key.endswith("/"):
        try:
            size = st.size(key)
        except FileNotFoundError:
            key += "/"  # not an object: a prefix
        else:
            _refuse_unknown(inp, exts)
            return [Source(inp, size)]
    found = [
        Source(st.url(e.name), e.size) for e in st.list(key) if not e.name.endswith("/") and suffix_of(e.name) in exts
    ]
    if not found:
        raise FileNotFoundError(f"{inp}: no {'/'.join(exts)} objects under this prefix")
    return sorted(found, key=lambda s: s.uri)


def open_binary(src: Source):
    """A buffered binary file over `src` (S3: ranged GETs of READ_BUFFER bytes, through the storage layer)."""
    from ..storage import locate

    storage, name = locate(src.uri)
    buffer = READ_BUFFER if src.uri.startswith("s3://") else LOCAL_READ_BUFFER
    return storage.open(name, size=src.size, buffer_size=buffer)


@dataclass
class Batch:
    """Records of one source for a tokenizer worker: raw bytes (text, jsonl lines) or a pyarrow
    string array (parquet), each with its line/row number for error messages."""

    source: int  # index into the source list
    name: str  # the source's uri, for messages
    kind: str  # "text" | "jsonl" | "parquet"
    records: Any  # list[bytes] | pyarrow.Array
    numbers: list[int] = field(default_factory=list)  # line (jsonl, 1-based) / row (parquet, 0-based) of each record
    first_row: int = 0  # parquet: row number of records[0]
    in_bytes: int = 0  # input bytes (as stored) this batch accounts for, for progress


def batches(
    sources: list[Source],
    *,
    text_field: str = DEFAULT_TEXT_FIELD,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
) -> Iterator[Batch]:
    """The corpus as batches of raw records, in document order, never more than one batch (plus
    one parquet row batch or one read buffer) in memory."""
    for i, src in enumerate(sources):
        reader = {"text": _text_batches, "jsonl": _jsonl_batches, "parquet": _parquet_batches}[src.format]
        yield from reader(i, src, text_field=text_field, max_record_bytes=max_record_bytes, batch_bytes=batch_bytes)


def _text_batches(i, src, *, max_record_bytes, **_):
    if src.size > max_record_bytes:
        raise ValueError(
            f"{src.uri}: {src.size:,} bytes, longer than the {max_record_bytes:,}-byte bound on one "
            "document (--max-document-bytes); split it, or raise the bound"
        )
    with open_binary(src) as f:
        raw = f.read(max_record_bytes + 1)
    if len(raw) > max_record_bytes:  # grew since it was listed
        raise ValueError(f"{src.uri}: longer than the {max_record_bytes:,}-byte bound on one document")
    yield Batch(i, src.uri, "text", [raw], [1], in_bytes=src.size)


def _decompressed(src: Source, raw):
    if src.suffix == ".jsonl.gz":
        import gzip

        return io.BufferedReader(gzip.GzipFile(fileobj=raw, mode="rb"), buffer_size=LOCAL_READ_BUFFER)
    if src.suffix == ".jsonl.zst":
        import zstandard

        # read_across_frames: files written by several `zstd` calls concatenated are one stream
        return io.BufferedReader(
            zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True), buffer_size=LOCAL_READ_BUFFER
        )
    return raw


def _corrupt_stream_errors() -> tuple[type[BaseException], ...]:
    import zlib

    import zstandard

    # gzip.BadGzipFile is an OSError, a truncated member an EOFError, bad deflate data zlib.error
    return (OSError, EOFError, zlib.error, zstandard.ZstdError)


def _jsonl_batches(i, src, *, max_record_bytes, batch_bytes, **_):
    with open_binary(src) as raw:
        lines = _decompressed(src, raw)
        records, numbers, size, reported, n = [], [], 0, 0, 0
        try:
            while True:
                line = lines.readline(max_record_bytes + 1)
                if not line:
                    break
                n += 1
                if len(line) > max_record_bytes:
                    raise ValueError(
                        f"{src.uri}:{n}: a line longer than the {max_record_bytes:,}-byte bound on one "
                        "document (--max-document-bytes)"
                    )
                if not line.strip():
                    continue
                records.append(line)
                numbers.append(n)
                size += len(line)
                if size >= batch_bytes:
                    pos = raw.tell()
                    yield Batch(i, src.uri, "jsonl", records, numbers, in_bytes=pos - reported)
                    records, numbers, size, reported = [], [], 0, pos
        except _corrupt_stream_errors() as err:
            raise ValueError(f"{src.uri}: after line {n}: corrupt {src.suffix} stream ({err})") from None
        yield Batch(i, src.uri, "jsonl", records, numbers, in_bytes=src.size - reported)


def _parquet_batches(i, src, *, text_field, max_record_bytes, batch_bytes, **_):
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    with open_binary(src) as raw:
        try:
            pf = pq.ParquetFile(raw)
        except (pa.ArrowException, OSError) as err:
            raise ValueError(f"{src.uri}: not a parquet file ({err})") from None
        schema = pf.schema_arrow
        if text_field not in schema.names:
            raise ValueError(
                f"{src.uri}: no column {text_field!r} (columns: {', '.join(schema.names)}); pass --text-field"
            )
        typ = schema.field(text_field).type
        if not (pa.types.is_string(typ) or pa.types.is_large_string(typ)):
            raise ValueError(f"{src.uri}: column {text_field!r} is {typ}, not a string column")
        meta = pf.metadata
        rows_total = meta.num_rows or 1
        # Rows per batch from the row groups' own uncompressed size: about batch_bytes of text each.
        total_bytes = sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups)) or 1
        rows = max(1, min(65536, int(batch_bytes * rows_total / total_bytes)))
        row, reported = 0, 0
        try:
            for rb in pf.iter_batches(batch_size=rows, columns=[text_field], use_threads=False):
                col = rb.column(0)
                if col.null_count:
                    bad = row + pc.index(pc.is_null(col), True).as_py()
                    raise ValueError(f"{src.uri}: row {bad}: {text_field!r} is null, not a string")
                longest = pc.max(pc.binary_length(col)).as_py() or 0
                if longest > max_record_bytes:
                    bad = row + pc.index(pc.greater(pc.binary_length(col), max_record_bytes), True).as_py()
                    raise ValueError(
                        f"{src.uri}: row {bad}: a text longer than the {max_record_bytes:,}-byte bound "
                        "on one document (--max-document-bytes)"
                    )
                done = int(src.size * (row + len(col)) / rows_total)
                yield Batch(i, src.uri, "parquet", col, first_row=row, in_bytes=done - reported)
                row, reported = row + len(col), done
        except (pa.ArrowException, OSError) as err:
            raise ValueError(f"{src.uri}: after row {row}: unreadable parquet data ({err})") from None


# ----------------------------------------------------------------------------------------------
# Records → document texts (in the tokenizer workers).


def utf8(raw: bytes, where: str) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{where}: not UTF-8 text (byte {err.start}: {err.reason}); a binary file?") from None
    if "\0" in text:  # never in text; byte-level, it is the end-of-document token
        raise ValueError(f"{where}: contains NUL (U+0000): binary data, not text")
    return text


def texts(batch: Batch, text_field: str = DEFAULT_TEXT_FIELD) -> list[str]:
    if batch.kind == "text":
        return [utf8(batch.records[0], batch.name)]
    if batch.kind == "jsonl":
        return [
            _jsonl_text(raw, f"{batch.name}:{n}", text_field)
            for raw, n in zip(batch.records, batch.numbers, strict=False)
        ]
    try:
        out = batch.records.to_pylist()  # arrow validates the UTF-8 here
    except Exception:  # find the row for the message
        for k in range(len(batch.records)):
            try:
                batch.records[k].as_py()
            except Exception as err:  # noqa: BLE001 - whatever arrow raises names the row
                raise ValueError(f"{batch.name}: row {batch.first_row + k}: not UTF-8 text ({err})") from None
        raise
    for k, t in enumerate(out):
        if "\0" in t:
            raise ValueError(f"{batch.name}: row {batch.first_row + k}: contains NUL (U+0000): binary data, not text")
    return out


def _jsonl_text(raw: bytes, where: str, text_field: str) -> str:
    line = utf8(raw, where)
    try:
        doc = json.loads(line)
    except ValueError as err:
        raise ValueError(f"{where}: not a JSON object ({err})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get(text_field), str):
        got = sorted(doc)[:20] if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(f'{where}: a .jsonl line must be an object with a string "{text_field}" field (got {got})')
    text = doc[text_field]
    if "\0" in text:
        raise ValueError(f"{where}: contains NUL (U+0000): binary data, not text")
    return text
