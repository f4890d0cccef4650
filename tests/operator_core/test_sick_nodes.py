"""Sick nodes without a cluster: a Node's conditions → the facts decide reads (sicknodes.py), the
node-health table the node watch keeps (caches.NodeHealth), which jobs a node's change concerns,
and the operator's flags for the watched conditions."""

from __future__ import annotations

import pytest

from llmtrain.controller import __main__ as cli
from llmtrain.controller.adapters.caches import NodeHealth, PodCache
from llmtrain.controller.policy.sicknodes import DEFAULT_CONDITIONS, SickNode, amend_move, sick_conditions, under


def node(name: str, **conditions) -> dict:
    """A Node as the API returns it, with Ready True and the given conditions (type → status or
    (status, reason, message))."""
    conds = [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
    for type_, value in conditions.items():
        status, reason, message = value if isinstance(value, tuple) else (value, "", "")
        conds.append(
            {
                "type": type_,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": "2026-03-01T11:59:00Z",
            }
        )
    return {"metadata": {"name": name}, "status": {"conditions": conds}}


def test_only_watched_conditions_that_are_false_count():
    n = node(
        "ip-10-0-0-1",
        AcceleratedHardwareReady=("False", "NvidiaXID79Error", "GPU has fallen off the bus"),
        NetworkingReady="True",
        StorageReady="Unknown",  # the agent has not decided: not sick
        MemoryPressure="False",  # not a watched condition (and False is its healthy state)
    )
    assert sick_conditions(n, DEFAULT_CONDITIONS) == (
        SickNode(
            "ip-10-0-0-1",
            "AcceleratedHardwareReady",
            "NvidiaXID79Error",
            "GPU has fallen off the bus",
            "2026-03-01T11:59:00Z",
        ),
    )
    assert sick_conditions(n, ("NetworkingReady",)) == ()
    # another node problem detector's condition, when configured
    assert [s.condition for s in sick_conditions(node("n", GpuHealthy="False"), ("GpuHealthy",))] == ["GpuHealthy"]


def test_a_nodes_words_are_bounded():
    n = node("n", KernelReady=("False", "R" * 10_000, "M" * 100_000))
    (s,) = sick_conditions(n, DEFAULT_CONDITIONS)
    assert len(s.reason) == 128 and len(s.message) == 240


def test_under_names_the_sick_nodes_of_placed_live_pods_only():
    health = {"n1": (SickNode("n1", "KernelReady"),), "n3": (SickNode("n3", "StorageReady"),)}
    pods = [
        {"name": "w0", "node": "n1", "phase": "Running"},
        {"name": "w1", "node": "n2", "phase": "Running"},
        {"name": "w2", "node": None, "phase": "Pending"},  # not placed yet
        {"name": "w3", "node": "n3", "phase": "Failed"},  # ended: attempt_failed's business
    ]
    assert under(pods, health) == (SickNode("n1", "KernelReady"),)


def test_the_move_records_the_node_and_avoids_it_while_enough_remain():
    update = {"phase": "Restarting", "message": "attempt 1 node-unhealthy"}
    sick = (SickNode("n1", "AcceleratedHardwareReady", "Xid", "79"), SickNode("n1", "NetworkingReady"))
    blamed = amend_move(update, sick, attempt=1, bad_nodes=[], ready={"n1", "n2", "n3"}, needed=2, when="t")
    assert blamed == ({"node": "n1", "reason": "AcceleratedHardwareReady=False"},)  # one entry per node
    assert update["badNodes"] == [
        {"node": "n1", "reason": "AcceleratedHardwareReady=False", "attempt": 1, "time": "t", "message": "Xid: 79"}
    ]
    assert update["avoidNodes"] == ["n1"]


def test_node_health_keeps_only_sick_nodes_and_says_what_changed():
    table = NodeHealth()
    sick = (SickNode("n1", "KernelReady"),)
    assert table.of({"n1"}) == {}
    assert table.put("n1", sick) is True
    assert table.put("n1", sick) is False  # the same again (a heartbeat update): nothing to decide
    assert table.of({"n1", "n2"}) == {"n1": sick}
    assert table.put("n1", ()) is True and table.of({"n1"}) == {}
    assert table.put("n2", ()) is False


def test_the_jobs_a_node_concerns_are_those_with_a_pod_on_it():
    pods = PodCache()
    pods.put("a", "j1", "1", "j1-a1-w0", {"node": "n1"})
    pods.put("a", "j2", "3", "j2-a3-w0", {"node": "n2"})
    pods.put("b", "j1", "2", "j1-a2-w1", {"node": "n1"})
    assert pods.jobs_on("n1") == {("a", "j1"), ("b", "j1")}
    assert pods.jobs_on("n9") == set()


def test_the_flags_name_what_is_wrong():
    assert cli.node_conditions(" AcceleratedHardwareReady,example.com/GpuHealthy,,") == (
        "AcceleratedHardwareReady",
        "example.com/GpuHealthy",
    )
    assert cli.node_conditions("") == ()  # the watch is off
    with pytest.raises(SystemExit, match="--node-conditions: 'Kernel Ready' is not a condition type"):
        cli.node_conditions("Kernel Ready")
    assert cli.parse_args([]).node_conditions.split(",") == list(DEFAULT_CONDITIONS)
    with pytest.raises(SystemExit, match="--free-node-moves must be ≥ 0"):
        cli.main(["--free-node-moves=-1"])
