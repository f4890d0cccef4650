"""`llmtrain prepare` on several workers: the output is the one-worker output, byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_prepare_inputs import DOCS, _write_format

pytestmark = pytest.mark.trainer


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> str:
    """A small byte-level BPE trained here (the kind of tokenizer a Llama model ships)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        DOCS * 3,
        trainers.BpeTrainer(
            vocab_size=400, special_tokens=["<|end_of_text|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def _corpus(root):
    """Several files of every format; 4 × 40 documents."""
    (root / "b").mkdir(parents=True)
    docs = []
    for k, (rel, fmt) in enumerate(
        [
            ("a.jsonl", ".jsonl"),
            ("b/c.parquet", ".parquet"),
            ("b/d.jsonl.zst", ".jsonl.zst"),
            ("e.jsonl.gz", ".jsonl.gz"),
        ]
    ):
        part = [f"[{k}] {d}" for d in DOCS]
        _write_format(root / rel, fmt, part)
        docs += part
    for k in range(5):
        (root / f"f{k}.txt").write_text(f"plain text file {k}. " * (k + 1))
        docs.append(f"plain text file {k}. " * (k + 1))
    return docs


def _files(out) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


@pytest.mark.parametrize("pool", ["process", "thread"])
def test_prepare_output_is_identical_for_one_and_several_workers(tmp_path, bpe, pool):
    from tokenizers import Tokenizer

    from llmtrain_trainer.data.prepare import prepare

    _corpus(tmp_path / "src")
    kw = {"tokenizer": bpe, "shard_tokens": 1500, "batch_bytes": 700}  # many batches in flight, many shards
    one = prepare([str(tmp_path / "src")], str(tmp_path / "one"), workers=1, **kw)
    many = prepare([str(tmp_path / "src")], str(tmp_path / "many"), workers=3, pool=pool, **kw)
    assert one == many and len(one["shards"]) > 5
    assert _files(tmp_path / "one") == _files(tmp_path / "many")  # shards, index.json, tokenizer: same bytes

    # and that output is the tokenizer's own ids of each document in input order, each + eos
    hf = Tokenizer.from_file(bpe)
    eos = hf.token_to_id("<|end_of_text|>")
    order = sorted(["a.jsonl", "b/c.parquet", "b/d.jsonl.zst", "e.jsonl.gz"] + [f"f{k}.txt" for k in range(5)])
    assert order[:3] == ["a.jsonl", "b/c.parquet", "b/d.jsonl.zst"]  # the sorted walk the test relies on
    expected = []
    for k in range(4):
        for d in DOCS:
            expected += hf.encode(f"[{k}] {d}", add_special_tokens=False).ids + [eos]
    for k in range(5):
        expected += hf.encode(f"plain text file {k}. " * (k + 1), add_special_tokens=False).ids + [eos]
    got = np.concatenate([np.fromfile(tmp_path / "one" / s["file"], dtype="<u2") for s in one["shards"]])
    assert got.tolist() == expected
    assert json.loads((tmp_path / "one" / "index.json").read_text())["documents"] == 4 * len(DOCS) + 5


def test_prepare_refuses_a_tokenizer_with_bpe_dropout(tmp_path, bpe):
    """Dropout segments each call at random: the same corpus would tokenize differently per run."""
    from llmtrain_trainer.data.prepare import prepare

    doc = json.loads(open(bpe).read())
    doc["model"]["dropout"] = 0.1
    bad = tmp_path / "dropout.json"
    bad.write_text(json.dumps(doc))
    (tmp_path / "a.txt").write_text("hello")
    with pytest.raises(ValueError, match="dropout"):
        prepare([str(tmp_path / "a.txt")], str(tmp_path / "out"), tokenizer=str(bad))


def test_a_failing_worker_stops_the_run_with_the_record_named(tmp_path):
    from llmtrain_trainer.data.prepare import prepare

    src = tmp_path / "src"
    src.mkdir()
    for k in range(6):
        (src / f"{k}.jsonl").write_text("".join(json.dumps({"text": f"doc {k}.{i}"}) + "\n" for i in range(50)))
    with open(src / "3.jsonl", "a") as f:
        f.write("{broken\n")
    with pytest.raises(ValueError, match=r"3\.jsonl:51: not a JSON object"):
        prepare([str(src)], str(tmp_path / "out"), workers=2, batch_bytes=64)
    assert not (tmp_path / "out" / "index.json").exists()


def test_one_progress_bar_over_all_workers_and_the_final_report(capsys, tmp_path, bpe):
    """The bar counts input bytes with tokens/s and an ETA; the report: documents, tokens, shards,
    bytes per token, time per stage."""
    from llmtrain.cli import main

    docs = _corpus(tmp_path / "src")
    rc = main(
        [
            "prepare",
            str(tmp_path / "src"),
            "-o",
            str(tmp_path / "out"),
            "--tokenizer",
            bpe,
            "--workers",
            "2",
            "--shard-tokens",
            "1500",
        ]
    )
    out = capsys.readouterr()
    assert rc == 0, out.err
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    bar = out.err.split("\r")
    assert sum("tokenizing" in s for s in bar) >= 1 and "100%" in out.err and "tokens/s" in out.err
    assert "<" in bar[-1] or any("<00:00" in s for s in bar)  # tqdm's elapsed<remaining (ETA)
    text_bytes = sum(len(d.encode()) for d in docs)
    body = index["tokens"] - index["documents"]
    assert f"{index['documents']:,} documents, {index['tokens']:,} tokens in {len(index['shards'])} shard(s)" in out.err
    assert f"{text_bytes / body:.2f} bytes per token" in out.err
    for stage in ("list", "read", "tokenize", "write", "total"):
        assert f"{stage} " in out.err.split("time: ")[1]


def test_the_llmtrain_script_imports_nothing_a_spawned_worker_would_not_use():
    """Each worker that spawn starts re-runs the imports of the script its parent runs: the
    `llmtrain` console script's module must not pull in the spec, pydantic, jinja2 or yaml."""
    import subprocess
    import sys
    import tomllib

    root = Path(__file__).resolve().parents[2]
    script = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]["llmtrain"]
    heavy = ("llmtrain.spec", "llmtrain.cli", "pydantic", "jinja2", "yaml", "torch")
    module = script.split(":")[0]
    code = f"import sys, {module}; print(','.join(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "", f"{script} imports {out.strip()}"
    # and it still is the whole command, as a script and as `python -m llmtrain`
    for argv in (
        [sys.executable, "-m", "llmtrain", "--help"],
        [str(Path(sys.executable).parent / "llmtrain"), "--help"],
    ):
        r = subprocess.run(argv, capture_output=True, text=True, check=True)
        assert "prepare" in r.stdout and "validate" in r.stdout
