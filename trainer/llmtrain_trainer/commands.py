"""The trainer's subcommands of the `llmtrain` CLI: `local`, `prepare`, `export` and `scale-test`.

`llmtrain.cli` calls `register(subparsers)` and then `args.func(args)`; each function returns the
process exit code.
"""

from __future__ import annotations

import argparse


def cmd_local(args: argparse.Namespace) -> int:
    import sys

    from .local import run_local

    try:
        from llmtrain.validation import InvalidJob
    except ImportError:  # pragma: no cover - the lead's validation module is part of the package
        InvalidJob = ValueError
    import yaml

    try:
        return _run_local(args, run_local)
    except InvalidJob as err:
        for p in getattr(err, "problems", [err]):
            # A problem with the file itself already starts with its name.
            print(p if getattr(p, "field", None) == args.file else f"{args.file}: {p}", file=sys.stderr)
        return 1
    except OSError as err:
        print(f"llmtrain local: {args.file}: {err.strerror or err}", file=sys.stderr)
        return 1
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        print(f"llmtrain local: {args.file}: not valid YAML{at}: {getattr(err, 'problem', err)}", file=sys.stderr)
        return 1


def _run_local(args: argparse.Namespace, run_local) -> int:
    return run_local(args.file, nproc=args.nproc, max_steps=args.max_steps, checkpoint_uri=args.checkpoint_uri,
                     metrics_port=args.metrics_port, workdir=args.workdir, quiet=args.quiet)


def cmd_prepare(args: argparse.Namespace) -> int:
    import sys

    from .prepare import prepare

    exts = tuple(e if e.startswith(".") else "." + e for e in args.extensions.split(",") if e)
    try:
        index = prepare(args.inputs, args.output, tokenizer=args.tokenizer, eos_id=args.eos_id,
                        shard_tokens=args.shard_tokens, extensions=exts, progress=not args.quiet)
    except (OSError, ValueError) as err:
        print(f"llmtrain prepare: {err}", file=sys.stderr)
        return 1
    print(f"{args.output}: {index['documents']} documents, {index['tokens']:,} tokens in "
          f"{len(index['shards'])} shard(s), {index['dtype']}, vocabulary {index['vocab_size']} "
          f"({index['tokenizer']})")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    import sys

    from .config import load_job_file
    from .export import export

    try:
        _, spec = load_job_file(args.file)
        out = export(spec, args.output, checkpoint_uri=args.checkpoint_uri, step=args.step, dtype=args.dtype,
                     max_shard_gb=args.max_shard_gb)
    except (OSError, ValueError) as err:
        print(f"llmtrain export: {err}", file=sys.stderr)
        return 1
    print(f"{args.output}: {out['parameters']:,} parameters from {out['checkpoint']} as {out['dtype']} in "
          f"{len(out['files'])} file(s)" + (f", tokenizer {out['tokenizer']}" if out["tokenizer"] else ""))
    return 0


