"""The time and CPU per suite (a directory of tests/) at the end of every run, so a creeping suite
shows.

For each suite: its tests, the sum of their setup + call + teardown times (what the suite costs in
time, whatever the parallelism), their CPU seconds (the test process's and every process it
started: clusters, torchrun, kubectl, helm, terraform, checkov; see :mod:`plugins.cpu`) and its wall
time, from its first test's start to its last test's end (under xdist its tests overlap with other
suites'). Wall times on a shared machine move with the neighbours' load; the CPU column barely does.

Collected from the test reports, which xdist sends to the controller (each report carries its
phase's CPU as ``cpu_s``), so the table is the whole run's with or without ``-n``. Below it: the CPU
of start-up and collection (each xdist worker imports and collects the whole suite) and of the
controller, and the run's total. ``--suite-times-json=PATH`` also writes the CPU and time per
module and per test. A test without the markers that keep it out of ``make test-fast`` but over
``SLOW_S`` is named below the table.
"""

from __future__ import annotations

import json
import resource
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import pytest

from plugins.cpu import tree_cpu_s


@dataclass
class _Suite:
    tests: set[str] = field(default_factory=set)
    seconds: float = 0.0
    cpu_s: float = 0.0
    start: float = float("inf")
    stop: float = 0.0


def suite_of(nodeid: str) -> str:
    """``tests/chain/test_x.py::test_y`` -> ``chain``; a test file directly in tests/ -> ``.``."""
    path = PurePosixPath(nodeid.split("::", 1)[0])
    parts = path.parts[1:] if path.parts and path.parts[0] == "tests" else path.parts
    return "/".join(parts[:-1]) or "."


# A test of make test-fast's kind (none of these markers) that takes longer than this is listed
# after the table: it wants the `slow` marker (see CONTRIBUTING.md).
SLOW_S = 10.0
NOT_FAST = {"slow", "cluster", "tools", "peer"}
_WORKER_KEY = "llmtrain_cpu"


class CpuMeter:
    """In the process that runs the tests (an xdist worker, or pytest itself without ``-n``): each
    report gets the CPU used since the previous one (``report.cpu_s``), so every second from the
    first test's setup to the last test's teardown (session fixtures included) is some phase's."""

    def __init__(self) -> None:
        self.startup_s = 0.0  # interpreter start, imports and collection
        self.mark: float | None = None

    def lap(self) -> float:
        now = tree_cpu_s()
        spent = now - (self.mark if self.mark is not None else now)
        self.mark = now
        return spent

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self) -> None:
        self.startup_s = tree_cpu_s()
        self.mark = self.startup_s

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self):
        outcome = yield
        outcome.get_result().cpu_s = self.lap()


