"""The test suite's own plugins (tests/plugins/): markers from fixtures, xdist grouping and
order, and the time per suite. Each runs a small suite of its own in a pytest subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
FAST = "not cluster and not tools and not slow and not peer"  # the Makefile's test-fast selection


def _run(where: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "plugins.needs", *args],
        cwd=where,
        env={**os.environ, "PYTHONPATH": str(TESTS), **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    (root / "pytest.ini").write_text("[pytest]\nmarkers =\n    cluster: c\n    tools: t\n    slow: s\n    peer: p\n")
    return root


CONFTEST = """
    import pytest
    from plugins.needs import needs

    @pytest.fixture(scope="session")
    @needs("cluster")
    def a_cluster():
        return "cluster"

    @pytest.fixture
    @needs("tools")
    def a_tool():
        return "tool"

    @pytest.fixture
    def through_another(a_cluster):  # the marker follows the fixture closure
        return a_cluster
"""


def test_a_test_gets_the_markers_of_the_fixtures_it_uses_however_indirectly(tmp_path):
    _write(
        tmp_path,
        {
            "conftest.py": CONFTEST,
            "test_x.py": """
                def test_plain(): pass
                def test_cluster(a_cluster): pass
                def test_indirect(through_another): pass
                def test_tool(a_tool): pass
            """,
        },
    )
    r = _run(tmp_path, "--collect-only", "-q", "-m", FAST)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "test_x.py::test_plain" in r.stdout and "1/4 tests collected (3 deselected)" in r.stdout, r.stdout
    r = _run(tmp_path, "--collect-only", "-q", "-m", "tools and not cluster")
    assert "test_x.py::test_tool" in r.stdout and "1/4 tests collected" in r.stdout, r.stdout
    r = _run(tmp_path, "--collect-only", "-q", "-m", "cluster and tools")  # a cluster needs the tools
    assert "2/4 tests collected" in r.stdout, r.stdout


def test_an_unmarked_test_that_starts_a_cluster_or_finds_a_tool_fails(tmp_path):
    """Inline, without a fixture, the marker cannot be applied: such a test fails wherever it runs
    (also in a subprocess it starts), rather than slipping into make test-fast."""
    _write(
        tmp_path,
        {
            "conftest.py": CONFTEST,
            "test_x.py": """
                import subprocess, sys
                import pytest
                from llmtrain_devcluster import DevCluster
                from llmtrain_devcluster.tools import UnmarkedTestError, find_tool

                def test_inline_tool():
                    find_tool("kubectl")

                def test_inline_cluster(tmp_path):
                    DevCluster(tmp_path).up()

                def test_in_a_subprocess():
                    subprocess.run([sys.executable, "-c", "from llmtrain_devcluster.tools import find_tool; "
                                    "find_tool('helm')"], check=True)

                def test_with_the_fixture(a_tool):
                    import os
                    assert "LLMTRAIN_TEST_WITHOUT_TOOLS" not in os.environ
            """,
        },
    )
    r = _run(tmp_path, "-q", "-rf")
    assert "3 failed, 1 passed" in r.stdout, r.stdout + r.stderr
    assert r.stdout.count("is not marked `tools`") + r.stderr.count("is not marked `tools`") >= 2, r.stdout
    assert "test_inline_cluster" in r.stdout and "is not marked `cluster`" in r.stdout, r.stdout


def test_no_test_marks_cluster_or_tools_by_hand():
    """The fixtures apply them; a hand-made mark would hide a test that starts its own cluster
    (``own_clusters``) or runs the tools (``kube_tools``) from the guard."""
    import re

    hand = re.compile(r"pytest\.mark\.(cluster|tools)\b")
    found = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in sorted(TESTS.rglob("*.py"))
        if p != Path(__file__)
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if hand.search(line)
    ]
    assert not found, found


def test_the_suites_cluster_tests_are_marked_by_their_fixtures():
    """test_goodput_cli.py's live test reads a job from the API server: it was run by make test-fast
    without the `cluster` marker. Its fixtures mark it now, and the unit tests beside it stay."""
    r = _run(TESTS / "..", "--collect-only", "-q", "-m", FAST, "tests/operator_core/test_goodput_cli.py")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "test_goodput_reads_a_live_job_and_its_events_from_the_api_server" not in r.stdout, r.stdout
    assert "tests collected (1 deselected)" in r.stdout, r.stdout


def test_make_test_fast_needs_no_tools_and_no_go():
    r = subprocess.run(["make", "-n", "test-fast"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "pytest" in r.stdout and FAST in r.stdout, r.stdout
    for build in ("install-tools", "install-kueue", "install-kubeconform", "infra-terraform", "go-toolchain"):
        assert build not in r.stdout, (build, r.stdout)


@pytest.mark.parametrize(
    "workers",
    [[], pytest.param(["-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder"], marks=pytest.mark.slow)],
)
def test_the_time_per_suite_closes_every_run(tmp_path, workers):
    _write(
        tmp_path,
        {
            "conftest.py": "",
            "tests/one/test_a.py": "def test_a(): pass\ndef test_b(): pass\n",
            "tests/two/test_c.py": "import time\ndef test_c(): time.sleep(0.3)\n",
            # CPU in a child process (as a cluster's or torchrun's): the suite's CPU counts it
            "tests/three/test_d.py": (
                "import subprocess, sys\n"
                "def test_d():\n"
                "    busy = 'import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.5: pass'\n"
                "    subprocess.run([sys.executable, '-c', busy], check=True)\n"
            ),
        },
    )
    r = _run(tmp_path, "-p", "plugins.suite_times", "-p", "plugins.schedule", *workers)
    assert r.returncode == 0, r.stdout + r.stderr
    table = r.stdout.split("time per suite", 1)[1].splitlines()
    rows = {ln.split()[0]: ln.split() for ln in table[2:] if ln.strip() and not ln.startswith("=")}
    assert rows["one"][1] == "2" and rows["two"][1] == "1" and rows["all"][1] == "4", table
    assert float(rows["two"][2].rstrip("s")) >= 0.3, table
    # columns: suite, tests, test time, CPU, wall; a sleep costs time, not CPU
    assert float(rows["two"][3].rstrip("s")) < 0.2, table
    assert float(rows["three"][3].rstrip("s")) >= 0.5, table


class _Item:
    """What the schedule reads of a collected test: its id, fixture closure and markers."""

    def __init__(self, nodeid: str, fixtures: tuple[str, ...] = (), marks: tuple[str, ...] = ()):
        self.nodeid, self.fixturenames, self.marks = nodeid, fixtures, marks

    def iter_markers(self):
        return iter(getattr(pytest.mark, m).mark for m in self.marks)


def test_units_start_longest_first_and_each_chain_module_stays_whole():
    from plugins.schedule import assign_units, order_units

    items = [
        _Item("tests/a/test_units.py::test_1"),
        _Item("tests/a/test_units.py::test_2"),
        _Item("tests/chain/test_one.py::test_x[pytorchjob]", ("chain_cluster",), ("cluster", "slow")),
        _Item("tests/b/test_light.py::test_1", ("dev_cluster",), ("cluster",)),
        _Item("tests/chain/test_pure.py::test_invariant"),
        _Item("tests/c/test_trainer.py::test_1", (), ("slow",)),
        _Item("tests/c/test_trainer.py::test_2", (), ("slow",)),
        _Item("tests/chain/test_two.py::test_y[jobset]", ("chain_cluster",), ("cluster", "slow")),
        _Item("tests/chain/test_two.py::test_y[pytorchjob]", ("chain_cluster",), ("cluster", "slow")),
    ]
    ordered = [i.nodeid for i in order_units(items)]
    units = assign_units(items)
    # The chain modules: test_two (2 slow tests, both backends on one cluster: 60 s) and test_one
    # (30 s) in the two chain units; the two slow trainer tests (60 s) tie with test_two's unit and
    # come first, as the first of them is collected before test_two; then test_one's unit, the
    # light-cluster module, the unit tests; within a unit, collection order.
    assert ordered == [
        "tests/c/test_trainer.py::test_1",
        "tests/c/test_trainer.py::test_2",
        "tests/chain/test_two.py::test_y[jobset]",
        "tests/chain/test_two.py::test_y[pytorchjob]",
        "tests/chain/test_one.py::test_x[pytorchjob]",
        "tests/b/test_light.py::test_1",
        "tests/a/test_units.py::test_1",
        "tests/a/test_units.py::test_2",
        "tests/chain/test_pure.py::test_invariant",
    ]
    assert units["tests/chain/test_two.py::test_y[jobset]"] == units["tests/chain/test_two.py::test_y[pytorchjob]"]
    assert {units[i.nodeid] for i in items if "chain_cluster" in i.fixturenames} == {"chain-1", "chain-2"}
    assert units["tests/chain/test_pure.py::test_invariant"] == "tests/chain/test_pure.py"  # no chain cluster


def test_the_chain_units_are_balanced_by_the_seconds_a_test_declares():
    """Longest first onto the least-loaded chain unit, by ``slow(seconds=N)`` where a test declares
    it (its own mark before its module's), else 30 s a slow test: 200 | 120 + 50 + 30."""
    from plugins.schedule import assign_units, estimate_s

    class _Declared(_Item):
        def __init__(self, nodeid: str, seconds: float):
            super().__init__(nodeid, ("chain_cluster",))
            self.seconds = seconds

        def iter_markers(self):
            return iter([pytest.mark.slow(seconds=self.seconds).mark, pytest.mark.slow.mark])

    items = [
        _Item("tests/chain/test_a.py::test_1", ("chain_cluster",), ("cluster", "slow")),
        _Declared("tests/chain/test_b.py::test_1", 120),
        _Declared("tests/chain/test_c.py::test_1", 200),
        _Declared("tests/chain/test_d.py::test_1", 50),
    ]
    assert [estimate_s(i) for i in items] == [30.0, 120.0, 200.0, 50.0]
    units = assign_units(items)
    assert units["tests/chain/test_c.py::test_1"] != units["tests/chain/test_b.py::test_1"]
    assert units["tests/chain/test_b.py::test_1"] == units["tests/chain/test_d.py::test_1"]
    assert units["tests/chain/test_a.py::test_1"] == units["tests/chain/test_b.py::test_1"]


@pytest.mark.slow
def test_under_xdist_a_unit_runs_on_one_worker_and_the_chain_modules_on_two(tmp_path):
    """make test's options, on a small suite: each module's tests on one worker, and the two modules
    that use the chain cluster in two units, each whole on its own worker (one cluster each).

    The chain tests are marked slow, as the real ones are: the longest units go out first, one to
    each worker; shorter units go to whichever worker runs low first, which with tests this quick
    was once the same worker for both chain units."""
    log = tmp_path / "ran.log"
    test = (
        "import os\n"
        "def _ran(name):\n"
        f"    with open({str(log)!r}, 'a') as f:\n"
        "        f.write(name + ' ' + os.environ['PYTEST_XDIST_WORKER'] + '\\n')\n"
    )
    files = {"conftest.py": "import pytest\n@pytest.fixture(scope='session')\ndef chain_cluster():\n    return 1\n"}
    for module in ("a", "b", "c", "d"):
        files[f"test_{module}.py"] = test + "".join(f"def test_{module}{i}(): _ran('{module}')\n" for i in range(4))
    for module in ("chain1", "chain2"):
        files[f"test_{module}.py"] = (
            "import pytest\n"
            + test
            + "".join(f"@pytest.mark.slow\ndef test_{module}_{i}(chain_cluster): _ran('{module}')\n" for i in range(3))
        )
    _write(tmp_path, files)
    r = _run(tmp_path, "-p", "plugins.schedule", "-n", "3", "--dist", "loadgroup", "--no-loadscope-reorder")
    assert r.returncode == 0, r.stdout + r.stderr
    workers: dict[str, set[str]] = {}
    for line in log.read_text().splitlines():
        unit, worker = line.split()
        workers.setdefault(unit, set()).add(worker)
    assert set(workers) == {"a", "b", "c", "d", "chain1", "chain2"}, workers
    assert all(len(w) == 1 for w in workers.values()), workers
    assert workers["chain1"] != workers["chain2"], workers
