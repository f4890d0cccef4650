"""Size limits in the shipped packages: no module over 500 lines, no function over 100.

A long module or function usually holds more than one responsibility; the limit makes a change that
grows one say so. None is over it today. The OVER list below is how a debt would be recorded: a
listed one may shrink, none may grow, a new one fails, and when a listed one comes within the limit
its entry goes (the test says so), so the list only ever gets shorter.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("operator/llmtrain", "trainer/llmtrain_trainer", "devcluster/llmtrain_devcluster")
MODULE_LINES, FUNCTION_LINES = 500, 100

# Over the limit and allowed to stay, with the size it may not grow past. Empty since every module and
# function came within the limit; an entry here is a debt to split by responsibility, not by count.
OVER: dict[str, int] = {}


def sizes(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, int]:
    """Every module's lines and every function's (methods as Class.method, nested functions on their
    own too), keyed as OVER is."""
    out: dict[str, int] = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            source = path.read_text()
            out[rel] = len(source.splitlines())

            def visit(node: ast.AST, prefix: str, rel: str = rel) -> None:
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, ast.ClassDef):
                        visit(child, f"{prefix}{child.name}.")
                    elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                        assert child.end_lineno is not None
                        out[f"{rel}:{prefix}{child.name}"] = child.end_lineno - child.lineno + 1
                        visit(child, f"{prefix}{child.name}.")

            visit(ast.parse(source), "")
    return out


def limit(key: str) -> int:
    return FUNCTION_LINES if ":" in key else MODULE_LINES


def test_no_module_or_function_grows_past_its_limit():
    found = sizes()
    over = {k: n for k, n in found.items() if n > limit(k)}
    new = {k: n for k, n in over.items() if k not in OVER}
    grown = {k: (n, OVER[k]) for k, n in over.items() if k in OVER and n > OVER[k]}
    assert not new, f"over {MODULE_LINES} lines (module) or {FUNCTION_LINES} (function); split it: {new}"
    assert not grown, f"grew past its listed size (now, listed): {grown}"


def test_the_list_of_exceptions_only_shrinks():
    found = sizes()
    gone = sorted(k for k in OVER if k not in found)
    within = sorted(k for k in OVER if k in found and found[k] <= limit(k))
    assert not gone, f"listed in OVER but no longer exists; remove the entry: {gone}"
    assert not within, f"within the limit now; remove the entry from OVER: {within}"


def test_the_measure_counts_what_it_says(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(
        "class A:\n    def m(self):\n        def inner():\n            pass\n\n        return 1\n\n\nasync def f():\n    pass\n"
    )
    assert sizes(tmp_path, ("pkg",)) == {"pkg/m.py": 10, "pkg/m.py:A.m": 5, "pkg/m.py:A.m.inner": 2, "pkg/m.py:f": 2}
    assert limit("a.py") == MODULE_LINES and limit("a.py:A.m") == FUNCTION_LINES