class SuiteTimes:
    def __init__(self, meter: CpuMeter, json_path: str | None) -> None:
        self.meter = meter
        self.json_path = json_path
        self.suites: dict[str, _Suite] = {}
        self.tests: dict[str, list[float]] = {}  # nodeid -> [seconds, cpu_s]
        self.spans: dict[str, tuple[str, float, float]] = {}  # nodeid -> (worker, first start, last end)
        self.unmarked: dict[str, float] = {}  # tests of make test-fast's kind -> seconds
        self.workers: dict[str, dict[str, float]] = {}  # xdist worker id -> its start-up and total CPU

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        cpu_s = float(getattr(report, "cpu_s", 0.0))
        if not NOT_FAST & set(report.keywords):
            self.unmarked[report.nodeid] = self.unmarked.get(report.nodeid, 0.0) + report.duration
        suite = self.suites.setdefault(suite_of(report.nodeid), _Suite())
        suite.tests.add(report.nodeid)
        suite.seconds += report.duration
        suite.cpu_s += cpu_s
        test = self.tests.setdefault(report.nodeid, [0.0, 0.0])
        test[0] += report.duration
        test[1] += cpu_s
        if report.start:
            suite.start = min(suite.start, report.start)
            suite.stop = max(suite.stop, report.stop)
            node = getattr(report, "node", None)  # xdist's controller sets it
            worker = node.workerinput["workerid"] if node is not None else "-"
            _, start, _ = self.spans.get(report.nodeid, (worker, report.start, 0.0))
            self.spans[report.nodeid] = (worker, start, report.stop)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        """Controller: a worker's start-up and total CPU, as it reported them at its end."""
        cpu = getattr(node, "workeroutput", {}).get(_WORKER_KEY)
        if cpu:
            self.workers[node.workerinput["workerid"]] = cpu

    def _outside_tests(self) -> tuple[float, float, float]:
        """CPU seconds of start-up and collection, of the controller, and of the whole run."""
        if not self.workers:  # without xdist: this process ran the tests
            return self.meter.startup_s, 0.0, tree_cpu_s()
        own = resource.getrusage(resource.RUSAGE_SELF)
        own_s = own.ru_utime + own.ru_stime
        startup = sum(w["startup_s"] for w in self.workers.values())
        return startup, own_s, own_s + sum(w["total_s"] for w in self.workers.values())

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.suites:
            return
        tr = terminalreporter
        tr.write_sep(
            "=", "time per suite (test time and CPU: setup + call + teardown, summed; wall: first start to last end)"
        )
        tr.write_line(f"{'suite':<24} {'tests':>6} {'test time':>10} {'CPU':>8} {'wall':>8}")
        for name, s in sorted(self.suites.items(), key=lambda kv: -kv[1].seconds):
            wall = s.stop - s.start if s.stop else 0.0
            tr.write_line(f"{name:<24} {len(s.tests):>6} {s.seconds:>9.1f}s {s.cpu_s:>7.1f}s {wall:>7.1f}s")
        total = sum(s.seconds for s in self.suites.values())
        in_tests = sum(s.cpu_s for s in self.suites.values())
        count = sum(len(s.tests) for s in self.suites.values())
        tr.write_line(f"{'all':<24} {count:>6} {total:>9.1f}s {in_tests:>7.1f}s")
        startup, controller, run = self._outside_tests()
        who = f"{len(self.workers)} workers" if self.workers else "pytest"
        tr.write_line(
            f"CPU outside the tests: start-up and collection {startup:.1f}s ({who}), xdist controller "
            f"{controller:.1f}s; the whole run {run:.1f}s"
        )
        slow = sorted(((t, n) for n, t in self.unmarked.items() if t > SLOW_S), reverse=True)
        if slow:
            tr.write_line(f"not marked slow, but over {SLOW_S:g} s (make test-fast runs them):")
            for seconds, nodeid in slow:
                tr.write_line(f"  {seconds:6.1f}s {nodeid}")
        if self.json_path:
            self._write_json(Path(self.json_path), startup, controller, run)
            tr.write_line(f"time and CPU per module and test: {self.json_path}")

    def _write_json(self, path: Path, startup: float, controller: float, run: float) -> None:
        modules: dict[str, list[float]] = {}
        for nodeid, (seconds, cpu_s) in self.tests.items():
            m = modules.setdefault(nodeid.split("::", 1)[0], [0.0, 0.0])
            m[0] += seconds
            m[1] += cpu_s

        def by_cpu(kv):
            return -kv[1][1]

        doc = {
            "cpu_s": {"run": run, "startup_and_collection": startup, "xdist_controller": controller},
            "workers": self.workers,
            "suites": {
                n: {"tests": len(s.tests), "seconds": s.seconds, "cpu_s": s.cpu_s} for n, s in self.suites.items()
            },
            "modules": {n: {"seconds": t, "cpu_s": c} for n, (t, c) in sorted(modules.items(), key=by_cpu)},
            "tests": {
                n: {"seconds": t, "cpu_s": c, "worker": w, "start": a, "stop": b}
                for n, (t, c) in sorted(self.tests.items(), key=by_cpu)
                for w, a, b in [self.spans.get(n, ("-", 0.0, 0.0))]
            },
        }
        path.write_text(json.dumps(doc, indent=1) + "\n")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--suite-times-json",
        metavar="PATH",
        default=None,
        help="also write the time and CPU seconds per suite, module and test to PATH (JSON)",
    )


def pytest_configure(config: pytest.Config) -> None:
    meter = CpuMeter()
    config.pluginmanager.register(meter, "llmtrain-cpu-meter")
    if hasattr(config, "workerinput"):
        config.pluginmanager.register(_WorkerReport(meter), "llmtrain-cpu-worker")
        return
    config.pluginmanager.register(SuiteTimes(meter, config.getoption("suite_times_json")), "llmtrain-suite-times")


class _WorkerReport:
    """An xdist worker tells the controller its start-up and total CPU when it ends."""

    def __init__(self, meter: CpuMeter) -> None:
        self.meter = meter

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        cpu = {"startup_s": self.meter.startup_s, "total_s": tree_cpu_s()}
        session.config.workeroutput[_WORKER_KEY] = cpu  # type: ignore[attr-defined]
