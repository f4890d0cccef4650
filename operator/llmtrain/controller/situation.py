"""What every situation of the decide table (decide.py) is made of: the `situation` mark that
records a situation's `Transition`s (the state diagram is drawn from them,
scripts/gen-state-diagram.py), the phase groups those transitions start from, and the current
attempt's own PyTorchJob that most situations look at. Pure, like decide.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..render import pytorchjob_name
from ..status import Reason
from .config import OperatorConfig
from .snapshot import Observed, Plan


@dataclass(frozen=True)
class Transition:
    """One edge a situation can take, for the state diagram: from phases → to phase, with reason."""

    frm: tuple[str, ...]
    to: str
    reason: Reason | None


Situation = Callable[[Observed, OperatorConfig], "Plan | None"]


def situation(*edges: Transition):
    def mark(fn):
        fn.transitions = edges
        return fn

    return mark


ANY_ACTIVE = ("Pending", "Running", "Restarting")
LIVE = (*ANY_ACTIVE, "Suspended")


def current_child(o: Observed):
    c = o.child(pytorchjob_name(o.name, o.attempt))
    return c if c is not None and c.owned else None
