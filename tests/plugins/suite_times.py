"""The time per suite (a directory of tests/) at the end of every run, so a creeping suite shows.

For each suite: its tests, the sum of their setup + call + teardown times (what the suite costs,
whatever the parallelism) and its wall time, from its first test's start to its last test's end
(under xdist its tests overlap with other suites'). Collected from the test reports, which xdist
sends to the controller, so the table is the whole run's with or without ``-n``. A test without the
markers that keep it out of ``make test-fast`` but over ``SLOW_S`` is named below the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

import pytest


@dataclass
class _Suite:
    tests: set[str]
    seconds: float = 0.0
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


class SuiteTimes:
    def __init__(self) -> None:
        self.suites: dict[str, _Suite] = {}
        self.unmarked: dict[str, float] = {}  # tests of make test-fast's kind -> seconds

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not NOT_FAST & set(report.keywords):
            self.unmarked[report.nodeid] = self.unmarked.get(report.nodeid, 0.0) + report.duration
        suite = self.suites.setdefault(suite_of(report.nodeid), _Suite(set()))
        suite.tests.add(report.nodeid)
        suite.seconds += report.duration
        if report.start:
            suite.start = min(suite.start, report.start)
            suite.stop = max(suite.stop, report.stop)

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.suites:
            return
        tr = terminalreporter
        tr.write_sep("=", "time per suite (test time: setup + call + teardown, summed; wall: first start to last end)")
        tr.write_line(f"{'suite':<24} {'tests':>6} {'test time':>10} {'wall':>8}")
        for name, s in sorted(self.suites.items(), key=lambda kv: -kv[1].seconds):
            wall = s.stop - s.start if s.stop else 0.0
            tr.write_line(f"{name:<24} {len(s.tests):>6} {s.seconds:>9.1f}s {wall:>7.1f}s")
        total = sum(s.seconds for s in self.suites.values())
        tr.write_line(f"{'all':<24} {sum(len(s.tests) for s in self.suites.values()):>6} {total:>9.1f}s")
        slow = sorted(((t, n) for n, t in self.unmarked.items() if t > SLOW_S), reverse=True)
        if slow:
            tr.write_line(f"not marked slow, but over {SLOW_S:g} s (make test-fast runs them):")
            for seconds, nodeid in slow:
                tr.write_line(f"  {seconds:6.1f}s {nodeid}")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SuiteTimes(), "llmtrain-suite-times")
