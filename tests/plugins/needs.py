"""Markers a test gets from the fixtures it uses, so they cannot be forgotten.

A fixture that starts a control plane says so with ``@needs("cluster")``; one that runs a binary
``make venv`` does not install (helm, kubectl, promtool, kubeconform, terraform, checkov, the Go
builds) with ``@needs("tools")``. Every test whose fixture closure holds such a fixture is marked
``cluster`` / ``tools`` at collection (a cluster needs the tools too, so ``cluster`` brings
``tools``), and ``make test-fast`` deselects both.

A test that starts a cluster or looks up a tool without such a fixture (inline, or in a subprocess)
fails instead of slipping into ``make test-fast``: for every test without the marker,
``LLMTRAIN_TEST_WITHOUT_TOOLS`` / ``LLMTRAIN_TEST_WITHOUT_CLUSTER`` name the test, and
``llmtrain_devcluster`` (``find_tool``, ``DevCluster.up``) and ``scripts/go-toolchain.sh`` refuse.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest

F = TypeVar("F", bound=Callable)
KINDS = {"cluster": ("cluster", "tools"), "tools": ("tools",)}
ENV = {"cluster": "LLMTRAIN_TEST_WITHOUT_CLUSTER", "tools": "LLMTRAIN_TEST_WITHOUT_TOOLS"}
_ATTR = "_llmtrain_needs"


def needs(*kinds: str) -> Callable[[F], F]:
    """Under ``@pytest.fixture``: the tests that use this fixture need ``kinds``."""
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"needs(): unknown kind(s) {sorted(unknown)}; accepted: {sorted(KINDS)}")

    def mark(fn: F) -> F:
        setattr(fn, _ATTR, tuple(k for kind in kinds for k in KINDS[kind]))
        return fn

    return mark


def needed_by(item: pytest.Item) -> set[str]:
    """What the fixtures of ``item``'s closure need."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return set()
    return {
        kind
        for name in info.names_closure
        for fixturedef in info.name2fixturedefs.get(name, ())
        for kind in getattr(fixturedef.func, _ATTR, ())
    }


def apply_markers(items: list[pytest.Item]) -> None:
    """Mark each item with what its fixtures need (idempotent)."""
    for item in items:
        have = {m.name for m in item.iter_markers()}
        for kind in sorted(needed_by(item) - have):
            item.add_marker(kind)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    apply_markers(items)


@pytest.fixture(autouse=True)
def _refuse_what_is_not_marked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    have = {m.name for m in request.node.iter_markers()}
    if "cluster" in have:
        have.add("tools")  # a cluster runs on the tools
    for kind, var in ENV.items():
        if kind not in have:
            monkeypatch.setenv(var, request.node.nodeid)
        else:
            monkeypatch.delenv(var, raising=False)
