"""Nothing of the operator's state is created at import: every table, lock and pool belongs to an
`Operator` (controller/operator.py), so two operators in one process (the tests, a standby and a
leader) share nothing, and forgetting a job forgets it in the one operator that knew it."""

from __future__ import annotations

import ast
from pathlib import Path

from kubernetes.client.exceptions import ApiException

CONTROLLER = Path(__file__).resolve().parents[2] / "operator" / "llmtrain" / "controller"
# made at module level, each of these can only be state shared by everything that imports the module
STATEFUL_CALLS = {
    "Lock",
    "RLock",
    "Event",
    "Condition",
    "Semaphore",
    "ThreadPoolExecutor",
    "dict",
    "set",
    "list",
    "defaultdict",
    "OrderedDict",
    "deque",
}


def _module_state(path: Path) -> list[str]:
    found = []
    for node in ast.parse(path.read_text()).body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if value is None:
            continue
        empty = (
            isinstance(value, (ast.Dict, ast.List, ast.Set))
            and not getattr(value, "keys", None)
            and not getattr(value, "elts", None)
        )  # a non-empty literal is a constant table
        call = (
            isinstance(value, ast.Call)
            and (value.func.attr if isinstance(value.func, ast.Attribute) else getattr(value.func, "id", ""))
            in STATEFUL_CALLS
        )
        if empty or call:
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)[:80]}")
    return found


def test_no_controller_module_creates_state_at_import():
    found = [line for p in sorted(CONTROLLER.glob("*.py")) for line in _module_state(p)]
    assert not found, "module-level state (move it into the Operator):\n" + "\n".join(found)


def _operator():
    from prometheus_client import CollectorRegistry

    from llmtrain.controller.adapters.metrics import OperatorMetrics
    from llmtrain.controller.operator import Operator
    from llmtrain.controller.policy.config import OperatorConfig

    return Operator(OperatorConfig(default_etcd_endpoint="etcd.test.svc:2379"), OperatorMetrics(CollectorRegistry()))


def test_two_operators_share_no_pod_failures_or_refusals():
    from llmtrain.controller.adapters import nodes

    a, b = _operator(), _operator()
    failure = {
        "node": "n1",
        "pod": "j-a1-worker-0",
        "owner": "ptj-uid",
        "exitCode": 1,
        "k8sReason": "Error",
        "finishedAt": None,
    }
    assert a.failures.remember("ns", "j", "1", failure)
    a.failures.saw_pod("ns", "j", "1", "n1", "ptj-uid")
    assert [f["node"] for f in a.failures.failures("ns", "j", 1, owner="ptj-uid")] == ["n1"]
    assert b.failures.failures("ns", "j", 1) == [] and b.failures.attempt_nodes("ns", "j", 1, "ptj-uid") == set()

    refused = ApiException(status=503, reason="unavailable")
    assert not a.rejections.final("ns", "j", 1, refused)
    assert (a.rejections.tries("ns", "j", 1), b.rejections.tries("ns", "j", 1)) == (1, 0)

    a.forget("ns", "j", None)  # the job is gone: this operator forgets it all
    assert a.failures.failures("ns", "j", 1) == [] and a.failures.attempt_nodes("ns", "j", 1, "ptj-uid") == set()
    assert a.rejections.tries("ns", "j", 1) == 0
    assert isinstance(a.failures, nodes.PodFailures)
