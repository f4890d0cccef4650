"""The table's parts: a `Problem` (the field, why, what is accepted), the `Subject` every rule looks
at, and a `Rule` (a check with the fields it names, the rules it needs, whether it stops)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from ..catalog import InstanceType, instance_types
from ..spec import DEFAULT_BACKEND, LLMTrainingJobSpec

if TYPE_CHECKING:
    from ..validation import Policy


@dataclass(frozen=True)
class Problem:
    field: str
    reason: str
    accepted: str

    def __str__(self) -> str:
        return f"{self.field}: {self.reason} (accepted: {self.accepted})"


@dataclass(frozen=True)
class Subject:
    """What every rule looks at: the parsed spec (defaults resolved), the job's name, the
    operator's default etcd endpoint and the cluster admin's allow-lists."""

    spec: LLMTrainingJobSpec
    name: str
    default_etcd_endpoint: str | None
    policy: Policy
    # the job's backend when it is already decided (the operator: status.backend, or the default it
    # gets now); None: spec.cluster.backend, else the default. `enabled`: the backends the platform
    # installed (the operator's --backend); None: any (offline)
    backend: str | None = None
    enabled: tuple[str, ...] | None = None

    @property
    def chosen_backend(self) -> str:
        return self.backend or self.spec.cluster.backend or DEFAULT_BACKEND

    @cached_property
    def instance(self) -> InstanceType:
        """The catalog entry of spec.cluster.instanceType (rules after `known_instance_type` only)."""
        return instance_types()[self.spec.cluster.instance_type]

    @cached_property
    def mounts(self) -> list[str]:
        """The volumes' mount paths, without a trailing '/'."""
        return [v.mount_path.rstrip("/") or "/" for v in self.spec.cluster.volumes]


@dataclass(frozen=True, eq=False)
class Rule:
    """One row of the table. `fields`: what its problems name (`<…>` stands for a key or an index).
    `needs`: it runs only when these rules ran and found nothing. `stop`: a problem here ends the
    check."""

    check: Callable[[Subject], Iterator[Problem]]
    fields: tuple[str, ...]
    needs: tuple[Rule, ...] = ()
    stop: bool = False

    @property
    def name(self) -> str:
        return self.check.__name__

    @property
    def doc(self) -> str:
        return self.check.__doc__ or ""

    def __call__(self, j: Subject) -> list[Problem]:
        return list(self.check(j))


def rule(*fields: str, needs: tuple[Rule, ...] = (), stop: bool = False):
    def mark(fn: Callable[[Subject], Iterator[Problem]]) -> Rule:
        return Rule(fn, fields, needs, stop)

    return mark


def shorten(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 5] + "…" + text[-4:]
