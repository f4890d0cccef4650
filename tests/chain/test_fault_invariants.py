"""The random-fault run's invariant check (tests/chain/faults.py: violations) catches each kind of
breakage it names, and its test of convergence (unsettled) tells a namespace at rest from one that
is not: a checker that cannot fail would prove nothing. No cluster needed."""

from __future__ import annotations

from collections import Counter

import pytest

from llmtrain.render import JOB_LABEL

from .faults import PTJ_JOB_LABEL, Seen, unsettled, violations

BUDGETS = {"j": 2}


def seen(*states: tuple[str, int, int, str | None]) -> list[Seen]:
    return [Seen("MODIFIED", float(i), 100 + i, p, a, r, why) for i, (p, a, r, why) in enumerate(states)]


def check(history, added=None, hand=None, final=None) -> list[str]:
    added = Counter(added or {"j-a1": 1, "j-a2": 1})
    final = final or {"j": {"phase": "Running", "attempt": 2, "restarts": 1}}
    return violations({"j": history}, added, Counter(hand or {}), final, BUDGETS)


GOOD = seen(
    ("Pending", 1, 0, None), ("Running", 1, 0, "Running"), ("Restarting", 2, 1, "Failed"), ("Running", 2, 1, "Running")
)


def test_a_consistent_history_passes():
    assert check(GOOD) == []


@pytest.mark.parametrize(
    "history, added, hand, final, words",
    [
        (seen(("Running", 2, 1, None), ("Running", 1, 1, None)), None, None, None, "attempt went back"),
        (seen(("Running", 2, 1, None), ("Running", 2, 0, None)), None, None, None, "restarts went back"),
        (seen(("Running", 1, 0, None), ("Running", 3, 1, None)), None, None, None, "attempt jumped"),
        (seen(("Running", 3, 3, None)), {"j-a1": 1, "j-a2": 1, "j-a3": 1}, None, None, "over maxRestarts"),
        (seen(("Running", 1, 1, None)), None, None, None, "with only attempt 1"),
        (seen(("Failed", 1, 0, "RestartBudgetExhausted"), ("Running", 1, 0, None)), None, None, None, "left terminal"),
        (GOOD, {"j-a1": 1, "j-a2": 2}, None, None, "j-a2 created 2 times"),
        (GOOD, {"j-a1": 1}, None, None, "attempt 2 never had a PyTorchJob"),
        (GOOD, {"j-a1": 1, "j-a2": 1, "j-a3": 1}, None, None, "never reached"),
        (GOOD, None, None, {"j": {"phase": "Failed", "attempt": 2, "restarts": 1, "reason": "Failed"}}, "only a spent"),
    ],
)
def test_each_broken_invariant_is_named(history, added, hand, final, words):
    found = check(history, added, hand, final)
    assert any(words in v for v in found), found


def test_a_pytorchjob_deleted_by_hand_may_be_created_once_more():
    assert check(GOOD, {"j-a1": 1, "j-a2": 2}, {"j-a2": 1}) == []
    assert check(GOOD, {"j-a1": 1, "j-a2": 3}, {"j-a2": 1})


# --- a job that finished ---------------------------------------------------------------------------

SUCCEEDED = {"j": {"phase": "Succeeded", "attempt": 2, "restarts": 1, "reason": "Succeeded"}}


def test_a_job_that_succeeded_and_stayed_so_passes():
    done = [*GOOD, Seen("MODIFIED", 9.0, 200, "Succeeded", 2, 1, "Succeeded")]
    assert violations({"j": done}, Counter({"j-a1": 1, "j-a2": 1}), Counter(), SUCCEEDED, BUDGETS, {"j-a2"}) == []
    # its PyTorchJob deleted by hand afterwards, and not made again
    assert (
        violations(
            {"j": done},
            Counter({"j-a1": 1, "j-a2": 1}),
            Counter({"j-a2": 1}),
            SUCCEEDED,
            BUDGETS,
            {"j-a2"},
            Counter({"j-a2": 1}),
        )
        == []
    )


