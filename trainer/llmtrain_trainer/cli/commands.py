"""The trainer's subcommands of the `llmtrain` CLI: `local`, `prepare`, `export` and `scale-test`.

`llmtrain.cli` calls `register(subparsers)` and then `args.func(args)`; each function returns the
process exit code.
"""

from __future__ import annotations

import argparse

from llmtrain.pod_contract import METRICS_PORT


def cmd_local(args: argparse.Namespace) -> int:
    import sys

    from .local import run_local

    try:
        from llmtrain.validation import InvalidJob
    except ImportError:  # pragma: no cover - the lead's validation module is part of the package
        InvalidJob = ValueError  # type: ignore[misc,assignment]  # noqa: N806 - the class it stands in for
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
    return run_local(
        args.file,
        nproc=args.nproc,
        max_steps=args.max_steps,
        checkpoint_uri=args.checkpoint_uri,
        metrics_port=args.metrics_port,
        workdir=args.workdir,
        quiet=args.quiet,
        in_place_restarts=args.in_place_restarts,
    )


def cmd_prepare(args: argparse.Namespace) -> int:
    import sys
    from concurrent.futures import BrokenExecutor

    from ..data.prepare import run_prepare

    if args.status or args.cluster or args.manifest:
        return _prepare_cluster(args)
    if not args.inputs or not args.output:
        print("llmtrain prepare: give the inputs (files, directories or s3:// prefixes) and --output", file=sys.stderr)
        return 1
    try:
        result = run_prepare(
            args.inputs,
            args.output,
            tokenizer=args.tokenizer,
            eos_id=args.eos_id,
            shard_tokens=args.shard_tokens,
            extensions=tuple(args.extensions.split(",")),
            text_field=args.text_field,
            max_record_bytes=args.max_document_bytes,
            workers=args.workers,
            progress=not args.quiet,
        )
    except (OSError, ValueError) as err:
        print(f"llmtrain prepare: {err}", file=sys.stderr)
        return 1
    except BrokenExecutor as err:  # a worker process killed (out of memory: lower --workers)
        print(f"llmtrain prepare: a tokenizer worker died ({err}); out of memory? try fewer --workers", file=sys.stderr)
        return 1
    index = result.index
    print(
        f"{args.output}: {index['documents']} documents, {index['tokens']:,} tokens in "
        f"{len(index['shards'])} shard(s), {index['dtype']}, vocabulary {index['vocab_size']} "
        f"({index['tokenizer']})"
    )
    for line in result.report.lines():
        print(line, file=sys.stderr)
    return 0


def _prepare_cluster(args: argparse.Namespace) -> int:
    """--cluster (plan + render/apply the Indexed Job), --manifest (one index, as a pod runs it; or
    --merge), --status NAME (the Job's indexes and the merge). Their errors become the exit code
    here, in one place: a bad input under --manifest is EXIT_BAD_INPUT, which the Job's pod failure
    policy fails the index on at once instead of retrying it."""
    import sys

    from ..data import prepare_cluster as pc

    try:
        if args.status:
            return _prepare_status(args)
        if args.manifest:
            output = args.manifest.rsplit("/", 1)[0] + "/" if args.manifest.endswith(pc.MANIFEST) else args.manifest
            return _prepare_merge(output) if args.merge else _prepare_index(args, output)
        return _prepare_submit(args)
    except ValueError as err:
        print(f"llmtrain prepare: {err}", file=sys.stderr)
        return pc.EXIT_BAD_INPUT if args.manifest else 1
    except OSError as err:
        print(f"llmtrain prepare: {err}", file=sys.stderr)
        return 1


def _prepare_status(args: argparse.Namespace) -> int:
    """--status NAME: the Job's succeeded/failed indexes, and the merged index when it is readable."""
    import sys

    from kubernetes.client import BatchV1Api
    from kubernetes.client.rest import ApiException

    from ..data import prepare_cluster as pc
    from .scale_test import _api

    try:
        job = BatchV1Api(_api(args.kubeconfig)).read_namespaced_job(args.status, args.namespace)
    except ApiException as err:
        print(f"llmtrain prepare --status: job {args.namespace}/{args.status}: {err.reason}", file=sys.stderr)
        return 1
    st = pc.job_status(_api(args.kubeconfig).sanitize_for_serialization(job))
    try:
        data = pc.read_object(st["output"], pc.INDEX) if st["output"] else None
        merged = pc.parse_json(data, st["output"]) if data else None
    except (OSError, ValueError, ImportError) as err:  # no S3 credentials here: say so, not fail
        merged = f"unknown ({err})"  # type: ignore[assignment]  # status_lines prints either
    print("\n".join(pc.status_lines(st, merged)))
    return 0


