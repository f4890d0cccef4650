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

How: each worker orders its collection (all workers collect the same) and writes which unit each
test is in to a file the controller named in its ``workerinput``; the controller's scheduler (a
``LoadScopeScheduling`` whose scope is the unit) reads it. xdist's own ``xdist_group`` marker cannot
carry this: 3.8 renames the test ids through an attribute pytest 9 no longer has.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from plugins.needs import apply_markers

CHAIN_FIXTURE = "chain_cluster"
ESTIMATE_S = {"slow": 30.0, "cluster": 3.0, "tools": 3.0}
OTHER_S = 0.05
_INPUT_KEY = "llmtrain_units_file"


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


def _ours(config: pytest.Config) -> bool:
    """make test's mode: xdist with --dist loadgroup (on a worker xdist sets `dist` to "no" and
    keeps the request in `loadgroup`)."""
    return config.getoption("dist", "no") == "loadgroup" or bool(getattr(config.option, "loadgroup", False))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None or not _ours(config):
        return
    apply_markers(items)  # the estimate reads the markers the fixtures give
    items[:] = order_units(items)
    units = {item.nodeid: unit_of(item) for item in items}
    out = Path(workerinput[_INPUT_KEY]) / f"{workerinput['workerid']}.json"
    out.write_text(json.dumps(units))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """Controller: where the workers write their units."""
    config = node.config
    if not hasattr(config, "_llmtrain_units_dir"):
        config._llmtrain_units_dir = tempfile.mkdtemp(prefix="llmtrain-units-")
    node.workerinput[_INPUT_KEY] = config._llmtrain_units_dir


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getoption("dist", "no") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        """One scope per unit, as the workers wrote them (collection order: --no-loadscope-reorder)."""

        units: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.units is None:
                files = sorted(Path(config._llmtrain_units_dir).glob("*.json"))
                self.units = json.loads(files[0].read_text()) if files else {}
            return self.units.get(nodeid, nodeid.split("::", 1)[0])

    return UnitScheduling(config, log)


def pytest_unconfigure(config: pytest.Config) -> None:
    units_dir = getattr(config, "_llmtrain_units_dir", None)
    if units_dir:
        import shutil

        shutil.rmtree(units_dir, ignore_errors=True)
