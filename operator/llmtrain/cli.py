"""`llmtrain`: validate, plan and render LLMTrainingJobs offline; run them locally (trainer).

Exit codes: 0 ok, 1 the job is invalid or does not fit, 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib.metadata import entry_points

import yaml

from .backends import get as backend_of
from .crd import crd_manifest
from .defaults import explain
from .planner import auto_interval, expected_run, interval_seconds, plan_job
from .snapshot_plan import size, snapshot_plan
from .spec import BACKENDS, DEFAULT_BACKEND, DEFAULT_ETCD_ENDPOINT
from .validation import InvalidJob, Policy, check, load_job, parse_spec, read_job_document

GIB = 1024**3


def _load(args):
    try:
        return load_job(args.file, args.etcd_endpoint, _policy(args), args.backend)
    except InvalidJob as err:
        _print_problems(args.file, err.problems)
        return None
    except (OSError, yaml.YAMLError) as err:
        print(f"{args.file}: {err}", file=sys.stderr)
        return None


def _policy(args) -> Policy:
    """The allow-lists: the operator's environment variables, plus any given on the command line."""
    env = Policy.from_env()
    return Policy(
        env.image_registries + tuple(args.allowed_image_registry),
        env.service_accounts + tuple(args.allowed_service_account),
    )


def cmd_validate(args) -> int:
    job = _load(args)
    if job is None:
        return 1
    print(f"{args.file}: {job.namespace}/{job.name} is valid")
    _print_resolved(job.document.get("spec") or {}, job.spec)
    return 0


def _resolved(raw_spec: dict, spec) -> dict:
    """The batch/schedule (and preflight) values the job runs with; derived defaults carry the reason."""
    t = spec.training
    values = {
        "data.seqLen": spec.data.seq_len,
        "training.maxSteps": t.max_steps,
        "training.warmupSteps": t.warmup_steps,
        "training.globalBatchTokens": t.global_batch_tokens,
        "training.microBatchSize": t.micro_batch_size,
        "resilience.preflight": spec.resilience.preflight,
    }
    why = explain(raw_spec, spec)
    return {k: ({"value": v, "derived": why[k]} if k in why else {"value": v}) for k, v in values.items()}


def _print_resolved(raw_spec: dict, spec) -> None:
    print("  resolved values:")
    for key, entry in _resolved(raw_spec, spec).items():
        why = f"  (derived: {entry['derived']})" if "derived" in entry else ""
        print(f"    {key:<27} {entry['value']}{why}")


def cmd_render(args) -> int:
    job = _load(args)
    if job is None:
        return 1
    obj = backend_of(job.spec.cluster.backend or args.backend).render(
        job.spec, job.name, args.namespace or job.namespace, args.attempt, default_etcd_endpoint=args.etcd_endpoint
    )
    sys.stdout.write(yaml.safe_dump(obj, sort_keys=False))
    return 0


def _print_problems(path, problems) -> None:
    if all(p.field == str(path) for p in problems):  # the file itself (not YAML, not one job): one line
        for p in problems:
            print(p, file=sys.stderr)
        return
    print(f"{path}: invalid LLMTrainingJob", file=sys.stderr)
    for p in problems:
        print(f"  - {p}", file=sys.stderr)


