"""The llmtrain package has no import cycle, counting the imports inside functions too (a cycle
hidden in a function is still one: the issue found forensics ↔ handlers, for the metrics, and
defaults ↔ spec, derive inside a pydantic validator). Only imports under TYPE_CHECKING are left
out: they never run."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "operator" / "llmtrain"


def _module(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _all_imports(path: Path) -> set[str]:
    """Every module the file imports (relative imports resolved), ours and others'."""
    mod = _module(path)
    package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    out: set[str] = set()
    tree = ast.parse(path.read_text())
    typing_only = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for n in ast.walk(block)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [f"{target}.{a.name}" for a in node.names]
            out.update(n for n in names if (PKG.parent / (n.replace(".", "/") + ".py")).is_file())
            out.add(target)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out - {mod}


def _imports(path: Path) -> set[str]:
    return {m for m in _all_imports(path) if m.startswith("llmtrain")}


def test_no_import_cycles():
    graph = {_module(p): _imports(p) for p in PKG.rglob("*.py")}
    done: set[str] = set()

    def visit(node: str, stack: list[str]) -> None:
        if node in stack:
            raise AssertionError("import cycle: " + " → ".join(stack[stack.index(node) :] + [node]))
        if node in done or node not in graph:
            return
        for nxt in sorted(graph[node]):
            visit(nxt, stack + [node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