def _prepare_merge(output: str) -> int:
    """--manifest URI --merge: merge the parts' indexes under `output` now."""
    import sys

    from ..data import prepare_cluster as pc

    merged = pc.merge(output)
    if merged is None:
        print(f"llmtrain prepare --merge: {output}: parts are missing; nothing merged", file=sys.stderr)
        return 1
    print(
        f"{output}{pc.INDEX}: {merged['documents']:,} documents, {merged['tokens']:,} tokens "
        f"in {len(merged['shards'])} shards from {merged['parts']} parts"
    )
    return 0


def _prepare_index(args: argparse.Namespace, output: str) -> int:
    """--manifest URI: run one index of the manifest under `output` (what each pod of the Job runs)."""
    import os
    import sys

    from ..data import prepare_cluster as pc

    k = args.index if args.index is not None else os.environ.get("JOB_COMPLETION_INDEX")
    if k is None:
        print("llmtrain prepare --manifest: no --index and no JOB_COMPLETION_INDEX", file=sys.stderr)
        return 1
    r = pc.run_index(output, int(k), workers=args.workers, progress=not args.quiet)
    print(
        f"index {r['index']}: "
        + (
            "already complete, skipped"
            if r["skipped"]
            else f"{r['part']['documents']:,} documents, {r['part']['tokens']:,} tokens"
        )
    )
    if r["report"] is not None:
        for line in r["report"].lines():
            print(line, file=sys.stderr)
    print(f"merged {output}{pc.INDEX}" if r["merged"] else "merge: waiting for other indexes")
    return 0


def _prepare_submit(args: argparse.Namespace) -> int:
    """--cluster: plan the corpus (the manifest and the tokenizer to --output), then print the
    Indexed Job, or with --apply create it."""
    import sys

    import yaml

    from ..data import prepare_cluster as pc

    if not args.inputs or not args.output:
        print("llmtrain prepare --cluster: give the inputs and --output (an s3:// prefix)", file=sys.stderr)
        return 1
    if not args.output.startswith("s3://") and not args.allow_local_output:
        print("llmtrain prepare --cluster: --output must be an s3:// prefix every pod can write", file=sys.stderr)
        return 1
    env = dict(e.split("=", 1) for e in args.env or [])
    pc.plan(
        args.inputs,
        args.output,
        indexes=args.indexes,
        tokenizer=args.tokenizer,
        eos_id=args.eos_id,
        shard_tokens=args.shard_tokens,
        extensions=tuple(args.extensions.split(",")),
        text_field=args.text_field,
        max_record_bytes=args.max_document_bytes,
    )
    job = pc.render_job(
        args.output,
        args.indexes,
        name=args.name,
        namespace=args.namespace,
        parallelism=args.parallelism,
        image=args.image,
        cpus=args.cpus,
        memory_gib=args.memory_gib,
        service_account=args.service_account,
        env=env,
    )
    if not args.apply:
        print(yaml.safe_dump(job, sort_keys=False), end="")
        return 0
    from kubernetes.client import BatchV1Api
    from kubernetes.client.rest import ApiException

    from .scale_test import _api

    try:
        BatchV1Api(_api(args.kubeconfig)).create_namespaced_job(args.namespace, job)
    except ApiException as err:
        hint = (
            " (it exists: `kubectl delete job` it to re-run; completed indexes are skipped)"
            if err.status == 409
            else ""
        )
        print(
            f"llmtrain prepare --cluster: job {args.namespace}/{job['metadata']['name']}: {err.reason}{hint}",
            file=sys.stderr,
        )
        return 1
    print(
        f"job {args.namespace}/{job['metadata']['name']} created: {args.indexes} indexes; "
        f"llmtrain prepare --status {job['metadata']['name']} -n {args.namespace}"
    )
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    import sys

    from ..config import load_job_file
    from .export import export

    try:
        _, spec = load_job_file(args.file)
        out = export(
            spec,
            args.output,
            checkpoint_uri=args.checkpoint_uri,
            step=args.step,
            dtype=args.dtype,
            max_shard_gb=args.max_shard_gb,
        )
    except (OSError, ValueError) as err:
        print(f"llmtrain export: {err}", file=sys.stderr)
        return 1
    print(
        f"{args.output}: {out['parameters']:,} parameters from {out['checkpoint']} as {out['dtype']} in "
        f"{len(out['files'])} file(s)" + (f", tokenizer {out['tokenizer']}" if out["tokenizer"] else "")
    )
    return 0


