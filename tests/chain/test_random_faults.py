"""Random faults on the real chain (kube-apiserver + etcd + kube-scheduler + kwok nodes + the Kubeflow
training-operator + the operator as a process): six jobs, a minute of faults drawn from a seed
(worker pods failing, pods deleted, child PyTorchJobs deleted by hand, nodes deleted and replaced,
the operator SIGKILLed and started again), then the invariants over everything the two watches saw
(tests/chain/faults.py): attempt and restarts never go back, no attempt's PyTorchJob is created
twice, the budget is never exceeded, terminal phases stay, and every job converges.

The faults come at random moments; the assertions are about invariants, never about timings.
Reproduce a run: LLMTRAIN_FAULT_SEED=<the seed it printed> (LLMTRAIN_FAULT_SECONDS: how long the
faults last, 60 by default).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable

import pytest
from kubernetes import client

from llmtrain.render import pytorchjob_name
from llmtrain.spec import GROUP, PLURAL, VERSION
from llmtrain_devcluster.process import free_port
from operator_core.conftest import OperatorProcess

from . import faults
from .conftest import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

JOBS = 6
SPARE_NODES = 2  # beyond one per pod: a restart finds room while the old pods finish


@pytest.fixture
def cpu_nodes(chain_cluster, chain):
    """Simulated cpu nodes for this test only (the session's cluster keeps its GPU shape for the
    other chain tests). Requested before chain_ns, so they go after its pods are gone; the
    replacements the faults register go too."""
    pods = sum(nodes for _, nodes, _ in faults.draw_jobs(random.Random(0), JOBS))
    names = chain_cluster.add_nodes({faults.CPU: pods + SPARE_NODES})
    yield names
    for node in chain.core.list_node(label_selector="type=kwok").items:
        if node.metadata.name.startswith(faults.NODE_PREFIX):
            try:
                chain.core.delete_node(node.metadata.name)
            except client.ApiException as err:
                if err.status != 404:
                    raise


@pytest.fixture
def operator(chain_cluster, chain_ns, tmp_path):
    """This test's own operator, watching only its namespace (it is SIGKILLed on purpose)."""
    op = OperatorProcess(
        chain_cluster.kubeconfig,
        tmp_path / "operator.log",
        free_port(),
        extra_args=["--namespace", chain_ns, "--verbose"],
    )
    op.start()
    yield op
    op.stop()


class Restarter:
    """SIGKILL the operator, then start it again after a random pause in the background, so the
    cluster (and the next faults) go on while it is down."""

    def __init__(self, op: OperatorProcess):
        self.op = op
        self.thread: threading.Thread | None = None
        self.note: Callable[[str], None] = lambda what: None
        self.error: BaseException | None = None

    def __call__(self, pause: float) -> bool:
        if self.thread is not None and self.thread.is_alive():
            return False  # still starting from the last kill
        self.wait()
        self.op.stop(signal.SIGKILL)

        def start():
            try:
                time.sleep(pause)  # the outage itself, not a readiness wait
                self.op.start()
                self.note("operator up again")
            except BaseException as err:  # noqa: BLE001 - re-raised by wait() in the test's thread
                self.error = err

        self.thread = threading.Thread(target=start, daemon=True)
        self.thread.start()
        return True

    def wait(self) -> None:
        if self.thread is not None:
            self.thread.join(120)
            self.thread = None
        if self.error is not None:
            raise self.error


def test_random_faults_keep_every_invariant(chain_cluster, chain, cpu_nodes, chain_ns, operator):
    seed = int(os.environ.get("LLMTRAIN_FAULT_SEED") or random.SystemRandom().randrange(2**32))
    seconds = float(os.environ.get("LLMTRAIN_FAULT_SECONDS", "60"))
    print(f"\nrandom faults: LLMTRAIN_FAULT_SEED={seed} for {seconds:.0f} s (operator log: {operator.log_path})")
    rng = random.Random(seed)
    jobs = faults.draw_jobs(rng, JOBS)
    budgets = {name: budget for name, _, budget in jobs}
    sizes = {name: nodes for name, nodes, _ in jobs}
    t0 = time.monotonic()

    with chain_cluster.api_client() as api:
        since = chain.custom.list_namespaced_custom_object(GROUP, VERSION, chain_ns, PLURAL)["metadata"][
            "resourceVersion"
        ]
        history = faults.History(api, chain_ns, since)
        chaos: faults.Faults | None = None
        try:
            for name, nodes, budget in jobs:
                chain.custom.create_namespaced_custom_object(
                    GROUP, VERSION, chain_ns, PLURAL, faults.job_doc(name, nodes, budget)
                )
            wait_for(lambda: faults.settled(api, chain_ns, sizes), 120, f"{JOBS} jobs Running before the faults")
            started = time.monotonic() - t0

            index = 1 + max(int(n.rsplit("-", 1)[1]) for n in cpu_nodes)
            restarter = Restarter(operator)
            chaos = faults.Faults(api, chain_ns, rng, restarter, index)
            restarter.note = chaos.note
            faults.run_faults(chaos, seconds)
            restarter.wait()
            last_fault = time.monotonic() - t0

            final = wait_for(
                lambda: faults.settled(api, chain_ns, sizes),
                240,
                f"every job Running on its latest attempt or Failed (seed {seed}, log: {operator.log_path})",
            )
            converged = time.monotonic() - t0
            # the watches have delivered everything up to the settled state
            rvs = {n: int(st_rv) for n, st_rv in _resource_versions(chain, chain_ns, final).items()}
            wait_for(lambda: history.caught_up(rvs), 30, "the watch caught up with the settled state")
        finally:
            history.stop()
            seen, added = history.snapshot()
            if chaos is not None:  # the whole story, also when the namespace never settled
                print(faults.timeline(chaos.t0, chaos.log, seen, history.ptj_timeline()))

    bad = history.errors + faults.violations(seen, added, chaos.hand_deleted, final, budgets)
    for name, st in sorted(final.items()):
        print(
            f"{name}: {st.get('phase')} attempt {st.get('attempt')} restarts {st.get('restarts')}/{budgets[name]}"
            f" reason {st.get('reason')} ({len(seen.get(name, []))} watched states)"
        )
        print(f"  {faults.path(seen.get(name, []))}")
    errors = [
        line
        for line in operator.metrics().splitlines()
        if line.startswith('llmtrain_operator_reconciles_total{outcome="error"}')
    ]
    print(
        f"faults {dict(chaos.done)}; Running after {started:.0f} s, settled {converged - last_fault:.0f} s "
        f"after the last fault; {errors}"
    )
    assert sum(chaos.done.values()) > 0, "no fault was applied"
    assert not bad, f"LLMTRAIN_FAULT_SEED={seed}:\n" + "\n".join(bad)
    for name, st in final.items():
        assert st.get("pytorchJob") == pytorchjob_name(name, st.get("attempt") or 1)


def _resource_versions(chain, ns: str, final: dict) -> dict[str, str]:
    return {
        name: chain.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)["metadata"]["resourceVersion"]
        for name in final
    }