@pytest.mark.parametrize(
    "history, words",
    [
        # a new attempt after the success
        (seen(("Running", 1, 0, None), ("Succeeded", 1, 0, "Succeeded"), ("Restarting", 2, 1, None)), "left terminal"),
        # the phase stays, but the attempt moves on under it
        (seen(("Running", 1, 0, None), ("Succeeded", 1, 0, "Succeeded"), ("Succeeded", 2, 1, None)), "after it was"),
        # the success itself spends a restart
        (seen(("Running", 2, 1, None), ("Succeeded", 3, 2, "Succeeded")), "success changed"),
    ],
)
def test_a_success_that_is_not_final_is_named(history, words):
    added = Counter({"j-a1": 1, "j-a2": 1, "j-a3": 1})
    found = violations({"j": history}, added, Counter(), SUCCEEDED, BUDGETS, {"j-a1", "j-a2"})
    assert any(words in v for v in found), found


def test_a_pytorchjob_made_again_after_its_job_ended_is_named():
    """Deleted by hand once the job had ended, a PyTorchJob may not come back: the allowance a
    hand deletion gives a live job does not hold for a finished one."""
    found = violations(
        {"j": GOOD},
        Counter({"j-a1": 1, "j-a2": 2}),
        Counter({"j-a2": 1}),
        SUCCEEDED,
        BUDGETS,
        {"j-a2"},
        Counter({"j-a2": 1}),
    )
    assert any("after its job had ended" in v for v in found), found


def test_a_success_its_pytorchjob_never_had_is_named():
    found = violations({"j": GOOD}, Counter({"j-a1": 1, "j-a2": 1}), Counter(), SUCCEEDED, BUDGETS, frozenset())
    assert any("never seen Succeeded" in v for v in found), found
    wrong = {"j": {**SUCCEEDED["j"], "reason": "Running"}}
    found = violations({"j": GOOD}, Counter({"j-a1": 1, "j-a2": 1}), Counter(), wrong, BUDGETS, {"j-a2"})
    assert any("Succeeded with reason 'Running'" in v for v in found), found


# --- at rest, or why not (faults.unsettled) ---------------------------------------------------------


def _ptj(name: str, job: str, state: str = "Running") -> dict:
    return {
        "metadata": {"name": name, "labels": {JOB_LABEL: job}},
        "status": {"conditions": [{"type": state, "status": "True"}]},
    }


def _pod(name: str, ptj: str, node: str, phase: str = "Running") -> dict:
    return {
        "metadata": {"name": name, "labels": {PTJ_JOB_LABEL: ptj}},
        "spec": {"nodeName": node},
        "status": {"phase": phase},
    }


RUNNING = {"phase": "Running", "attempt": 2, "restarts": 1, "child": "j-a2", "reason": "Running"}


def test_a_running_job_on_ready_nodes_is_at_rest():
    pods = [_pod("j-a2-worker-0", "j-a2", "n1")]
    assert unsettled({"j": 1}, {"j": RUNNING}, [_ptj("j-a2", "j")], pods, {"n1": True}) is None


def test_a_running_jobs_pod_on_a_not_ready_node_is_not_at_rest():
    """A NotReady node's pods are evicted (or the node comes back): until then the job has not
    converged, though every pod says Running."""
    pods = [_pod("j-a2-worker-0", "j-a2", "n1")]
    why = unsettled({"j": 1}, {"j": RUNNING}, [_ptj("j-a2", "j")], pods, {"n1": False})
    assert why is not None and "NotReady n1" in why


def test_a_succeeded_job_is_at_rest_with_or_without_its_pytorchjob():
    st = {"phase": "Succeeded", "attempt": 2, "restarts": 1, "child": "j-a2", "reason": "Succeeded"}
    leftovers = [_pod("j-a2-worker-0", "j-a2", "n1", "Succeeded")]
    assert unsettled({"j": 1}, {"j": st}, [_ptj("j-a2", "j", "Succeeded")], leftovers, {"n1": True}) is None
    assert unsettled({"j": 1}, {"j": st}, [], [], {"n1": True}) is None  # its PyTorchJob deleted by hand
    # but not with another attempt's PyTorchJob alive
    why = unsettled({"j": 1}, {"j": st}, [_ptj("j-a3", "j")], [], {"n1": True})
    assert why is not None and "j-a3" in why
    # nor with a leftover pod on a node that is gone (the pod GC has not been yet)
    why = unsettled({"j": 1}, {"j": st}, [], leftovers, {"n2": True})
    assert why is not None and "deleted node n1" in why
