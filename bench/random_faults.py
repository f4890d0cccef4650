"""A long soak of random faults on the real chain: the driver of tests/chain/test_random_faults.py
(tests/chain/faults.py) run for longer, on its own chain dev cluster (kube-apiserver, etcd,
controller-manager, kube-scheduler, kwok cpu nodes, the Kubeflow training-operator) and operator.

``--jobs`` jobs (budgets 0, 1, 2 or 20 restarts, a third of them two-node gangs), one kwok cpu node
per pod plus two spare, then ``--minutes`` of faults drawn from ``--seed`` (worker pods failing,
pods deleted, child PyTorchJobs deleted by hand, nodes deleted and replaced, nodes NotReady, an
attempt's pods all exiting 0, the operator SIGKILLed and started again); once the namespace
settles, the invariants over everything two watches saw. Prints the timeline, then one JSON
object: the invariant check (``violations``, empty when all hold), the fault counts, each job's
end state, the phases' durations.

    .venv/bin/python bench/random_faults.py --jobs 6 --minutes 1 --seed 7 \\
        --json bench/results/random_faults_chain.json
    .venv/bin/python bench/random_faults.py --jobs 20 --minutes 30          # a soak, a random seed

Exit status 1 when an invariant broke.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from chainbench import OperatorProcess, api_client, free_port, print_operator_log_tail, wait_for

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [p for p in (str(REPO / "tests"), str(REPO / "devcluster")) if p not in sys.path]

SPARE_NODES = 2


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=6)
    p.add_argument("--minutes", type=float, default=1.0, help="how long the faults last")
    p.add_argument("--seed", type=int, default=None, help="default: a random one (printed)")
    p.add_argument("--backend", choices=("pytorchjob", "jobset"), default="pytorchjob", help="the jobs' backend")
    p.add_argument("--settle-timeout", type=float, default=300, help="seconds the namespace may take to settle")
    p.add_argument("--json", type=Path, help="also write the result here, with the command, date, machine, commit")
    a = p.parse_args(argv)
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(2**32)

    from chain import faults  # tests/chain/faults.py
    from llmtrain_devcluster import DevCluster

    pods = sum(nodes for _, nodes, _ in faults.draw_jobs(random.Random(0), a.jobs))
    print(f"random faults: seed {seed}, {a.jobs} jobs, {a.minutes:g} min of faults, {pods + SPARE_NODES} cpu nodes")
    with tempfile.TemporaryDirectory(prefix="random-faults-") as tmp:
        workdir = Path(tmp)
        cluster = DevCluster(workdir / "cluster", chain=True, nodes={faults.CPU: pods + SPARE_NODES}).up(timeout=600)
        log = workdir / "operator.log"
        op = None
        try:
            ns = f"faults-{uuid.uuid4().hex[:8]}"
            with api_client(cluster.kubeconfig) as api:
                from kubernetes import client

                core = client.CoreV1Api(api)
                core.create_namespace({"metadata": {"name": ns}})
                wait_for(lambda: _has_default_sa(core, ns), 60, f"default ServiceAccount in {ns}")
                # as the test's operator: scrape often, restart after 1 s (the product's floor is 5 s)
                op = OperatorProcess(
                    cluster.kubeconfig,
                    ns,
                    log,
                    [
                        "--progress-interval",
                        "0.5",
                        "--min-restart-backoff-seconds",
                        "1",
                        "--trainer-metrics-port",
                        str(free_port()),
                        "--backend",
                        "pytorchjob",
                        "--backend",
                        "jobset",
                    ],
                )
                op.start()
                nodes = [n.metadata.name for n in core.list_node(label_selector="type=kwok").items]
                started = time.monotonic()
                result = faults.run(
                    api,
                    ns,
                    op,
                    nodes,
                    seed=seed,
                    jobs=a.jobs,
                    seconds=a.minutes * 60,
                    wait=wait_for,
                    settle_timeout=a.settle_timeout,
                    backend=a.backend,
                )
                out = result.summary()
                out["seconds"]["wall"] = round(time.monotonic() - started, 1)
                out["reconcileErrors"] = op.counter("error")  # of the last operator process
        except BaseException:
            print_operator_log_tail(log)
            raise
        finally:
            if op is not None:
                op.stop()
            cluster.down()
    print(json.dumps(out, indent=1))
    if a.json:
        record = {
            "what": "random faults on the real chain: invariants over every watched status and PyTorchJob",
            "command": " ".join(
                [".venv/bin/python", "bench/random_faults.py", *map(shlex.quote, argv or sys.argv[1:])]
            ),
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores shared with other sessions",
            "commit": subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
            ).stdout.strip(),
            **out,
        }
        a.json.write_text(json.dumps(record, indent=1) + "\n")
    return 1 if out["violations"] else 0


def _has_default_sa(core, ns: str) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        core.read_namespaced_service_account("default", ns)
        return True
    except ApiException as err:
        if err.status == 404:
            return False
        raise


if __name__ == "__main__":
    sys.exit(main())
