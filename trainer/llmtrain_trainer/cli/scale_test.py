"""`llmtrain scale-test job.yaml --sizes 1,2,4`: the same job at several sizes; throughput per worker
and scaling efficiency against the smallest size, as a table, a JSON file and a PNG chart.

Locally a size is a number of worker processes (CPU processes, or local GPUs), each run through
`llmtrain local` (the same torchrun entry point the cluster uses) with the job's global batch, so
it is strong scaling: the work per step is fixed and spread over more workers. Every run starts from
scratch (checkpointing off, so no size resumes another's run). Per size: the median over the steps
after `--warmup` of the trainer's own step lines — tokens/s of the job, tokens/s per worker and MFU.

    efficiency(n) = (tokens/s per worker at n) / (tokens/s per worker at the smallest size)

On CPU every worker gets one intra-op thread at every size (unless OMP_NUM_THREADS is set). On one
machine the workers share its cores and memory bandwidth: a CPU run past the core count measures
oversubscription, not the interconnect.

On a cluster (`--cluster`, with `--kubeconfig`/`--namespace`) a size is a number of NODES: for each,
an LLMTrainingJob `<name>-scale-<n>` is created through the operator with `spec.cluster.nodes: n`
(checkpointing off, so no size resumes another), and its `status.progress` — what the operator
scrapes from rank 0's /metrics: step, tokens/s of the job, MFU — is read at every new step after
`--warmup` until `--max-steps` samples are in (or the job ends); then the job is deleted and the
next size starts. Per-worker throughput there is per GPU (nodes × GPUs per node).

It lives in `cli/` because it is a command, not training: it starts jobs (through `cli.local`, or
the operator's API) and reads what they report. Not in the operator package, whose image has no
torch, since the local mode runs the trainer; and nothing a worker imports reaches it
(tests/trainer/test_package_layout.py).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = sorted({int(s) for s in text.split(",") if s.strip()})
    except ValueError:
        raise ValueError(f"--sizes {text!r}: expected comma-separated positive integers, e.g. 1,2,4") from None
    if not sizes or sizes[0] < 1:
        raise ValueError(f"--sizes {text!r}: expected comma-separated positive integers, e.g. 1,2,4")
    return sizes


def check_divisible(spec, sizes: list[int]) -> None:
    """The global batch must split evenly at every size (sequences = workers × micro-batch × accumulation)."""
    from ..config import global_batch_seqs

    g, mb = global_batch_seqs(spec), spec.training.micro_batch_size
    bad = [n for n in sizes if g % (n * mb)]
    if bad:
        raise ValueError(
            f"training.globalBatchTokens: {g} sequences per step do not split over "
            f"{', '.join(map(str, bad))} worker(s) × microBatchSize {mb}; use sizes that divide "
            f"{g // mb}, or a global batch that is a multiple of {max(sizes) * mb} sequences"
        )


def step_events(worker_log: Path) -> list[dict]:
    events = []
    for line in worker_log.read_text().splitlines():
        if line.startswith("{"):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "step":
                events.append(event)
    return events


def summarize(size: int, events: list[dict], warmup: int) -> dict:
    steady = [e for e in events if e["step"] > warmup] or events
    if not steady:
        raise RuntimeError(f"size {size}: the run produced no step lines")
    tps = statistics.median(e["tokens_per_second"] for e in steady)
    q = statistics.quantiles([e["tokens_per_second"] for e in steady], n=4) if len(steady) > 1 else [tps, tps, tps]
    return {
        "size": size,
        "steps": len(steady),
        "tokens_per_second": round(tps, 2),
        "tokens_per_second_per_worker": round(tps / size, 2),
        "tokens_per_second_iqr": [round(q[0], 2), round(q[2], 2)],
        "mfu": round(statistics.median(e["mfu"] for e in steady), 5),
        "step_seconds": round(statistics.median(e["step_seconds"] for e in steady), 5),
    }


def add_efficiency(rows: list[dict]) -> list[dict]:
    base = rows[0]["tokens_per_second_per_worker"]
    for r in rows:
        r["scaling_efficiency"] = round(r["tokens_per_second_per_worker"] / base, 4) if base else 0.0
    return rows


def table(rows: list[dict]) -> str:
    out = [f"{'workers':>7} {'tokens/s':>12} {'tokens/s/worker':>16} {'efficiency':>10} {'MFU':>8} {'step s':>8}"]
    for r in rows:
        out.append(
            f"{r['size']:>7} {r['tokens_per_second']:>12,.0f} {r['tokens_per_second_per_worker']:>16,.0f} "
            f"{r['scaling_efficiency']:>10.1%} {r['mfu']:>8.2%} {r['step_seconds']:>8.3f}"
        )
    return "\n".join(out)


def chart(rows: list[dict], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    sizes = [r["size"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(sizes, [r["tokens_per_second_per_worker"] for r in rows], "o-")
    ax1.set(xlabel="workers", ylabel="tokens/s per worker", title="throughput per worker", xticks=sizes)
    ax1.set_ylim(bottom=0)
    ax2.plot(sizes, [100 * r["scaling_efficiency"] for r in rows], "o-", color="tab:green")
    ax2.axhline(100, color="grey", linewidth=0.8, linestyle="--")
    ax2.set(
        xlabel="workers",
        ylabel="% of the smallest size's per-worker throughput",
        title="scaling efficiency",
        xticks=sizes,
    )
    ax2.set_ylim(0, 110)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_scale_test(
    file: str,
    sizes: list[int],
    *,
    max_steps: int | None = None,
    warmup: int = 2,
    output: str | None = None,
    metrics_port: int | None = None,
) -> dict:
    from ..config import load_job_file
    from .local import run_local

    doc, spec = load_job_file(file)
    name = (doc.get("metadata") or {}).get("name") or Path(file).stem
    check_divisible(spec, sizes)
    steps = max_steps or spec.training.max_steps
    if steps <= warmup:
        raise ValueError(f"--max-steps {steps}: need more steps than --warmup {warmup}")
    if spec.cluster.instance_type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        # Same resources per worker at every size: torchrun sets one intra-op thread per process only
        # when it starts several, so a 1-process run would otherwise get all cores (and, on a busy
        # machine, OpenMP barriers waiting on descheduled threads).
        os.environ["OMP_NUM_THREADS"] = "1"
    out = Path(output or os.path.join(".llmtrain", f"{name}-scale-test"))
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in sizes:
        work = out / f"size-{n}"
        if (work / "worker.log").exists():
            (work / "worker.log").unlink()  # a fresh log per run: run_local appends
        print(f"scale-test: {name}: {n} worker(s), {steps} steps", flush=True)
        rc = run_local(
            file, nproc=n, max_steps=steps, checkpoint_uri="", metrics_port=metrics_port, workdir=str(work), quiet=True
        )
        if rc:
            raise RuntimeError(f"size {n}: the run exited with {rc}; see {work / 'worker.log'}")
        rows.append(summarize(n, step_events(work / "worker.log"), warmup))
    add_efficiency(rows)
    result = {
        "job": name,
        "file": str(file),
        "sizes": sizes,
        "steps": steps,
        "warmup": warmup,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "instance_type": spec.cluster.instance_type,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "global_batch_tokens": spec.training.global_batch_tokens,
        "rows": rows,
    }
    (out / "scale-test.json").write_text(json.dumps(result, indent=1) + "\n")
    result["table"] = table(rows)
    result["json_path"], result["png_path"] = str(out / "scale-test.json"), str(out / "scale-test.png")
    try:
        chart(
            rows,
            f"{name}: {spec.cluster.instance_type}, global batch {spec.training.global_batch_tokens:,} tokens",
            out / "scale-test.png",
        )
    except ImportError:  # the trainer image carries no matplotlib; the table and JSON are still written
        result["png_path"] = "no PNG (matplotlib is not installed: pip install matplotlib)"
    return result


# -- cluster mode: node counts through the operator ------------------------------------------------


def scale_job_document(doc: dict, name: str, nodes: int, max_steps: int | None) -> dict:
    """The job at one size: same spec, `nodes` nodes, no checkpoint (each size starts from scratch)."""
    import copy

    from llmtrain.spec import API_VERSION, KIND

    spec = copy.deepcopy(doc.get("spec") or {})
    cluster = spec.setdefault("cluster", {})
    cluster["nodes"] = nodes
    cluster.pop("minNodes", None)
    (spec.get("checkpoint") or {}).pop("uri", None)
    if max_steps:
        spec.setdefault("training", {})["maxSteps"] = max_steps
    labels = {**((doc.get("metadata") or {}).get("labels") or {}), "llmtrain.dev/scale-test": "true"}
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name, "labels": labels}, "spec": spec}


def scale_job_name(base: str, nodes: int, backend: str | None = None) -> str:
    """`<base>-scale-<nodes>`, the base cut so that the name fits what `backend` (default: the
    default backend) names after it (llmtrain.backends: Backend.max_job_name)."""
    from llmtrain.backends import get

    suffix = f"-scale-{nodes}"
    return base[: get(backend).max_job_name(nodes) - len(suffix)].rstrip("-") + suffix


def _api(kubeconfig: str | None):
    from kubernetes import client, config

    if kubeconfig:
        return client.ApiClient(config.new_client_from_config(config_file=kubeconfig).configuration)
    try:
        config.load_kube_config()
    except config.ConfigException:
        config.load_incluster_config()
    return client.ApiClient()


def sample_progress(
    get_status, warmup: int, samples: int, tokens_per_step: int, deadline: float, poll: float, what: str
) -> list[dict]:
    """Read `status.progress` until `samples` distinct steps after `warmup` are seen (or the job
    ends); each becomes a step event like the trainer's own lines. Raises on Failed or timeout."""
    seen: dict[int, dict] = {}
    phase = None
    while True:
        status = get_status() or {}
        phase = status.get("phase")
        prog = status.get("progress") or {}
        step, tps = prog.get("step"), prog.get("tokensPerSecond")
        if phase == "Running" and step is not None and step > warmup and tps and step not in seen:
            seen[step] = {
                "step": step,
                "tokens_per_second": float(tps),
                "mfu": float(prog.get("mfu") or 0.0),
                "step_seconds": tokens_per_step / float(tps),
            }
        if len(seen) >= samples:
            break
        if phase == "Failed":
            raise RuntimeError(f"{what} failed: {status.get('message') or status.get('reason') or 'no message'}")
        if phase == "Succeeded":
            if seen:
                break
            raise RuntimeError(f"{what} finished before step {warmup + 1} was seen; raise --max-steps")
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{what}: {len(seen)} of {samples} steps after step {warmup} seen within the "
                f"timeout (phase {phase}, progress {prog or 'none yet'})"
            )
        time.sleep(poll)
    return [seen[k] for k in sorted(seen)]


