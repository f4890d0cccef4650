"""`llmtrain prepare`: text files → token shards in the `llmtrain-tokens/v1` format (see `data.py`).

Inputs are files or directories (searched recursively for *.txt, *.md, *.jsonl, or the
`--extensions` given; any non-.jsonl file is read as plain text). A .txt/.md file is
one document; a .jsonl file holds one document per line in its "text" field. Documents stream
through in input order (memory bounded by one shard, a progress bar over the input bytes); the
reader's sample-level shuffle mixes them.

Tokenizer: a `tokenizers` JSON file (`--tokenizer tokenizer.json`, e.g. a Llama 3 tokenizer), or
the byte-level fallback that needs no download: token = UTF-8 byte (vocabulary 256, matching the
`tiny` preset), with byte 0 (NUL, absent from text) as the end-of-document token.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from .data import FORMAT, INDEX

DEFAULT_SHARD_TOKENS = 1 << 26
EOS_CANDIDATES = ("<|end_of_text|>", "</s>", "<|endoftext|>", "<eos>")


@dataclass
class Tokenizer:
    name: str
    vocab_size: int
    eos_id: int
    _tok: object | None = None

    def encode(self, text: str) -> list[int]:
        if self._tok is None:
            return list(text.encode("utf-8"))
        return self._tok.encode(text, add_special_tokens=False).ids

    @classmethod
    def load(cls, path: str | None, eos_id: int | None = None) -> "Tokenizer":
        if not path:
            tok = cls("byte", 256, 0 if eos_id is None else eos_id)
        else:
            from tokenizers import Tokenizer as HFTokenizer

            if not os.path.isfile(path):
                raise FileNotFoundError(f"--tokenizer {path}: no such file (expected a `tokenizers` "
                                        "JSON file such as a model's tokenizer.json)")
            try:
                hf = HFTokenizer.from_file(path)
            except Exception as err:  # the Rust side raises a bare Exception for any parse error
                raise ValueError(f"--tokenizer {path}: not a `tokenizers` JSON file ({err})") from None
            if eos_id is None:
                eos_id = next((i for t in EOS_CANDIDATES if (i := hf.token_to_id(t)) is not None), None)
            if eos_id is None:
                raise ValueError(f"{path}: no end-of-document token among {EOS_CANDIDATES}; pass --eos-id")
            tok = cls(os.path.basename(path), hf.get_vocab_size(with_added_tokens=True), eos_id, hf)
        if not 0 <= tok.eos_id < tok.vocab_size:  # would index past the embedding table in training
            raise ValueError(f"--eos-id {tok.eos_id} is outside the vocabulary of {tok.name} "
                             f"(ids 0..{tok.vocab_size - 1})")
        return tok


DEFAULT_EXTENSIONS = (".txt", ".md", ".jsonl")


def _files(inputs: list[str], extensions=DEFAULT_EXTENSIONS) -> list[Path]:
    out: list[Path] = []
    for inp in inputs:
        p = Path(inp)
        if p.is_dir():
            out += sorted(q for q in p.rglob("*") if q.suffix in extensions and q.is_file())
        elif p.is_file():
            if p.suffix not in extensions:  # a parquet or binary file read as text is noise, silently
                raise ValueError(f"{inp}: unknown input format {p.suffix or '(no suffix)'!r}; accepted: "
                                 f"{', '.join(extensions)}")
            out.append(p)
        else:
            raise FileNotFoundError(f"{inp}: no such file or directory")
    if not out:
        raise FileNotFoundError(f"no {'/'.join(extensions)} files in {' '.join(inputs)}")
    return out


def _jsonl_text(line: str, where: str) -> str:
    try:
        doc = json.loads(line)
    except ValueError as err:
        raise ValueError(f"{where}: not a JSON object ({err})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("text"), str):
        got = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(f'{where}: a .jsonl line must be an object with a string "text" field (got {got})')
    return doc["text"]


def _utf8(raw: bytes, where: str) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{where}: not UTF-8 text (byte {err.start}: {err.reason}); a binary file?") from None
    if "\0" in text:  # never in text; byte-level, it is the end-of-document token
        raise ValueError(f"{where}: contains NUL bytes: binary data, not text")
    return text


def _documents(files: list[Path]) -> Iterator[tuple[str, int]]:
    """(document text, input bytes it came from), one at a time: the corpus is never all in memory."""
    for f in files:
        if f.suffix == ".jsonl":
            with open(f, "rb") as fh:
                for n, raw in enumerate(fh, 1):
                    line = _utf8(raw, f"{f}:{n}")
                    if line.strip():
                        yield _jsonl_text(line, f"{f}:{n}"), len(raw)
        else:
            yield _utf8(f.read_bytes(), str(f)), f.stat().st_size


class _ShardWriter:
    """Tokens → fixed-size shard files through one preallocated buffer of `shard_tokens`."""

    def __init__(self, out_dir: str, shard_tokens: int, dtype: np.dtype, on_shard=None):
        self.out_dir, self.dtype, self.on_shard = out_dir, dtype, on_shard
        self.buf = np.empty(shard_tokens, dtype=dtype)
        self.fill = 0
        self.shards: list[dict] = []

    def add(self, ids) -> None:
        ids = np.asarray(ids, dtype=self.dtype)
        while len(ids):
            take = min(len(ids), len(self.buf) - self.fill)
            self.buf[self.fill:self.fill + take] = ids[:take]
            self.fill += take
            ids = ids[take:]
            if self.fill == len(self.buf):
                self.flush()

    def flush(self) -> None:
        if self.fill:
            name = f"shard-{len(self.shards):05d}.bin"
            self.buf[:self.fill].tofile(os.path.join(self.out_dir, name))
            self.shards.append({"file": name, "tokens": int(self.fill)})
            self.fill = 0
            if self.on_shard is not None:
                self.on_shard(name)


def prepare(inputs: list[str], output: str, *, tokenizer: str | None = None, eos_id: int | None = None,
            shard_tokens: int = DEFAULT_SHARD_TOKENS, extensions: tuple[str, ...] = DEFAULT_EXTENSIONS,
            progress: bool = False) -> dict:
    """Write the shards and index.json to `output` (a directory, or s3://bucket/prefix/).

    Streaming: one document at a time into one shard buffer, so memory is bounded by the shard size
    (2^26 tokens = 128 MiB of uint16 by default) whatever the corpus size. Documents are written in
    input order; the reader shuffles at sample level across all shards (see `data.py`).
    """
    if shard_tokens < 1:  # 0 would never fill a shard: an endless stream of empty files
        raise ValueError(f"shard_tokens must be at least 1 (got {shard_tokens}); default {DEFAULT_SHARD_TOKENS}")
    tok = Tokenizer.load(tokenizer, eos_id)
    dtype = np.dtype("<u2") if tok.vocab_size <= 1 << 16 else np.dtype("<u4")
    files = _files(inputs, extensions)

    to_s3 = output.startswith("s3://")
    from .config import local_path

    out_dir = tempfile.mkdtemp(prefix="llmtrain-prepare-") if to_s3 else local_path(output)
    os.makedirs(out_dir, exist_ok=True)
    upload = None
    if to_s3:  # each shard goes up as soon as it is full, so local disk holds one shard at a time
        from . import s3

        bucket, prefix = s3.split_uri(output)
        c = s3.client()

        def upload(name: str) -> None:
            c.upload_file(os.path.join(out_dir, name), bucket, prefix + name, Config=s3.transfer_config())
            os.remove(os.path.join(out_dir, name))
    writer = _ShardWriter(out_dir, shard_tokens, dtype, on_shard=upload)
    from tqdm import tqdm

    documents = 0
    with tqdm(total=sum(f.stat().st_size for f in files), unit="B", unit_scale=True, desc="tokenizing",
              disable=not progress, dynamic_ncols=True) as bar:
        for text, nbytes in _documents(files):
            writer.add(tok.encode(text) + [tok.eos_id])
            documents += 1
            bar.update(nbytes)
    writer.flush()
    shards = writer.shards

    index = {"format": FORMAT, "dtype": dtype.name.replace("<", ""), "vocab_size": tok.vocab_size,
             "eos_id": tok.eos_id, "tokenizer": tok.name, "documents": documents,
             "tokens": sum(s["tokens"] for s in shards), "shards": shards}
    if tokenizer:
        shutil.copyfile(tokenizer, os.path.join(out_dir, os.path.basename(tokenizer)))
    with open(os.path.join(out_dir, INDEX), "w") as f:
        json.dump(index, f, indent=1)

    if to_s3:
        for name in sorted(os.listdir(out_dir)):  # the tokenizer; index.json last: readers see complete data
            if name != INDEX:
                upload(name)
        c.upload_file(os.path.join(out_dir, INDEX), bucket, prefix + INDEX)
        shutil.rmtree(out_dir)
    return index
