"""The import graph of both shipped packages, ``llmtrain`` (operator/: the API shared by the operator,
the CLI and the trainer, plus the controller) and ``llmtrain_trainer`` (trainer/), taken as one:

- no import cycle, counting the imports inside functions too (a cycle hidden in a function is still
  one: the issue found forensics ↔ handlers, for the metrics, and defaults ↔ spec, derive inside a
  pydantic validator, and the ``llmtrain`` CLI importing the trainer's commands while the trainer
  imports the shared API);
- one direction between the packages: the trainer reads the shared API, the shared API never names
  the trainer (the CLI finds the trainer's commands through the ``llmtrain.cli`` entry point), and
  the trainer never reaches the controller (a worker pod does not run the operator).

Only imports under TYPE_CHECKING are left out: they never run."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"llmtrain": ROOT / "operator" / "llmtrain", "llmtrain_trainer": ROOT / "trainer" / "llmtrain_trainer"}


def _module(path: Path, pkg: Path) -> str:
    parts = list(path.relative_to(pkg.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    top = PACKAGES.get(name.split(".")[0])
    if top is None:
        return False
    base = top.parent / name.replace(".", "/")
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _all_imports(path: Path, pkg: Path) -> set[str]:
    """Every module the file imports, ours and others' (relative imports resolved; `from a import b`
    counts `a.b` when b is one of our modules). test_decide_purity reads the others' too."""
    mod = _module(path, pkg)
    package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    typing_only = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for n in ast.walk(block)
    }
    out: set[str] = set()
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
            out.add(target)
            out.update(f"{target}.{a.name}" for a in node.names if _is_module(f"{target}.{a.name}"))
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out - {mod}


def _imports_of(path: Path, pkg: Path) -> set[str]:
    """Every module of ours the file imports."""
    return {m for m in _all_imports(path, pkg) if m.split(".")[0] in PACKAGES}


def import_graph() -> dict[str, set[str]]:
    return {_module(p, pkg): _imports_of(p, pkg) for pkg in PACKAGES.values() for p in pkg.rglob("*.py")}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()

    def visit(node: str, stack: list[str]) -> list[str] | None:
        if node in stack:
            return [*stack[stack.index(node) :], node]
        if node in done or node not in graph:
            return None
        for nxt in sorted(graph[node]):
            found = visit(nxt, [*stack, node])
            if found:
                return found
        done.add(node)
        return None

    for node in sorted(graph):
        found = visit(node, [])
        if found:
            return found
    return None


def test_the_cycle_finder_finds_a_cycle_through_both_packages():
    """The finder itself, on the shape the issue found (so the test below can fail)."""
    graph = {
        "llmtrain.cli": {"llmtrain_trainer.cli.commands"},
        "llmtrain_trainer.cli.commands": {"llmtrain.validation"},
    }
    assert _cycle(graph) is None
    graph["llmtrain.validation"] = {"llmtrain.cli"}
    assert _cycle(graph) == ["llmtrain.cli", "llmtrain_trainer.cli.commands", "llmtrain.validation", "llmtrain.cli"]


def test_no_import_cycles_in_or_between_the_packages():
    graph = import_graph()
    assert any(m.startswith("llmtrain_trainer.") for m in graph) and "llmtrain.controller.policy.decide" in graph
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " → ".join(cycle or [])


def test_the_shared_api_never_names_the_trainer_and_the_trainer_never_reaches_the_controller():
    graph = import_graph()
    api_to_trainer = sorted(
        f"{m} → {t}"
        for m, ts in graph.items()
        if m.split(".")[0] == "llmtrain"
        for t in ts
        if t.startswith("llmtrain_trainer")
    )
    trainer_to_controller = sorted(
        f"{m} → {t}"
        for m, ts in graph.items()
        if m.startswith("llmtrain_trainer")
        for t in ts
        if t == "llmtrain.controller" or t.startswith("llmtrain.controller.")
    )
    assert api_to_trainer == [] and trainer_to_controller == []


def test_the_cli_finds_the_trainers_commands_through_its_entry_point():
    """What replaced the lazy import: the package metadata names the trainer's `register`, and the
    installed CLI really offers the trainer's verbs."""
    from llmtrain.cli import build_parser

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["llmtrain.cli"] == {"trainer": "llmtrain_trainer.cli.commands:register"}
    verbs = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert {"local", "prepare", "export", "scale-test", "validate", "goodput"} <= set(verbs)
