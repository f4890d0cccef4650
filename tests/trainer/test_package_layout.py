"""The trainer package's layout holds: every import in it, those inside functions too, names a module
and a name that exist (a lazy import of a moved module would otherwise fail only when its code path
runs, e.g. the S3 store or `llmtrain export`), and the training runtime — what a worker pod runs,
`python -m llmtrain_trainer.launch ... -m llmtrain_trainer` — reaches nothing in `cli/` (the
`llmtrain` verbs: `local`, `export`, `scale-test`, the torchx component)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "trainer" / "llmtrain_trainer"
RUNTIME = ("llmtrain_trainer.__main__", "llmtrain_trainer.launch")


def _module(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    base = PKG.parent / name.replace(".", "/")
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, absolute module, imported names) of every import of llmtrain_trainer in `path`."""
    mod = _module(path)
    package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "llmtrain_trainer":
                out.append((node.lineno, target, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names if a.name.split(".")[0] == "llmtrain_trainer"]
    return out


def test_every_import_in_the_trainer_resolves():
    missing = []
    for path in sorted(PKG.rglob("*.py")):
        for line, target, names in _imports(path):
            where = f"{path.relative_to(PKG.parent)}:{line}"
            if not _is_module(target):
                missing.append(f"{where}: no module {target}")
                continue
            module = None
            for name in names:
                if _is_module(f"{target}.{name}"):
                    continue
                module = module or importlib.import_module(target)
                if not hasattr(module, name):
                    missing.append(f"{where}: {target} has no {name}")
    assert not missing, "\n".join(missing)


def test_the_training_runtime_does_not_import_the_command_line():
    graph: dict[str, set[str]] = {}
    for path in PKG.rglob("*.py"):
        edges = graph.setdefault(_module(path), set())
        for _, target, names in _imports(path):
            edges.add(target)
            edges.update(f"{target}.{n}" for n in names if _is_module(f"{target}.{n}"))
    reached, todo = set(), list(RUNTIME)
    while todo:
        mod = todo.pop()
        if mod in reached:
            continue
        reached.add(mod)
        # importing a.b.c runs a/__init__ and a/b/__init__ too
        parents = [".".join(mod.split(".")[:i]) for i in range(1, mod.count(".") + 1)]
        todo += [m for m in [*graph.get(mod, ()), *parents] if m in graph]
    assert "llmtrain_trainer.train" in reached and "llmtrain_trainer.checkpoint.checkpointer" in reached
    cli = sorted(m for m in reached if m.split(".")[:2] == ["llmtrain_trainer", "cli"])
    assert not cli, f"the training runtime imports the command line: {cli}"
