"""Every repository path the docs name in backticks exists: README.md, CONTRIBUTING.md, docs/ and the
docstrings of every Python file in the repository.

A path is a backticked word of path characters that either starts at a top-level folder of the
repository (`operator/…`, `tests/…`) or holds a `/` and ends in a file extension (`policy/decide.py`,
relative to a package). It exists when some tracked file or folder is that path or ends with it, so
`policy/decide.py` is found under operator/llmtrain/controller/. Placeholders (`<device>`, `*`, `$X`)
and absolute or home paths (`/dev/shm`, `~/.cache/…`: the machine's, not the repository's) are not
paths of the repository. Renames left controller/final.py and controller/handlers.py in the docs
long after those files were gone.
"""

from __future__ import annotations

import ast
import re
import subprocess
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOP = {"operator", "trainer", "devcluster", "bench", "scripts", "tests", "docs", "charts", "dashboards", "terraform"}
TOP |= {"examples", "tools", "mk", "requirements", ".ci"}
EXTENSIONS = (".py", ".md", ".yaml", ".yml", ".sh", ".json", ".tf", ".tfvars", ".txt", ".j2", ".toml", ".tpl", ".mk")
# Paths inside other projects' Go modules, named as such where the docs say what the dev cluster
# takes from them (the kustomize layout of JobSet and Kueue).
UPSTREAM = ("config/components/",)


@cache
def _tracked() -> tuple[frozenset[str], frozenset[str]]:
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    dirs = {str(parent) for f in files for parent in Path(f).parents if str(parent) != "."}
    return frozenset(files), frozenset(dirs)


def is_repo_path(word: str) -> bool:
    if not re.fullmatch(r"[\w.\-/]+", word) or word.startswith(("/", ".venv")) or "//" in word:
        return False
    if word.startswith(UPSTREAM):
        return False
    return "/" in word and (word.split("/", 1)[0] in TOP or word.endswith(EXTENSIONS))


def exists(word: str, files=None, dirs=None) -> bool:
    if files is None or dirs is None:
        files, dirs = _tracked()
    word = word.rstrip("/")
    return any(p == word or p.endswith("/" + word) for p in (*files, *dirs))


def named_paths(text: str) -> list[str]:
    """The repository paths named in backticks in `text` (a trailing `:line` or `:a-b` dropped)."""
    words = (re.sub(r":\d+(-\d+)?$", "", m.group(1)) for m in re.finditer(r"`+([^`\n]+?)`+", text))
    return [w for w in words if is_repo_path(w)]


def _texts():
    files, _ = _tracked()
    for f in sorted(files):
        path = ROOT / f
        if f.endswith(".md") and (f in ("README.md", "CONTRIBUTING.md") or f.startswith("docs/")):
            yield f, path.read_text()
        elif f.endswith(".py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    doc = ast.get_docstring(node)
                    if doc:
                        yield f"{f}:{getattr(node, 'lineno', 1)}", doc


def test_every_path_the_docs_name_exists():
    missing = [f"{where}: `{p}`" for where, text in _texts() for p in named_paths(text) if not exists(p)]
    assert missing == [], "\n".join(missing)


def test_the_check_finds_a_gone_file_and_passes_the_rest():
    files, dirs = frozenset({"operator/llmtrain/controller/watch.py", "docs/index.md"}), frozenset()
    text = (
        "see `controller/handlers.py` and `controller/watch.py:26`, `operator/llmtrain/gone/` "
        "and ``docs/index.md``; not `/dev/shm`, `bench/results/gpu_<device>.json`, `make test`, "
        "`config/components/manager/controller_manager_config.yaml`"
    )
    named = named_paths(text)
    assert named == ["controller/handlers.py", "controller/watch.py", "operator/llmtrain/gone/", "docs/index.md"]
    assert [p for p in named if not exists(p, files, dirs)] == ["controller/handlers.py", "operator/llmtrain/gone/"]
