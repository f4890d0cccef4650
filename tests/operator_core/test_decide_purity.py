"""decide() is pure by construction: no module it can reach performs I/O.

"Performs I/O", checkably, for every module in the import closure of controller/policy/decide.py (every
import counts, inside functions too; only TYPE_CHECKING blocks are left out, they never run):
  * it imports nothing that talks to the world: the Kubernetes client, kopf, an HTTP or socket
    library, processes, the environment, the file system, threads or event loops, the clock and
    sleep (`time`), logging; nor controller.adapters.kube, the operator's API calls;
  * it calls no built-in that reads or writes (open, print, input) and reads no clock
    (`.now()`, `.utcnow()`, `.today()`): decide's time is its snapshot's `now`.
Reading the package's own data files (the catalog's YAML, the PyTorchJob template) is not I/O
here: they ship with the code and do not change while it runs.
"""

from __future__ import annotations

import ast
import functools

from .test_import_graph import PACKAGES, _all_imports, _module

PKG = PACKAGES["llmtrain"]

DECIDE = "llmtrain.controller.policy.decide"
POLICY = "llmtrain.controller.policy"
IO_MODULES = (
    # the API server, and any network
    "kubernetes",
    "kopf",
    "llmtrain.controller.adapters.kube",
    "aiohttp",
    "urllib",
    "http",
    "socket",
    "ssl",
    "requests",
    "boto3",
    "botocore",
    # processes, the environment, files
    "subprocess",
    "multiprocessing",
    "os",
    "pathlib",
    "importlib.resources",
    "shutil",
    "tempfile",
    # threads, event loops, the clock
    "threading",
    "concurrent",
    "asyncio",
    "selectors",
    "time",
    "logging",
)
IO_CALLS = {"open", "print", "input"}
FILE_METHODS = {"open", "read_text", "read_bytes", "write_text", "write_bytes", "mkdir", "unlink", "touch", "iterdir"}
CLOCK_READS = {"now", "utcnow", "today"}
# What a module may do of the above, and why it is no I/O for decide.
PACKAGE_DATA = {
    "llmtrain.catalog": {"importlib.resources", "read_text"},  # its own YAML (data/), read once (cached)
}


# Parsed once per process: the sources do not change while the tests run, and the policy test asks
# for every policy module's closure, which parsed the whole package again for each (10 s of CPU).
@functools.cache
def _graph() -> dict[str, frozenset[str]]:
    return {_module(p, PKG): frozenset(_all_imports(p, PKG)) for p in PKG.rglob("*.py")}


def closure(start: str, graph: dict[str, frozenset[str]]) -> dict[str, list[str]]:
    """Every llmtrain module reachable from `start`, with one import chain that reaches it."""
    chains = {start: [start]}
    todo = [start]
    while todo:
        mod = todo.pop()
        for nxt in sorted(graph.get(mod, ())):
            if nxt in graph and nxt not in chains:
                chains[nxt] = [*chains[mod], nxt]
                todo.append(nxt)
    return chains


def _io_imports(imports: frozenset[str]) -> list[tuple[str, str]]:
    """(what, where) of each I/O module imported."""
    return sorted((m, m) for m in imports if any(m == io or m.startswith(io + ".") for io in IO_MODULES))


def _io_calls(source: str) -> list[tuple[str, str]]:
    """(what, where) of each call that reads or writes, or reads the clock."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id in IO_CALLS:
                found.append((f.id, f"{f.id}() at line {node.lineno}"))
            elif isinstance(f, ast.Attribute) and f.attr in CLOCK_READS | FILE_METHODS:
                found.append((f.attr, f"{ast.unparse(f)}() at line {node.lineno}"))
    return found


@functools.cache
def _found(mod: str) -> tuple[str, ...]:
    """Where module `mod` performs I/O (what PACKAGE_DATA allows it left out)."""
    path = PKG.parent / (mod.replace(".", "/") + ".py")
    if not path.is_file():
        path = PKG.parent / mod.replace(".", "/") / "__init__.py"
    allowed = PACKAGE_DATA.get(mod, set())
    found = _io_imports(_graph()[mod]) + _io_calls(path.read_text())
    return tuple(where for what, where in found if what not in allowed)


def violations(start: str) -> list[str]:
    out = []
    for mod, chain in sorted(closure(start, _graph()).items()):
        found = _found(mod)
        if found:
            out.append(f"{' → '.join(chain)}: {', '.join(found)}")
    return out


def test_no_module_decide_reaches_performs_io():
    bad = violations(DECIDE)
    assert not bad, "\n".join(bad)


def test_the_policy_package_is_pure_and_decide_reaches_nothing_else_of_the_controller():
    """The layout says it: controller/policy/ holds decide and every pure verdict it reads, and no
    module of it performs I/O (nor any module one of them reaches); the I/O is controller/adapters/."""
    graph = _graph()
    policy = sorted(m for m in graph if m == POLICY or m.startswith(POLICY + "."))
    assert DECIDE in policy and len(policy) > 10
    bad = sorted({v for m in policy for v in violations(m)})
    assert not bad, "\n".join(bad)
    outside = sorted(
        m for m in closure(DECIDE, graph) if m.startswith("llmtrain.controller.") and not m.startswith(POLICY)
    )
    assert outside == []


def test_the_check_sees_io_where_there_is_some():
    """The same check on the reconciler (observe → decide → act) finds the API client, so an empty
    answer for decide means something."""
    bad = "\n".join(violations("llmtrain.controller.reconciler"))
    assert "llmtrain.controller.adapters.kube: kubernetes" in bad, bad
    assert [where for _, where in _io_calls("import datetime as dt\nprint(dt.datetime.now())")] == [
        "print() at line 2",
        "dt.datetime.now() at line 2",
    ]


def test_nothing_after_decide_tells_rows_apart_by_name():
    """What follows decide's choice reads the plan's fields, never its situation's name: the
    amendments that asked `plan.situation == "steady"` are the steady row's own now (its
    checkpoint refresh) and its `periodic` field (goodput's refresh)."""
    tests = [
        f"{p.relative_to(PKG.parent)}:{node.lineno}: {ast.unparse(node)}"
        for p in sorted(PKG.rglob("*.py"))
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.Compare)
        and any(isinstance(x, ast.Attribute) and x.attr == "situation" for x in [node.left, *node.comparators])
    ]
    assert tests == []