def _in_place_restarts(text: str) -> int:
    from llmtrain.spec import MAX_IN_PLACE_RESTARTS

    n = int(text)
    if not 0 <= n <= MAX_IN_PLACE_RESTARTS:
        raise argparse.ArgumentTypeError(
            f"must be 0..{MAX_IN_PLACE_RESTARTS} (spec.resilience.inPlaceRestarts), got {n}"
        )
    return n


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
            result = run_cluster_scale_test(
                args.file,
                sizes,
                kubeconfig=args.kubeconfig,
                namespace=args.namespace,
                max_steps=args.max_steps,
                samples=args.samples,
                warmup=args.warmup,
                output=args.output,
                timeout=args.timeout,
                poll=args.poll,
            )
        else:
            result = run_scale_test(
                args.file,
                sizes,
                max_steps=args.max_steps,
                warmup=args.warmup,
                output=args.output,
                metrics_port=args.metrics_port,
            )
    except (OSError, ValueError, RuntimeError) as err:
        print(f"llmtrain scale-test: {err}", file=sys.stderr)
        return 1
    print(result["table"])
    print(f"wrote {result['json_path']} and {result['png_path']}")
    return 0


def register(subparsers) -> None:
    """The trainer's subcommands, in the order `llmtrain --help` lists them."""
    _register_local(subparsers)
    _register_prepare(subparsers)
    _register_export(subparsers)
    _register_scale_test(subparsers)


def _register_local(subparsers) -> None:
    p = subparsers.add_parser(
        "local",
        help="run a job on this machine (CPU processes or local GPUs)",
        description="Run an LLMTrainingJob locally through torchrun, with the job's "
        "rendezvous backend (a local etcd for etcd jobs). Ctrl-C checkpoints and "
        "stops; running again resumes.",
    )
    p.add_argument("file", help="LLMTrainingJob YAML file")
    p.add_argument(
        "--nproc",
        type=int,
        help="worker processes (default: local GPUs, or cluster.processesPerNode / the catalog default on CPU)",
    )
    p.add_argument("--max-steps", type=int, help="override training.maxSteps")
    p.add_argument("--checkpoint-uri", help="override checkpoint.uri (a directory or s3://...)")
    p.add_argument("--metrics-port", type=int, help=f"base port of the workers' /metrics (default {METRICS_PORT})")
    p.add_argument("--workdir", help="spec copy and worker log (default .llmtrain/<job name>)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    p.add_argument(
        "--in-place-restarts",
        type=_in_place_restarts,
        metavar="N",
        help="override spec.resilience.inPlaceRestarts: times torchrun restarts a failed worker process in "
        "place, resuming from the newest checkpoint, as on a pod (0: the first failure ends the run)",
    )
    p.set_defaults(func=cmd_local)


def _register_prepare(subparsers) -> None:
    from ..data.sources import DEFAULT_MAX_RECORD_BYTES, FORMATS

    q = subparsers.add_parser(
        "prepare",
        help="tokenize text files into training shards",
        description="Turn .txt/.md, .jsonl(.gz/.zst) and parquet files (local or "
        "s3://) into llmtrain-tokens/v1 shards (byte-level, or a `tokenizers` "
        "tokenizer file), on every core; the output does not depend on --workers.",
    )
    q.add_argument("inputs", nargs="*", help="files, directories or s3://bucket/prefix/ (sorted, recursive)")
    q.add_argument("--output", "-o", help="output directory or s3://bucket/prefix/")
    q.add_argument("--tokenizer", help="a tokenizers JSON file (default: byte-level, vocabulary 256)")
    q.add_argument("--eos-id", type=int, help="end-of-document token id (default: from the tokenizer)")
    q.add_argument("--shard-tokens", type=_positive_int, default=1 << 26, help="tokens per shard (default 2^26)")
    q.add_argument("--quiet", action="store_true", help="no progress bar")
    q.add_argument(
        "--extensions",
        default=",".join(FORMATS),
        help="formats to take from directories and prefixes (default: %(default)s)",
    )
    q.add_argument(
        "--text-field", default="text", help="the .jsonl field / parquet column holding the text (default: %(default)s)"
    )
    q.add_argument("--workers", type=_positive_int, help="tokenizer processes (default: every core)")
    q.add_argument(
        "--max-document-bytes",
        type=_positive_int,
        default=DEFAULT_MAX_RECORD_BYTES,
        help="refuse a document (file, line or row) longer than this (default: %(default)s)",
    )
    c = q.add_argument_group("on the cluster (an Indexed Job; see llmtrain_trainer/data/prepare_cluster.py)")
    c.add_argument(
        "--cluster",
        action="store_true",
        help="list the inputs, write the manifest and the tokenizer to --output, print the Job (or --apply it)",
    )
    c.add_argument(
        "--indexes", type=_positive_int, default=8, help="Job completions: slices of the corpus (default %(default)s)"
    )
    c.add_argument("--parallelism", type=_positive_int, help="pods at once (default: all indexes)")
    c.add_argument("--image", help="the trainer image (default: the release's)")
    c.add_argument("--name", help="Job name (default: prepare-<hash of the output>)")
    c.add_argument("--namespace", "-n", default="default", help="namespace (default: %(default)s)")
    c.add_argument("--cpus", type=_positive_int, default=16, help="CPUs per pod = its workers (default %(default)s)")
    c.add_argument("--memory-gib", type=_positive_int, default=32, help="memory per pod (default %(default)s)")
    c.add_argument("--service-account", help="the pods' ServiceAccount (IRSA / Pod Identity role for S3)")
    c.add_argument("--env", action="append", metavar="NAME=VALUE", help="pod environment (repeatable)")
    c.add_argument("--apply", action="store_true", help="create the Job (current kubeconfig context)")
    c.add_argument("--kubeconfig", help="kubeconfig for --apply / --status")
    c.add_argument("--allow-local-output", action="store_true", help=argparse.SUPPRESS)  # tests: a shared directory
    c.add_argument("--status", metavar="NAME", help="the Job's succeeded/failed indexes and the merge")
    c.add_argument("--manifest", metavar="URI", help="run one index of this manifest (what each pod runs)")
    c.add_argument("--index", type=int, help="the index to run (default: $JOB_COMPLETION_INDEX)")
    c.add_argument("--merge", action="store_true", help="with --manifest: merge the parts' indexes now")
    q.set_defaults(func=cmd_prepare)


