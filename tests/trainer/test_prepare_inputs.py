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
