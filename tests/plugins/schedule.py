"""How ``make test`` spreads the suite over xdist workers (``-n N --dist loadgroup
--no-loadscope-reorder``): which tests run together, and in what order.

Most of the suite waits (clusters settling, kwok, Kueue, operator and torchrun start-up), so the
2-core machine runs more workers than cores. A work unit runs whole on one worker:

- ``chain-1`` .. ``chain-N`` (N = ``CHAIN_UNITS``): the tests that use the chain cluster (their
  fixture closure holds ``chain_cluster``), whole modules spread over N units longest first, so N
  workers each start one chain cluster (package-scoped) and run their modules one after the other:
  a test parametrised over two backends runs both on one cluster. One unit made the chain the
  run's critical path (13 min of tests in a 15-minute run once the straggler proof joined it); a
  second chain cluster costs its start-up and ~2.6 CPU-seconds a minute of idling;
- otherwise one unit per module, so a module's own fixtures (an operator process, a Kueue cluster,
  a Helm release) are set up once; the light dev cluster is session-scoped, at most one per worker.

Units start longest first (the longest-processing-time rule, so no long unit starts last), by an
estimate from the markers: ``slow`` 30 s, ``cluster`` or ``tools`` 3 s, anything else 0.05 s; a
test far longer than that says so with ``pytest.mark.slow(seconds=N)`` (its measured wall time on
a quiet machine), which the chain units are balanced by.
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


CHAIN_UNITS = 2


def estimate_s(item: pytest.Item) -> float:
    marks = list(item.iter_markers())  # closest first: a test's own mark before its module's
    declared = next((m.kwargs["seconds"] for m in marks if m.name == "slow" and "seconds" in m.kwargs), None)
    if declared is not None:
        return float(declared)
    return max([ESTIMATE_S[m.name] for m in marks if m.name in ESTIMATE_S] or [OTHER_S])


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def assign_units(items: list[pytest.Item]) -> dict[str, str]:
    """nodeid -> unit: the chain cluster's modules spread over ``CHAIN_UNITS`` units (each module
    whole, longest first onto the unit with the least so far; ties: collection order), any other
    test its module's unit."""
    chain_modules: dict[str, float] = {}
    for item in items:
        if CHAIN_FIXTURE in getattr(item, "fixturenames", ()):
            chain_modules[_module(item)] = chain_modules.get(_module(item), 0.0) + estimate_s(item)
    load = [0.0] * CHAIN_UNITS
    unit_of_module: dict[str, str] = {}
    for module, seconds in sorted(chain_modules.items(), key=lambda kv: -kv[1]):
        i = load.index(min(load))
        load[i] += seconds
        unit_of_module[module] = f"chain-{i + 1}"
    return {
        item.nodeid: unit_of_module[_module(item)]
        if CHAIN_FIXTURE in getattr(item, "fixturenames", ())
        else _module(item)
        for item in items
    }


def order_units(items: list[pytest.Item], unit_of: dict[str, str] | None = None) -> list[pytest.Item]:
    """``items`` grouped into their units (``unit_of``, by default :func:`assign_units`'), units
    longest first (ties: collection order); each unit's tests keep their collection order."""
    unit_of = unit_of or assign_units(items)
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(unit_of[item.nodeid], []).append(item)
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
    units = assign_units(items)  # from the collection order, which every worker shares
    items[:] = order_units(items, units)
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
