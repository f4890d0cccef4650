"""The random-fault run's invariant check (tests/chain/faults.py: violations) catches each kind of
breakage it names: a checker that cannot fail would prove nothing. No cluster needed."""

from __future__ import annotations

from collections import Counter

import pytest

from .faults import Seen, violations

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
