"""The training backends: which kind of object runs an attempt's pods (base.py says what one is).

`BACKENDS` names each (the values of spec.cluster.backend and of the chart's `backends.*`, in
spec.BACKENDS' order); `get(name)` finds one; `choose` is the one place a job's backend is decided;
`RENDER_ERRORS` is what a backend's `render` can raise for a spec that passed validation.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..render import RENDER_ERRORS
from ..spec import BACKENDS as NAMES
from ..spec import DEFAULT_BACKEND
from .base import ApiKind, Backend, ChildState
from .job import JOB
from .jobset import JOBSET
from .pytorchjob import PYTORCHJOB

__all__ = [
    "BACKENDS",
    "DEFAULT_BACKEND",
    "RENDER_ERRORS",
    "ApiKind",
    "Backend",
    "ChildState",
    "choose",
    "get",
    "of_kind",
]

BACKENDS: dict[str, Backend] = {b.name: b for b in (PYTORCHJOB, JOBSET, JOB)}
assert tuple(BACKENDS) == NAMES, "spec.BACKENDS lists the backends of llmtrain.backends, in order"


def get(name: str | None) -> Backend:
    """The backend called `name` (None: the default); KeyError for an unknown one."""
    return BACKENDS[name or DEFAULT_BACKEND]


def of_kind(kind: str | None) -> Backend | None:
    """The backend whose child is of this kind (a watch event's object), or None."""
    return next((b for b in BACKENDS.values() if b.child.kind == kind), None)


def choose(
    recorded: str | None,
    legacy: bool,
    requested: str | None,
    namespace: str,
    default: str = DEFAULT_BACKEND,
    namespace_defaults: Mapping[str, str] | None = None,
) -> str:
    """A job's backend, decided once: the one its status records (status.backend, written with its
    first status); a job an operator without backends already runs (`legacy`: a phase, no
    status.backend) is a PyTorchJob one; else the job's own spec.cluster.backend, its namespace's
    default (the chart's backends.namespaceDefaults) or the platform's (backends.default). A
    default changed later never moves a job that exists."""
    if recorded:
        return recorded
    if legacy:
        return PYTORCHJOB.name
    return requested or (namespace_defaults or {}).get(namespace) or default
