"""`llmtrain prepare` inputs: each format read as what it is, a bad input or record refused by name."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.trainer


def cli(capsys, *argv) -> tuple[int, str]:
    from llmtrain.cli import main

    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out + out.err


def _parquet_bytes(tmp_path) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["a parquet row"] * 50, "n": list(range(50))}), tmp_path / "t.parquet")
    return (tmp_path / "t.parquet").read_bytes()


@pytest.mark.parametrize("name", ["corpus.arrow", "corpus.bin", "corpus"])
def test_prepare_refuses_an_input_of_unknown_format_by_name(capsys, tmp_path, name):
    """Defect: any named file was tokenized as text (a parquet file: its raw bytes, exit 0)."""
    src = tmp_path / name
    src.write_bytes(_parquet_bytes(tmp_path))
    rc, out = cli(capsys, "prepare", str(src), "-o", str(tmp_path / "out"))
    assert rc == 1 and name in out and "format" in out and ".jsonl" in out and "Traceback" not in out
    assert not (tmp_path / "out" / "index.json").exists()


def test_prepare_refuses_binary_data_under_a_text_suffix(capsys, tmp_path):
    """Defect: undecodable bytes became U+FFFD and the file went through as a document."""
    src = tmp_path / "notes.txt"
    src.write_bytes(_parquet_bytes(tmp_path))
    rc, out = cli(capsys, "prepare", str(src), "-o", str(tmp_path / "out"))
    assert rc == 1 and "notes.txt" in out and ("UTF-8" in out or "NUL" in out) and "Traceback" not in out
    assert not (tmp_path / "out" / "index.json").exists()


def test_prepare_refuses_an_undecodable_jsonl_line_by_its_number(capsys, tmp_path):
    src = tmp_path / "docs.jsonl"
    src.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    rc, out = cli(capsys, "prepare", str(src), "-o", str(tmp_path / "out"))
    assert rc == 1 and "docs.jsonl:2" in out and "UTF-8" in out and "Traceback" not in out


# ----------------------------------------------------------------------------------------------
# Formats: the same documents in every format give the same token stream.

DOCS = [f"document {i}: " + "naïve café, the quick brown fox. " * (3 + i % 7) + "\n" * (i % 2) for i in range(40)]


def _byte_tokens(docs) -> bytes:
    """Byte-level prepare's stream, computed independently: each document's UTF-8, then NUL (eos 0)."""
    return b"".join(d.encode("utf-8") + b"\0" for d in docs)


def _stream(out) -> bytes:
    import json as _json

    import numpy as np

    index = _json.loads((out / "index.json").read_text())
    arr = np.concatenate([np.fromfile(out / s["file"], dtype="<u2") for s in index["shards"]])
    assert arr.max() < 256
    return bytes(arr.astype(np.uint8))


def _jsonl(docs, field="text") -> bytes:
    import json as _json

    return b"".join(_json.dumps({field: d, "id": i}).encode() + b"\n" for i, d in enumerate(docs))


def _write_parquet(path, docs, column="text", row_group_size=7):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": list(range(len(docs))), column: docs}), path, row_group_size=row_group_size)


def _write_format(path, fmt: str, docs) -> None:
    import gzip

    import zstandard

    if fmt == ".jsonl":
        path.write_bytes(_jsonl(docs))
    elif fmt == ".jsonl.gz":
        path.write_bytes(gzip.compress(_jsonl(docs)))
    elif fmt == ".jsonl.zst":
        # two frames, as `cat a.zst b.zst` makes: one stream
        half = len(docs) // 2
        c = zstandard.ZstdCompressor()
        path.write_bytes(c.compress(_jsonl(docs[:half])) + c.compress(_jsonl(docs[half:])))
    elif fmt == ".parquet":
        _write_parquet(path, docs)


@pytest.mark.parametrize("fmt", [".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet"])
def test_prepare_reads_each_format_as_its_documents(tmp_path, fmt):
    from llmtrain_trainer.data.prepare import prepare

    src = tmp_path / f"corpus{fmt}"
    _write_format(src, fmt, DOCS)
    # small batches: the file is read in many of them (parquet: row batches across row groups)
    index = prepare([str(src)], str(tmp_path / "out"), shard_tokens=1000, batch_bytes=500, workers=1)
    assert index["documents"] == len(DOCS)
    assert _stream(tmp_path / "out") == _byte_tokens(DOCS)


def test_prepare_text_files_are_one_document_each_in_sorted_path_order(tmp_path):
    from llmtrain_trainer.data.prepare import prepare

    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    # code-point order of the relative paths: "a.md" < "a/z.txt" ('.' < '/') < "b.txt"
    for rel, doc in [("b.txt", "third"), ("a/z.txt", "second"), ("a.md", "first"), ("a/skip.csv", "x")]:
        (src / rel).write_text(doc)
    index = prepare([str(src)], str(tmp_path / "out"), workers=1)
    assert index["documents"] == 3
    assert _stream(tmp_path / "out") == _byte_tokens(["first", "second", "third"])


def test_prepare_parquet_text_column_is_configurable(capsys, tmp_path):
    src = tmp_path / "data.parquet"
    _write_parquet(src, DOCS[:5], column="content")
    rc, out = cli(capsys, "prepare", str(src), "-o", str(tmp_path / "out"), "--quiet")
    assert rc == 1 and "data.parquet" in out and "'text'" in out and "content" in out and "--text-field" in out
    rc, out = cli(capsys, "prepare", str(src), "-o", str(tmp_path / "out"), "--text-field", "content", "--quiet")
    assert rc == 0, out
    assert _stream(tmp_path / "out") == _byte_tokens(DOCS[:5])


def test_prepare_names_the_parquet_row_of_a_null_or_non_string_text(capsys, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["a", "b", None, "d"]}), tmp_path / "nulls.parquet", row_group_size=2)
    rc, out = cli(capsys, "prepare", str(tmp_path / "nulls.parquet"), "-o", str(tmp_path / "o1"))
    assert rc == 1 and "nulls.parquet: row 2" in out and "null" in out and "Traceback" not in out
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "ints.parquet")
    rc, out = cli(capsys, "prepare", str(tmp_path / "ints.parquet"), "-o", str(tmp_path / "o2"))
    assert rc == 1 and "ints.parquet" in out and "not a string column" in out


@pytest.mark.parametrize("fmt", [".jsonl.gz", ".jsonl.zst"])
def test_prepare_names_the_line_of_a_bad_record_inside_a_compressed_file(capsys, tmp_path, fmt):
    import gzip

    import zstandard

    body = _jsonl(DOCS[:3]) + b'{"text": 7}\n'
    src = tmp_path / f"c{fmt}"
    src.write_bytes(gzip.compress(body) if fmt == ".jsonl.gz" else zstandard.ZstdCompressor().compress(body))
    rc, out = cli(capsys, "prepare", str(src), "-o", str(tmp_path / "out"))
    assert rc == 1 and f"c{fmt}:4" in out and '"text"' in out and "Traceback" not in out


def test_prepare_refuses_a_corrupt_compressed_file_by_name(capsys, tmp_path):
    src = tmp_path / "broken.jsonl.gz"
    src.write_bytes(b"\x1f\x8b\x08\x00 this is not deflate data at all")
    rc, out = cli(capsys, "prepare", str(src), "-o", str(tmp_path / "out"))
    assert rc == 1 and "broken.jsonl.gz" in out and "corrupt" in out and "Traceback" not in out


def test_prepare_bounds_a_record_without_reading_past_the_bound(capsys, tmp_path):
    """A 'line' of 3 MB (a binary blob, a missing newline) is refused at the bound, by line number."""
    src = tmp_path / "long.jsonl"
    src.write_bytes(_jsonl(DOCS[:2]) + b'{"text": "' + b"x" * 3_000_000 + b'"}\n')
    rc, out = cli(capsys, "prepare", str(src), "-o", str(tmp_path / "out"), "--max-document-bytes", "1000000")
    assert rc == 1 and "long.jsonl:3" in out and "1,000,000" in out and "--max-document-bytes" in out
    big = tmp_path / "big.txt"
    big.write_text("y" * 2_000_000)
    rc, out = cli(capsys, "prepare", str(big), "-o", str(tmp_path / "out"), "--max-document-bytes", "1000000")
    assert rc == 1 and "big.txt" in out and "--max-document-bytes" in out


def test_prepare_refuses_an_unknown_extension_option(capsys, tmp_path):
    rc, out = cli(capsys, "prepare", str(tmp_path), "-o", str(tmp_path / "out"), "--extensions", ".txt,.csv")
    assert rc == 1 and ".csv" in out and ".parquet" in out


def test_prepare_from_an_s3_prefix_equals_the_same_files_on_disk(tmp_path, s3):
    """A prefix expands in key order (= the local sorted path order); parquet is read through ranged
    GETs, zstd JSONL streamed."""
    import boto3

    from llmtrain_trainer.data.prepare import prepare

    local = tmp_path / "corpus"
    (local / "part").mkdir(parents=True)
    files = {
        "part/0001.parquet": DOCS[:15],
        "part/0002.jsonl.zst": DOCS[15:30],
        "readme.md": [DOCS[30]],
        "z.jsonl.gz": DOCS[31:],
    }
    c = boto3.client("s3")
    c.create_bucket(Bucket="corpus")
    for rel, docs in files.items():
        p = local / rel
        if rel.endswith(".md"):
            p.write_text(docs[0])
        else:
            _write_format(p, next(f for f in (".parquet", ".jsonl.zst", ".jsonl.gz") if rel.endswith(f)), docs)
        c.upload_file(str(p), "corpus", f"hf/data/{rel}")
    c.put_object(Bucket="corpus", Key="hf/data/notes.csv", Body=b"not selected")
    a = prepare([str(local)], str(tmp_path / "a"), shard_tokens=900, workers=1)
    b = prepare(["s3://corpus/hf/data/"], str(tmp_path / "b"), shard_tokens=900, workers=1)
    assert a == b and a["documents"] == len(DOCS)
    assert _stream(tmp_path / "b") == _byte_tokens(DOCS)
    one = prepare(["s3://corpus/hf/data/part/0001.parquet"], str(tmp_path / "c"), workers=1)
    assert one["documents"] == 15


def test_prepare_names_a_missing_bucket(capsys, tmp_path, s3):
    rc, out = cli(capsys, "prepare", "s3://no-such-bucket/data/", "-o", str(tmp_path / "out"))
    assert rc == 1 and "s3://no-such-bucket/data/" in out and "NoSuchBucket" in out and "Traceback" not in out