def cmd_plan(args) -> int:
    # A job that does not fit still gets its plan (that is what the plan is for); any other
    # problem stops here.
    try:
        doc = read_job_document(args.file)
        spec = parse_spec(doc.get("spec") or {})
    except InvalidJob as err:
        _print_problems(args.file, err.problems)
        return 1
    name = (doc.get("metadata") or {}).get("name", "")
    problems = check(spec, name, args.etcd_endpoint, _policy(args), spec.cluster.backend or args.backend)
    if any(p.field != "spec.cluster" for p in problems):
        _print_problems(args.file, problems)
        return 1
    plan = plan_job(spec)
    run = expected_run(spec, plan)
    auto_s, auto_why = auto_interval(spec, plan)
    snapshots = snapshot_plan(spec, plan) if spec.checkpoint.memory else None
    if args.output == "json":
        cadence = {"source": "auto" if spec.checkpoint.auto else "spec", "autoSeconds": round(auto_s), "auto": auto_why}
        print(
            json.dumps(
                {
                    **plan.as_dict(),
                    "expected": run.as_dict(),
                    "checkpointInterval": {**cadence, "seconds": round(interval_seconds(spec, plan))},
                    "resolved": _resolved(doc.get("spec") or {}, spec),
                    **({"memorySnapshots": snapshots.as_dict()} if snapshots else {}),
                },
                indent=2,
            )
        )
    else:
        rows = [
            ("parameters", plan.params_bytes),
            ("gradients", plan.grads_bytes),
            ("optimizer state", plan.optimizer_bytes),
            ("activations", plan.activations_bytes),
            ("workspace (gathered blocks, loss)", plan.workspace_bytes),
            ("peak (gradients, activations apart)", plan.total_bytes),
            ("device memory", plan.gpu_memory_bytes),
        ]
        print(
            f"{spec.model.preset or 'custom'} on {spec.cluster.nodes} × {spec.cluster.instance_type}, "
            f"{spec.fsdp.sharding_strategy}, {spec.fsdp.mixed_precision}, "
            f"activation checkpointing {spec.fsdp.activation_checkpointing}"
        )
        print(
            f"  parameters: {plan.num_params / 1e9:.2f} B, world size {plan.world_size}, shard group {plan.shard_group}"
        )
        print("  per device:")
        for label, value in rows:
            print(f"    {label:<38} {value / GIB:10.2f} GiB")
        print(f"  fits: {'yes' if plan.fits else 'NO'} (limit: 90% of device memory)")
        print(f"  FLOPs per token: {plan.flops_per_token / 1e9:.1f} GFLOP")
        print(
            f"  expected at {plan.assumed_mfu:.0%} MFU: {plan.tokens_per_second_per_gpu:,.0f} tokens/s "
            f"per device, {plan.tokens_per_second:,.0f} tokens/s in all"
        )
        print(
            f"  expected run ({run.steps:,} steps, {run.tokens / 1e9:,.2f} B tokens): "
            f"{run.wall_seconds / 3600:,.2f} h wall, {run.gpu_hours:,.1f} GPU-hours, goodput {run.goodput:.1%}"
        )
        print(
            f"    steps {run.train_seconds / 3600:,.2f} h; {run.checkpoints} checkpoints blocking "
            f"{run.checkpoint_seconds / 60:,.1f} min; {run.restarts:.2f} expected restarts costing "
            f"{run.restart_seconds / 60:,.1f} min (docs/concepts/goodput.md)"
        )
        if spec.checkpoint.uri:
            if spec.checkpoint.auto:
                print(f"  checkpoint interval: {auto_s / 60:,.0f} min to start with ({auto_why})")
            else:
                print(
                    f"  checkpoint interval: {spec.checkpoint.interval_minutes} min (spec); "
                    f"intervalMinutes: auto would start at {auto_s / 60:,.0f} min ({auto_why})"
                )
        if snapshots:
            _print_snapshots(spec, snapshots)
        _print_resolved(doc.get("spec") or {}, spec)
        for p in problems:
            print(f"  {p}")
    return 0 if plan.fits and (snapshots is None or snapshots.host.fits) else 1


def _print_snapshots(spec, s) -> None:
    """spec.checkpoint.memory's figures (llmtrain/snapshot_plan.py)."""
    host, run = s.host, s.run
    partner = "on the next node" if s.replication_seconds else "none"
    print(f"  memory snapshots: every {s.interval_steps:,} steps ({s.interval_why}); partner copy: {partner}")
    print(
        f"    host memory per node: {size(host.total_bytes)} of the {size(host.pod_bytes)} a worker pod gets "
        f"({host.instance_type}: {size(host.node_bytes)}), fits: {'yes' if host.fits else 'NO'}"
    )
    print(f"      {host.ranks} ranks × {size(host.snapshot_bytes)} per snapshot; {host.parts()}")
    print(
        f"    blocking per snapshot: {s.blocking_seconds:.3g} s (estimated); replication to the partner: "
        f"{s.replication_seconds:.3g} s per snapshot at {s.network_gbps:,} Gbit/s (line rate, in the background)"
    )
    print(
        f"    expected goodput {run.goodput:.2%} with memory snapshots, {run.durable.goodput:.2%} with durable "
        f"checkpoints alone: {run.snapshots:,} snapshots blocking {run.snapshot_seconds / 60:,.1f} min; "
        f"{run.restarts:.2f} restarts, {run.from_memory:.0%} from memory, costing {run.restart_seconds / 60:,.1f} "
        f"min against {run.durable.restart_seconds / 60:,.1f} (docs/performance/recovery.md)"
    )


