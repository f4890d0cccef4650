"""`llmtrain local` / `llmtrain prepare` on bad input: one clear line (what, why), exit 1, no traceback."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.trainer


def cli(capsys, *argv) -> tuple[int, str]:
    from llmtrain.cli import main

    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_local_missing_job_file(capsys, tmp_path):
    rc, out = cli(capsys, "local", str(tmp_path / "nope.yaml"))
    assert rc == 1 and "nope.yaml" in out and "No such file" in out and "Traceback" not in out


def test_local_malformed_job_file(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: llmtrain.dev/v1alpha1\nkind: LLMTrainingJob\nspec: {model: [\n")
    rc, out = cli(capsys, "local", str(bad))
    assert rc == 1 and "bad.yaml" in out and "YAML" in out and "line" in out and "Traceback" not in out


def _text(tmp_path, body: str):
    src = tmp_path / "in.jsonl"
    src.write_text(body)
    return str(src)


def test_prepare_jsonl_line_without_text(capsys, tmp_path):
    src = _text(tmp_path, json.dumps({"text": "ok"}) + "\n" + json.dumps({"content": "x"}) + "\n")
    rc, out = cli(capsys, "prepare", src, "-o", str(tmp_path / "out"))
    assert rc == 1 and "in.jsonl:2" in out and '"text"' in out and "Traceback" not in out


def test_prepare_jsonl_line_not_json(capsys, tmp_path):
    src = _text(tmp_path, json.dumps({"text": "ok"}) + "\n{not json\n")
    rc, out = cli(capsys, "prepare", src, "-o", str(tmp_path / "out"))
    assert rc == 1 and "in.jsonl:2" in out and "JSON" in out and "Traceback" not in out


@pytest.mark.parametrize("content", [None, "this is not a tokenizer"])
def test_prepare_bad_tokenizer(capsys, tmp_path, content):
    tok = tmp_path / "tokenizer.json"
    if content is not None:
        tok.write_text(content)
    rc, out = cli(
        capsys, "prepare", _text(tmp_path, '{"text": "hi"}\n'), "-o", str(tmp_path / "out"), "--tokenizer", str(tok)
    )
    assert rc == 1 and "tokenizer.json" in out and "Traceback" not in out
    assert "--tokenizer" in out


@pytest.mark.parametrize("eos", ["256", "-1"])
def test_prepare_eos_id_outside_the_vocabulary(capsys, tmp_path, eos):
    """An eos id ≥ the vocabulary would index past the embedding table in training."""
    rc, out = cli(capsys, "prepare", _text(tmp_path, '{"text": "hi"}\n'), "-o", str(tmp_path / "out"), "--eos-id", eos)
    assert rc == 1 and "--eos-id" in out and "0..255" in out
    assert not (tmp_path / "out" / "index.json").exists()