def _register_export(subparsers) -> None:
    e = subparsers.add_parser(
        "export",
        help="a checkpoint as a Hugging Face model (safetensors + config.json)",
        description="Write a job's newest complete checkpoint (or --step) as a Hugging "
        "Face model directory that transformers, vLLM and the Hub load as is.",
    )
    e.add_argument("file", help="the LLMTrainingJob YAML file the checkpoint belongs to")
    e.add_argument("--output", "-o", required=True, help="output directory")
    e.add_argument("--checkpoint-uri", help="override checkpoint.uri (a directory or s3://...)")
    e.add_argument("--step", type=int, help="checkpoint step (default: the newest complete one)")
    e.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16", help="weight dtype (default bf16)")
    e.add_argument("--max-shard-gb", type=float, default=5.0, help="safetensors file size limit (default 5)")
    e.set_defaults(func=cmd_export)


def _register_scale_test(subparsers) -> None:
    t = subparsers.add_parser(
        "scale-test",
        help="run a job at several sizes; throughput per worker and scaling efficiency",
        description="Run the same job locally with each number of worker processes in "
        "--sizes (same global batch: strong scaling) and write a table, scale-test.json "
        "and scale-test.png (tokens/s per worker and efficiency vs the smallest size).",
    )
    t.add_argument("file", help="LLMTrainingJob YAML file")
    t.add_argument("--sizes", default="1,2,4", help="worker counts, comma-separated (default: %(default)s)")
    t.add_argument("--max-steps", type=int, help="steps per size (default: training.maxSteps)")
    t.add_argument("--warmup", type=int, default=2, help="first steps left out of the medians (default: %(default)s)")
    t.add_argument("--output", "-o", help="output directory (default .llmtrain/<job name>-scale-test)")
    t.add_argument("--metrics-port", type=int, help=f"base port of the workers' /metrics (default {METRICS_PORT})")
    t.add_argument(
        "--cluster",
        action="store_true",
        help="sizes are NODE counts: create the job through the operator at each size, read tokens/s "
        "and MFU from status.progress, delete it (current kubeconfig context, or --kubeconfig)",
    )
    t.add_argument("--kubeconfig", help="kubeconfig of the cluster (implies --cluster)")
    t.add_argument(
        "--namespace", "-n", default="default", help="namespace of the jobs (--cluster; default: %(default)s)"
    )
    t.add_argument(
        "--samples", type=int, default=5, help="steps read from status per size (--cluster; default: %(default)s)"
    )
    t.add_argument("--timeout", type=float, default=1800, help="seconds per size (--cluster; default: %(default)s)")
    t.add_argument(
        "--poll", type=float, default=5.0, help="seconds between status reads (--cluster; default: %(default)s)"
    )
    t.set_defaults(func=cmd_scale_test)