def cmd_goodput(args) -> int:
    """Where a job's time went: its status.goodput buckets, attempts and events."""
    from . import goodput_report

    if args.from_file:
        with open(args.from_file) if args.from_file != "-" else sys.stdin as f:
            job = yaml.safe_load(f)
        events: list = []
    else:
        if not args.job:
            print("llmtrain goodput: give a job name or --from-file", file=sys.stderr)
            return 2
        from .controller.adapters import kube

        job = kube.get_job(args.namespace, args.job)
        if job is None:
            print(f"LLMTrainingJob {args.namespace}/{args.job} not found", file=sys.stderr)
            return 1
        uid = job["metadata"].get("uid")
        listed = kube._request(
            "GET",
            "/api/v1/namespaces/{namespace}/events",
            {"namespace": args.namespace},
            query={"fieldSelector": f"involvedObject.uid={uid}"},
        )
        events = goodput_report.events_of(listed["items"])
    if not isinstance(job, dict) or not isinstance(job.get("metadata"), dict):
        print("not an LLMTrainingJob object", file=sys.stderr)
        return 1
    print(goodput_report.table(job, events=events))
    if args.png:
        try:
            goodput_report.png(job, args.png)
        except ImportError:
            print("no PNG: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
            return 1
        print(f"\ntimeline: {args.png}")
    return 0


def cmd_crd(args) -> int:
    sys.stdout.write(yaml.safe_dump(crd_manifest(), sort_keys=False))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llmtrain", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def with_file(name, func, help):
        p = sub.add_parser(name, help=help)
        p.add_argument("file", help="LLMTrainingJob YAML file ('-' for stdin)")
        p.add_argument(
            "--etcd-endpoint",
            default=DEFAULT_ETCD_ENDPOINT,
            help="the operator's default etcd endpoint (default: %(default)s)",
        )
        p.add_argument(
            "--allowed-image-registry",
            action="append",
            default=[],
            metavar="PREFIX",
            help=f"check the image against this allow-list (repeatable; also ${Policy.ENV_IMAGES})",
        )
        p.add_argument(
            "--allowed-service-account",
            action="append",
            default=[],
            metavar="NAME",
            help=f"check serviceAccountName against this list (repeatable; also ${Policy.ENV_SERVICE_ACCOUNTS})",
        )
        p.add_argument(
            "--backend",
            choices=BACKENDS,
            default=DEFAULT_BACKEND,
            help="the platform's default backend, for a job without spec.cluster.backend (the operator chart's "
            "backends.default; default: %(default)s)",
        )
        p.set_defaults(func=func)
        return p

    with_file("validate", cmd_validate, "check a job and explain every problem")
    r = with_file("render", cmd_render, "print the PyTorchJob or JobSet the operator would create")
    r.add_argument("--namespace", help="override metadata.namespace")
    r.add_argument("--attempt", type=int, default=1)
    pl = with_file("plan", cmd_plan, "memory per device, fit verdict, expected throughput")
    pl.add_argument("--output", choices=["text", "json"], default="text")
    sub.add_parser("crd", help="print the LLMTrainingJob CRD").set_defaults(func=cmd_crd)
    g = sub.add_parser("goodput", help="where a job's wall time went: buckets, attempts, events; a PNG timeline")
    g.add_argument("job", nargs="?", help="the LLMTrainingJob's name (read from the cluster)")
    g.add_argument("-n", "--namespace", default="default")
    g.add_argument("--from-file", metavar="FILE", help="read the job from a `kubectl get -o yaml` dump instead")
    g.add_argument("--png", metavar="FILE", help="also draw the attempts' timeline into FILE")
    g.set_defaults(func=cmd_goodput)
    for plugin in entry_points(group="llmtrain.cli"):  # the trainer's verbs (pyproject.toml)
        try:
            register = plugin.load()
        except ImportError:  # an image that ships the CLI without the trainer's package
            continue
        register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