def run_cluster_scale_test(
    file: str,
    sizes: list[int],
    *,
    kubeconfig: str | None = None,
    namespace: str = "default",
    max_steps: int | None = None,
    samples: int = 5,
    warmup: int = 2,
    output: str | None = None,
    timeout: float = 1800.0,
    poll: float = 5.0,
) -> dict:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from llmtrain.catalog import instance_type
    from llmtrain.spec import GROUP, PLURAL, VERSION

    from ..config import load_job_file

    doc, spec = load_job_file(file)
    base = (doc.get("metadata") or {}).get("name") or Path(file).stem
    inst = instance_type(spec.cluster.instance_type)
    per_node = inst.workers_per_node(spec.cluster.processes_per_node)
    tokens_per_step = spec.training.global_batch_tokens
    assert tokens_per_step is not None, "unresolved spec: training.globalBatchTokens"
    out = Path(output or os.path.join(".llmtrain", f"{base}-scale-test"))
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with _api(kubeconfig) as api:
        co = client.CustomObjectsApi(api)

        def status(name):
            try:
                return co.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name).get("status")
            except ApiException as err:
                if err.status == 404:
                    return None
                raise

        for n in sizes:
            name = scale_job_name(base, n)
            print(f"scale-test: {namespace}/{name}: {n} node(s) × {per_node} worker(s)", flush=True)
            if status(name) is not None:
                raise RuntimeError(f"{namespace}/{name} already exists (a scale test in progress?); delete it first")
            co.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, scale_job_document(doc, name, n, max_steps)
            )
            try:
                events = sample_progress(
                    lambda name=name: status(name),
                    warmup,
                    samples,
                    tokens_per_step,
                    time.monotonic() + timeout,
                    poll,
                    f"{namespace}/{name}",
                )
            finally:
                try:
                    co.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
                except ApiException as err:
                    if err.status != 404:
                        raise
                # The next size needs the nodes back: wait until the operator has torn this one down.
                gone = time.monotonic() + timeout
                while status(name) is not None and time.monotonic() < gone:
                    time.sleep(poll)
            row = summarize(n * per_node, events, warmup)
            row["nodes"] = n
            rows.append(row)
    add_efficiency(rows)
    result = {
        "job": base,
        "file": str(file),
        "mode": "cluster",
        "namespace": namespace,
        "sizes": sizes,
        "workers_per_node": per_node,
        "samples": samples,
        "warmup": warmup,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "instance_type": spec.cluster.instance_type,
        "global_batch_tokens": tokens_per_step,
        "rows": rows,
    }
    (out / "scale-test.json").write_text(json.dumps(result, indent=1) + "\n")
    result["table"] = table(rows)
    result["json_path"], result["png_path"] = str(out / "scale-test.json"), str(out / "scale-test.png")
    try:
        chart(
            rows,
            f"{base}: {spec.cluster.instance_type} × nodes {','.join(map(str, sizes))}, global batch "
            f"{tokens_per_step:,} tokens",
            out / "scale-test.png",
        )
    except ImportError:
        result["png_path"] = "no PNG (matplotlib is not installed: pip install matplotlib)"
    return result
