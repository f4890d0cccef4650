"""What every situation of the decide table (decide.py) is made of: the `situation` mark that
records a situation's `Transition`s (the state diagram is drawn from them,
scripts/gen-state-diagram.py), the phase groups those transitions start from, and the current
attempt's own child (a PyTorchJob or a JobSet: Observed.backend) that most situations look at, and
its kind in words. Pure, like decide.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...backends import BACKENDS
from ...pod_contract import child_name
from ...status import Reason
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
    c = o.child(child_name(o.name, o.attempt))
    return c if c is not None and c.owned else None


def kind(o: Observed) -> str:
    """The kind of the job's children, for messages: PyTorchJob, JobSet."""
    backend = BACKENDS.get(o.backend)
    return backend.child.kind if backend is not None else "child object"
