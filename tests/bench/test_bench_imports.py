"""bench/'s import graph has no cycle, counting the imports inside functions too.

The benchmarks are scripts that import each other by bare name (each puts bench/ on sys.path), and
most of those imports sit inside functions, so a cycle costs nothing at start-up and goes unseen:
operator_scale and trainer_peer imported each other, one side taking the other's private clean-up.
What several benches share belongs in a module they import (chainbench.py for the chain cluster's
chores), never in one of the benches. Checked like the packages' graph
(tests/operator_core/test_import_graph.py, whose cycle finder this uses): every import in the file's
whole syntax tree, only TYPE_CHECKING blocks left out (they never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

from operator_core.test_import_graph import _cycle

BENCH = Path(__file__).resolve().parents[2] / "bench"


def bench_imports(source: str, modules: set[str]) -> set[str]:
    """The modules of `modules` that `source` imports, wherever the import statement is."""
    tree = ast.parse(source)
    typing_only = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for n in ast.walk(block)
    }
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out & modules


def import_graph(folder: Path = BENCH) -> dict[str, set[str]]:
    """Each script of `folder` → the scripts of `folder` it imports (by bare name, as they do)."""
    files = sorted(folder.glob("*.py"))
    modules = {p.stem for p in files}
    return {p.stem: bench_imports(p.read_text(), modules) - {p.stem} for p in files}


def test_the_bench_import_graph_has_no_cycle():
    graph = import_graph()
    # function-level imports are in the graph: --peer hands over to trainer_peer inside main()
    assert "trainer_peer" in graph["operator_scale"] and "chainbench" in graph["trainer_peer"]
    cycle = _cycle(graph)
    assert cycle is None, "import cycle in bench/: " + " → ".join(cycle or [])


def test_the_check_finds_a_cycle_hidden_in_functions(tmp_path):
    (tmp_path / "shared.py").write_text("X = 1\n")
    (tmp_path / "first.py").write_text("import shared\n\n\ndef run():\n    from second import helper\n")
    (tmp_path / "second.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    import first\n\n\ndef helper():\n    pass\n"
    )
    assert import_graph(tmp_path) == {"first": {"shared", "second"}, "second": set(), "shared": set()}
    assert _cycle(import_graph(tmp_path)) is None  # the TYPE_CHECKING import never runs

    (tmp_path / "second.py").write_text("def helper():\n    if True:\n        from first import run\n")
    assert _cycle(import_graph(tmp_path)) == ["first", "second", "first"]
