"""`llmtrain prepare` throughput vs `tokenizers`' own `encode_batch`, same corpus, same cores, same run.

1. A deterministic corpus of `--mb` MB, written as `--files` files: `--corpus english` (the default),
   English-like text (words drawn by a seeded generator from a Zipf-like vocabulary, documents of
   0.5–8 KB) as .jsonl; or `--corpus python`, code: the `.py` files of this Python's standard
   library in path order, one document per file (a few bytes to a few hundred KB), as .parquet
   with a `text` column. And a byte-level BPE tokenizer (the GPT-2 / Llama 3 kind) trained on it
   with `tokenizers`' trainer, `--vocab` tokens — or `--tokenizer` a real tokenizer.json.
2. The ceiling: the same documents, already in memory, through one `Tokenizer.encode_batch` call per
   batch of `--batch-docs` documents, with tokenizers' Rayon pool on every core, reading each
   Encoding's ids (the least any consumer does). Also `encode_batch_fast` (no offsets).
3. `llmtrain prepare` (run_prepare) on the files: reading, JSON parsing, tokenizing, shard writing,
   with process workers on every core (the default), and with thread workers (one shared
   tokenizer, Rayon inside) for comparison; and `llmtrain prepare` the command, as a user runs it
   (its own process and start-up included).

MB/s = UTF-8 text bytes of the documents / wall seconds. CPU s/MB = CPU seconds of this process and
its (reaped) worker processes per MB: the work each way costs, which a loaded machine disturbs less
than the wall time. Prints each and prepare ÷ encode_batch, the
command's too (target ≥ 1.0×); `--output` writes the figures as JSON. The phases alternate for `--rounds` and
the median is taken, so a neighbour's load spreads over all of them.

    .venv/bin/python bench/prepare_throughput.py                 # 16 MB corpus
    .venv/bin/python bench/prepare_throughput.py --mb 4 --rounds 1   # quick, for a loaded machine
    .venv/bin/python bench/prepare_throughput.py --corpus python --mb 8   # code, in parquet
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from provenance import provenance

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [p for p in (str(REPO / "trainer"), str(REPO / "operator")) if p not in sys.path]


def make_corpus(root: Path, mb: float, files: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    syll = [
        "ka",
        "to",
        "ri",
        "mon",
        "el",
        "sa",
        "the",
        "an",
        "ver",
        "di",
        "lo",
        "qu",
        "is",
        "ne",
        "or",
        "pa",
        "st",
        "ing",
        "ed",
        "un",
        "re",
        "al",
        "co",
        "mi",
    ]
    words = ["".join(rng.choice(syll) for _ in range(rng.randint(1, 4))) for _ in range(20000)]
    weights = [1 / (r + 1) for r in range(len(words))]  # Zipf: a few words are most of the text
    target = int(mb * 1e6)
    docs, size = [], 0
    while size < target:
        n = rng.randint(80, 1300)
        sent, out = [], []
        for w in rng.choices(words, weights, k=n):
            sent.append(w)
            if rng.random() < 0.08:
                out.append(" ".join(sent).capitalize() + rng.choice([".", ".", "?", ", é."]))
                sent = []
        doc = " ".join(out + [" ".join(sent)]).strip() + "\n"
        docs.append(doc)
        size += len(doc.encode())
    root.mkdir(parents=True, exist_ok=True)
    per = -(-len(docs) // files)
    for k in range(files):
        with open(root / f"part-{k:04d}.jsonl", "w") as f:
            f.writelines(json.dumps({"text": d}) + "\n" for d in docs[k * per : (k + 1) * per])
    return docs


def make_python_corpus(root: Path, mb: float, files: int) -> list[str]:
    """The standard library's .py files (UTF-8, no NUL), in path order, until `mb` MB: as parquet."""
    import sysconfig

    import pyarrow as pa
    import pyarrow.parquet as pq

    docs, size, target = [], 0, int(mb * 1e6)
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if size >= target:
            break
        try:
            doc = path.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if doc.strip() and "\0" not in doc:
            docs.append(doc)
            size += len(doc.encode())
    if size < target:
        raise SystemExit(f"--corpus python: this Python's standard library has only {size / 1e6:.1f} MB of sources")
    root.mkdir(parents=True, exist_ok=True)
    per = -(-len(docs) // files)
    for k in range(files):
        pq.write_table(pa.table({"text": docs[k * per : (k + 1) * per]}), root / f"part-{k:04d}.parquet")
    return docs


def train_tokenizer(docs: list[str], vocab: int, path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        docs[: max(200, len(docs) // 4)],
        trainers.BpeTrainer(
            vocab_size=vocab, special_tokens=["<|end_of_text|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tok.save(str(path))


def encode_batch_seconds(tok_path: str, docs: list[str], batch: int, fast: bool) -> tuple[float, int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tok_path)
    encode = tok.encode_batch_fast if fast else tok.encode_batch
    t0 = time.perf_counter()
    n = 0
    for i in range(0, len(docs), batch):
        for e in encode(docs[i : i + batch], add_special_tokens=False):
            n += len(e.ids)
    return time.perf_counter() - t0, n


def prepare_seconds(src: Path, out: Path, tok_path: str, pool: str, workers: int) -> tuple[float, dict]:
    from llmtrain_trainer.data.prepare import run_prepare

    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    r = run_prepare([str(src)], str(out), tokenizer=tok_path, workers=workers, pool=pool)
    return time.perf_counter() - t0, {
        "tokens": r.report.tokens,
        "documents": r.report.documents,
        "stages": r.report.stages,
        "bytes_per_token": r.report.bytes_per_token,
    }


def cli_seconds(src: Path, out: Path, tok_path: str, workers: int) -> float:
    """`llmtrain prepare` as a user runs it: its own process, the console script, its defaults."""
    import subprocess

    shutil.rmtree(out, ignore_errors=True)
    argv = [str(Path(sys.executable).parent / "llmtrain"), "prepare", str(src), "-o", str(out)]
    t0 = time.perf_counter()
    subprocess.run([*argv, "--tokenizer", tok_path, "--workers", str(workers)], check=True, capture_output=True)
    return time.perf_counter() - t0


def _cpu_seconds() -> float:
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", choices=("english", "python"), default="english", help="what the documents are")
    ap.add_argument("--mb", type=float, default=16, help="corpus size in MB of text (default %(default)s)")
    ap.add_argument("--files", type=int, default=8, help="jsonl files (default %(default)s)")
    ap.add_argument("--vocab", type=int, default=8192, help="BPE vocabulary to train (default %(default)s)")
    ap.add_argument("--tokenizer", help="a tokenizer.json to use instead of training one")
    ap.add_argument("--batch-docs", type=int, default=1000, help="documents per encode_batch call")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds; medians reported")
    ap.add_argument("--no-threads", action="store_true", help="skip the thread-pool variant of prepare")
    ap.add_argument("--output", help="write the figures as JSON here")
    args = ap.parse_args(argv)

    from llmtrain_trainer.data.prepare import default_workers

    cores = default_workers()
    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="prepare-bench-"))
    try:
        make = make_python_corpus if args.corpus == "python" else make_corpus
        docs = make(work / "corpus", args.mb, args.files)
        text_mb = sum(len(d.encode()) for d in docs) / 1e6
        tok_path = args.tokenizer or str(work / "tokenizer.json")
        if not args.tokenizer:
            train_tokenizer(docs, args.vocab, Path(tok_path))
        phases = {
            "encode_batch": lambda: encode_batch_seconds(tok_path, docs, args.batch_docs, False)[0],
            "encode_batch_fast": lambda: encode_batch_seconds(tok_path, docs, args.batch_docs, True)[0],
            "prepare (processes)": lambda: prepare_seconds(work / "corpus", work / "out", tok_path, "process", cores)[
                0
            ],
        }
        phases["prepare (CLI)"] = lambda: cli_seconds(work / "corpus", work / "out", tok_path, cores)
        if not args.no_threads:
            phases["prepare (threads)"] = lambda: prepare_seconds(
                work / "corpus", work / "out", tok_path, "thread", cores
            )[0]
        times: dict[str, list[float]] = {k: [] for k in phases}
        cpu: dict[str, list[float]] = {k: [] for k in phases}
        for _ in range(args.rounds):
            for name, fn in phases.items():
                c0 = _cpu_seconds()
                times[name].append(fn())
                cpu[name].append(_cpu_seconds() - c0)
        _, detail = prepare_seconds(work / "corpus", work / "out", tok_path, "process", cores)
        mbps = {k: text_mb / statistics.median(v) for k, v in times.items()}
        base = mbps["encode_batch"]
        print(
            f"corpus ({args.corpus}): {len(docs):,} documents, {text_mb:.1f} MB of text in {args.files} files; "
            f"{detail['tokens']:,} tokens ({detail['bytes_per_token']:.2f} bytes/token); {cores} cores; "
            f"median of {args.rounds} round(s)"
        )
        cpu_per_mb = {k: statistics.median(v) / text_mb for k, v in cpu.items()}
        for k, v in mbps.items():
            print(f"  {k:<22} {v:8.2f} MB/s   {v / base:5.2f}× encode_batch   {cpu_per_mb[k]:6.2f} CPU s/MB")
        print("  prepare stages (last run): " + ", ".join(f"{k} {s:.2f} s" for k, s in detail["stages"].items()))
        ratio = mbps["prepare (processes)"] / base
        cpu_ratio = cpu_per_mb["prepare (processes)"] / cpu_per_mb["encode_batch"]
        cli_ratio = mbps["prepare (CLI)"] / base
        cli_cpu_ratio = cpu_per_mb["prepare (CLI)"] / cpu_per_mb["encode_batch"]
        print(f"prepare / encode_batch = {ratio:.2f}× (target ≥ 1.0×); CPU per MB {cpu_ratio:.2f}× encode_batch's")
        print(f"the command / encode_batch = {cli_ratio:.2f}×; CPU per MB {cli_cpu_ratio:.2f}× encode_batch's")
        if args.output:
            Path(args.output).write_text(
                json.dumps(
                    {
                        **provenance(load_before),
                        "cores": cores,
                        "corpus": args.corpus,
                        "documents": len(docs),
                        "text_mb": text_mb,
                        "tokens": detail["tokens"],
                        "rounds": args.rounds,
                        "seconds": times,
                        "cpu_seconds": cpu,
                        "MBps": mbps,
                        "ratio_prepare_to_encode_batch": ratio,
                        "cpu_s_per_mb": cpu_per_mb,
                        "cpu_ratio_prepare_to_encode_batch": cpu_ratio,
                        "ratio_cli_to_encode_batch": cli_ratio,
                        "cpu_ratio_cli_to_encode_batch": cli_cpu_ratio,
                        "prepare_stages_s": detail["stages"],
                    },
                    indent=1,
                )
                + "\n"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
