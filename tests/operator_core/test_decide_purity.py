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

The policy package is also light: it reaches Jinja2 and YAML only through the two doors that need
them (a backend rendering an attempt's child, the catalog reading its data; DOORS), and never the
Kubernetes client or kopf. Both checks read the imports statically, so no module they reach may
import dynamically (`importlib.import_module`, `__import__`, importlib.util's loaders, runpy,
`exec`/`eval`/`compile`): such a call is a failure, named by file and line.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from .test_import_graph import PACKAGES, ROOT, _all_imports, _module

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


def closure(
    start: str, graph: dict[str, frozenset[str]], doors: frozenset[tuple[str, str]] = frozenset()
) -> dict[str, list[str]]:
    """Every llmtrain module reachable from `start`, with one import chain that reaches it; the
    imports in `doors` (importer, imported) left out."""
    chains = {start: [start]}
    todo = [start]
    while todo:
        mod = todo.pop()
        for nxt in sorted(graph.get(mod, ())):
            if nxt in graph and nxt not in chains and (mod, nxt) not in doors:
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


# What the policy package must not reach: a template engine or YAML parser (it decides; rendering and
# parsing are the renderer's and the catalog's), the Kubernetes client or kopf (the adapters' I/O).
HEAVY = ("jinja2", "yaml", "kubernetes", "kopf")
# The imports through which it reaches Jinja2 and YAML on purpose, and why; every other path fails.
DOORS = {
    ("llmtrain.backends.base", "llmtrain.render"): "writes.create_attempt renders attempt N's child (Backend.render)",
    ("llmtrain.backends", "llmtrain.render"): "and names what that can raise (backends.RENDER_ERRORS)",
    ("llmtrain.catalog", "yaml"): "the instance catalog and model presets parse the package's own YAML (data/)",
}


def _matches(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def heavy_reach(starts, graph, doors=frozenset(DOORS)) -> list[str]:
    """Each import of HEAVY (or of llmtrain.render, the doors' other side) that the modules of
    `starts` reach without passing through `doors`: the shortest import chain to it."""
    doors = frozenset(doors)
    found: dict[tuple[str, str], list[str]] = {}
    for start in starts:
        for mod, chain in closure(start, graph, doors).items():
            for imp in sorted(graph[mod]):
                if (mod, imp) not in doors and _matches(imp, (*HEAVY, "llmtrain.render")):
                    if (mod, imp) not in found or len(chain) < len(found[mod, imp]) - 1:
                        found[mod, imp] = [*chain, imp]
    return sorted(" → ".join(chain) for chain in found.values())


def _policy_modules(graph) -> list[str]:
    return sorted(m for m in graph if m == POLICY or m.startswith(POLICY + "."))


def test_the_policy_package_reaches_jinja2_and_yaml_only_through_its_two_doors():
    graph = _graph()
    stale = [f"{a} → {b}" for a, b in DOORS if b not in graph[a]]
    assert stale == [], "a door no module uses any more: remove it from DOORS"
    bad = heavy_reach(_policy_modules(graph), graph)
    assert bad == [], "\n".join(bad)


def test_the_heavy_reach_check_finds_what_the_doors_let_through():
    """Without its doors the real package reaches Jinja2 through the renderer and YAML through the
    catalog; a made-up policy module that imports the renderer for a constant is found too."""
    graph = _graph()
    found = heavy_reach(_policy_modules(graph), graph, doors=())
    assert any(c.endswith("llmtrain.backends → llmtrain.render") for c in found), found
    assert any(c.endswith("llmtrain.catalog → yaml") for c in found), found
    made_up = {
        f"{POLICY}.shortcut": frozenset({"llmtrain.render"}),
        "llmtrain.render": frozenset({"jinja2", "yaml"}),
        f"{POLICY}.client": frozenset({"kubernetes.client"}),
    }
    assert heavy_reach([f"{POLICY}.client", f"{POLICY}.shortcut"], made_up) == [
        f"{POLICY}.client → kubernetes.client",
        f"{POLICY}.shortcut → llmtrain.render",
        f"{POLICY}.shortcut → llmtrain.render → jinja2",
        f"{POLICY}.shortcut → llmtrain.render → yaml",
    ]


# The machinery that imports or runs code by a name the static graph cannot follow.
DYNAMIC_BUILTINS = {"__import__", "exec", "eval", "compile"}
DYNAMIC_CALLS = {
    "import_module",  # importlib
    "__import__",  # builtins.__import__
    "reload",  # importlib.reload
    "spec_from_file_location",  # importlib.util
    "spec_from_loader",
    "module_from_spec",
    "exec_module",  # a loader's
    "load_module",
    "run_module",  # runpy
    "run_path",
}
DYNAMIC_MODULES = ("importlib.util", "importlib.machinery", "importlib.abc", "runpy", "imp", "zipimport")


def dynamic_imports(source: str, filename: str) -> list[str]:
    """`filename:line: what` for each place `source` can import a module or run code that the
    static import graph does not show."""
    found = []
    for node in ast.walk(ast.parse(source)):
        what = None
        if isinstance(node, ast.Name) and node.id in DYNAMIC_BUILTINS and isinstance(node.ctx, ast.Load):
            what = f"{node.id}"
        elif isinstance(node, ast.Attribute) and node.attr in DYNAMIC_CALLS:
            what = ast.unparse(node)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
            named = [a.value for a in node.args[1:2] if isinstance(a, ast.Constant)]
            if named and named[0] in DYNAMIC_BUILTINS | DYNAMIC_CALLS:
                what = ast.unparse(node)
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if _matches(a.name, DYNAMIC_MODULES)]
            what = ", ".join(f"import {n}" for n in names) or None
        elif isinstance(node, ast.ImportFrom) and not node.level:
            module = node.module or ""
            names = [a.name for a in node.names]
            if _matches(module, DYNAMIC_MODULES) or (
                module in ("importlib", "builtins")
                and any(
                    n in DYNAMIC_BUILTINS | DYNAMIC_CALLS or _matches(f"{module}.{n}", DYNAMIC_MODULES) for n in names
                )
            ):
                what = f"from {module} import {', '.join(names)}"
        if what:
            found.append(f"{filename}:{node.lineno}: {what}")
    return found


def _path_of(mod: str) -> Path:
    path = PKG.parent / (mod.replace(".", "/") + ".py")
    return path if path.is_file() else PKG.parent / mod.replace(".", "/") / "__init__.py"


def test_nothing_the_policy_package_reaches_imports_dynamically():
    """A policy module (or one it reaches) that imported kubernetes by `importlib.import_module`
    would pass every check above: the checks read import statements only."""
    graph = _graph()
    reached = sorted({m for start in _policy_modules(graph) for m in closure(start, graph)})
    assert "llmtrain.render" in reached and len(reached) > 30
    bad = [
        f for mod in reached for f in dynamic_imports(_path_of(mod).read_text(), str(_path_of(mod).relative_to(ROOT)))
    ]
    assert bad == [], "\n".join(bad)


def test_the_dynamic_import_check_finds_each_way():
    cases = {
        "import importlib\nk = importlib.import_module('kubernetes')": ["importlib.import_module"],
        "x = 1\nk = __import__('kubernetes')": ["__import__"],
        "from importlib import import_module as im\nk = im('kopf')": ["from importlib import import_module"],
        "import importlib.util as u\ns = u.spec_from_file_location('k', 'k.py')\nm = u.module_from_spec(s)\n"
        "s.loader.exec_module(m)": [
            "import importlib.util",
            "u.spec_from_file_location",
            "u.module_from_spec",
            "s.loader.exec_module",
        ],
        "from importlib import util": ["from importlib import util"],
        "exec('import kubernetes')": ["exec"],
        "k = eval(\"__import__('kubernetes')\")": ["eval"],
        "load = getattr(__builtins__, '__import__')": ["getattr(__builtins__, '__import__')"],
        "import runpy\nrunpy.run_module('kubernetes')": ["import runpy", "runpy.run_module"],
    }
    for source, expected in cases.items():
        found = dynamic_imports(source, "policy/made_up.py")
        assert sorted(f.split(": ", 1)[1] for f in found) == sorted(expected), (source, found)
        assert all(f.startswith("policy/made_up.py:") for f in found)
    assert dynamic_imports("x = 1\n\n__import__('os')", "p.py") == ["p.py:3: __import__"]
    # what the package does use, and is not an import: compiled patterns, the package's data files
    clean = "import re\nfrom importlib import resources\nP = re.compile('x')\nresources.files('llmtrain')"
    assert dynamic_imports(clean, "p.py") == []