def _positive_int(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def cmd_scale_test(args: argparse.Namespace) -> int:
    import sys

    from .scale_test import parse_sizes, run_cluster_scale_test, run_scale_test

    try:
        sizes = parse_sizes(args.sizes)
        if args.cluster or args.kubeconfig:
            result = run_cluster_scale_test(args.file, sizes, kubeconfig=args.kubeconfig, namespace=args.namespace,
                                            max_steps=args.max_steps, samples=args.samples, warmup=args.warmup,
                                            output=args.output, timeout=args.timeout, poll=args.poll)
        else:
            result = run_scale_test(args.file, sizes, max_steps=args.max_steps, warmup=args.warmup,
                                    output=args.output, metrics_port=args.metrics_port)
    except (OSError, ValueError, RuntimeError) as err:
        print(f"llmtrain scale-test: {err}", file=sys.stderr)
        return 1
    print(result["table"])
    print(f"wrote {result['json_path']} and {result['png_path']}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("local", help="run a job on this machine (CPU processes or local GPUs)",
                              description="Run an LLMTrainingJob locally through torchrun, with the job's "
                              "rendezvous backend (a local etcd for etcd jobs). Ctrl-C checkpoints and "
                              "stops; running again resumes.")
    p.add_argument("file", help="LLMTrainingJob YAML file")
    p.add_argument("--nproc", type=int, help="worker processes (default: local GPUs, or "
                   "cluster.processesPerNode / the catalog default on CPU)")
    p.add_argument("--max-steps", type=int, help="override training.maxSteps")
    p.add_argument("--checkpoint-uri", help="override checkpoint.uri (a directory or s3://...)")
    p.add_argument("--metrics-port", type=int, help="base port of the workers' /metrics (default 9410)")
    p.add_argument("--workdir", help="spec copy and worker log (default .llmtrain/<job name>)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    p.set_defaults(func=cmd_local)

    q = subparsers.add_parser("prepare", help="tokenize text files into training shards",
                              description="Turn .txt/.md/.jsonl files into llmtrain-tokens/v1 shards "
                              "(byte-level, or a `tokenizers` tokenizer file).")
    q.add_argument("inputs", nargs="+", help="files or directories")
    q.add_argument("--output", "-o", required=True, help="output directory or s3://bucket/prefix/")
    q.add_argument("--tokenizer", help="a tokenizers JSON file (default: byte-level, vocabulary 256)")
    q.add_argument("--eos-id", type=int, help="end-of-document token id (default: from the tokenizer)")
    q.add_argument("--shard-tokens", type=_positive_int, default=1 << 26, help="tokens per shard (default 2^26)")
    q.add_argument("--quiet", action="store_true", help="no progress bar")
    q.add_argument("--extensions", default=".txt,.md,.jsonl",
                   help="file suffixes to take from directories (default: %(default)s)")
    q.set_defaults(func=cmd_prepare)

    e = subparsers.add_parser("export", help="a checkpoint as a Hugging Face model (safetensors + config.json)",
                              description="Write a job's newest complete checkpoint (or --step) as a Hugging "
                              "Face model directory that transformers, vLLM and the Hub load as is.")
    e.add_argument("file", help="the LLMTrainingJob YAML file the checkpoint belongs to")
    e.add_argument("--output", "-o", required=True, help="output directory")
    e.add_argument("--checkpoint-uri", help="override checkpoint.uri (a directory or s3://...)")
    e.add_argument("--step", type=int, help="checkpoint step (default: the newest complete one)")
    e.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16", help="weight dtype (default bf16)")
    e.add_argument("--max-shard-gb", type=float, default=5.0, help="safetensors file size limit (default 5)")
    e.set_defaults(func=cmd_export)
    t = subparsers.add_parser("scale-test", help="run a job at several sizes; throughput per worker and scaling efficiency",
                              description="Run the same job locally with each number of worker processes in "
                              "--sizes (same global batch: strong scaling) and write a table, scale-test.json "
                              "and scale-test.png (tokens/s per worker and efficiency vs the smallest size).")
    t.add_argument("file", help="LLMTrainingJob YAML file")
    t.add_argument("--sizes", default="1,2,4", help="worker counts, comma-separated (default: %(default)s)")
    t.add_argument("--max-steps", type=int, help="steps per size (default: training.maxSteps)")
    t.add_argument("--warmup", type=int, default=2, help="first steps left out of the medians (default: %(default)s)")
    t.add_argument("--output", "-o", help="output directory (default .llmtrain/<job name>-scale-test)")
    t.add_argument("--metrics-port", type=int, help="base port of the workers' /metrics (default 9410)")
    t.add_argument("--cluster", action="store_true",
                   help="sizes are NODE counts: create the job through the operator at each size, read tokens/s "
                   "and MFU from status.progress, delete it (current kubeconfig context, or --kubeconfig)")
    t.add_argument("--kubeconfig", help="kubeconfig of the cluster (implies --cluster)")
    t.add_argument("--namespace", "-n", default="default", help="namespace of the jobs (--cluster; default: %(default)s)")
    t.add_argument("--samples", type=int, default=5, help="steps read from status per size (--cluster; default: %(default)s)")
    t.add_argument("--timeout", type=float, default=1800, help="seconds per size (--cluster; default: %(default)s)")
    t.add_argument("--poll", type=float, default=5.0, help="seconds between status reads (--cluster; default: %(default)s)")
    t.set_defaults(func=cmd_scale_test)
