"""How ``make test`` spreads the suite over xdist workers (``-n N --dist loadgroup
--no-loadscope-reorder``): which tests run together, and in what order.

Most of the suite waits (clusters settling, kwok, Kueue, operator and torchrun start-up), so the
2-core machine runs more workers than cores. A work unit runs whole on one worker:

- ``chain``: every test that uses the chain cluster (its fixture closure holds ``chain_cluster``),
  so one worker starts that cluster once and runs them all, one module after the other: a test
  parametrised over two backends runs both on that one cluster;
- otherwise one unit per module, so a module's own fixtures (an operator process, a Kueue cluster,
  a Helm release) are set up once; the light dev cluster is session-scoped, at most one per worker.

Units start longest first (the longest-processing-time rule, so no long unit starts last), by an
estimate from the markers: ``slow`` 30 s, ``cluster`` or ``tools`` 3 s, anything else 0.05 s.
Without xdist (``make test-fast``, a single file) nothing here changes the order.
"""

from __future__ import annotations

import pytest

from plugins.needs import apply_markers

CHAIN_FIXTURE = "chain_cluster"
ESTIMATE_S = {"slow": 30.0, "cluster": 3.0, "tools": 3.0}
OTHER_S = 0.05


def unit_of(item: pytest.Item) -> str:
    if CHAIN_FIXTURE in getattr(item, "fixturenames", ()):
        return "chain"
    return item.nodeid.split("::", 1)[0]


def estimate_s(item: pytest.Item) -> float:
    marks = {m.name for m in item.iter_markers()}
    return max([ESTIMATE_S[m] for m in marks & set(ESTIMATE_S)] or [OTHER_S])


def order_units(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` grouped into their units, units longest first (ties: collection order); each
    unit's tests keep their collection order."""
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(unit_of(item), []).append(item)
    ranked = sorted(units.values(), key=lambda unit: -sum(estimate_s(i) for i in unit))
    return [item for unit in ranked for item in unit]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("dist", "no") != "loadgroup":
        return
    apply_markers(items)  # the estimate reads the markers the fixtures give
    items[:] = order_units(items)
    for item in items:
        item.add_marker(pytest.mark.xdist_group(unit_of(item)))
