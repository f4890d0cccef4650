"""Every command the docs show works as written after `make venv`.

- each ``.venv/bin/<tool>`` that README.md, CONTRIBUTING.md or docs/ names exists and answers
  ``--help`` (``.venv/bin/mkdocs serve`` failed for everyone: the console scripts lived only in the
  dependency layer), and ``source .venv/bin/activate`` puts those commands on PATH;
- each command in the README's and the quick-start page's code blocks and inline code is a make
  target of the Makefile, a ``llmtrain`` subcommand, a ``.venv/bin`` tool, or one of the EKS
  prerequisites the README names; the files they name exist.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = ROOT / ".venv" / "bin"
DOC_PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
FRONT_PAGES = [ROOT / "README.md", ROOT / "docs" / "getting-started" / "quickstart.md"]
# Not installed by make venv: the README's "Install on EKS" section names them as what the reader
# brings ("with Terraform, Helm and kubectl"); cp is coreutils.
PREREQUISITES = {"terraform": "Terraform", "helm": "Helm", "kubectl": "kubectl", "cp": None}


def _venv_tools() -> list[str]:
    names = set()
    for page in DOC_PAGES:
        names |= set(re.findall(r"\.venv/bin/([A-Za-z0-9_.-]*[A-Za-z0-9])", page.read_text()))
    return sorted(names)


def test_the_docs_name_venv_tools():
    assert {"python", "mkdocs", "llmtrain", "activate"} <= set(_venv_tools())


@pytest.mark.parametrize("tool", [t for t in _venv_tools() if t != "activate"])
def test_each_venv_tool_the_docs_name_runs(tool):
    path = VENV_BIN / tool
    assert path.is_file() and os.access(path, os.X_OK), f".venv/bin/{tool} is missing: make venv must put it there"
    flag = "--version" if tool.startswith("python") else "--help"
    r = subprocess.run([str(path), flag], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_activate_puts_the_venv_commands_on_path():
    tools = ["llmtrain", "mkdocs", "pytest", "ruff", "mypy", "python"]
    r = subprocess.run(
        ["bash", "-c", f"source .venv/bin/activate && command -v {' '.join(tools)}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env={k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    found = r.stdout.split()
    assert len(found) == len(tools) and all(Path(p).parent == VENV_BIN for p in found), found


def _make_targets() -> set[str]:
    # make's database (-p) without running anything (-q on a target that does not exist).
    r = subprocess.run(
        ["make", "-pRrq", "-f", "Makefile", "__no_such_target__"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    return set(re.findall(r"^([A-Za-z0-9][A-Za-z0-9_.-]*):", r.stdout, re.M))


def _commands(page: Path) -> list[str]:
    """Shell commands a page shows: lines of its bash/plain code blocks, and inline code that
    starts with a command word (make, .venv/bin/..., source, llmtrain)."""
    text = page.read_text()
    out = []
    for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", text, re.M | re.S):
        if lang in ("", "bash", "sh", "console"):
            out += [ln.split(" #", 1)[0].strip() for ln in body.splitlines() if ln.strip()]
    out += re.findall(r"`((?:make|source|llmtrain|\.venv/bin/\S+) [^`]*)`", text)
    return [c for c in out if c]


def _check(cmd: str, targets: set[str], subcommands: set[str], readme: str) -> list[str]:
    problems = []
    for part in re.split(r"&&|;", cmd.replace("$(", "").replace(")", "")):
        words = shlex.split(part.replace("[", "").replace("]", ""))
        if not words:
            continue
        head, args = words[0], words[1:]
        if head == "make":
            problems += [f"{cmd}: no make target {a!r}" for a in args if "=" not in a and a not in targets]
        elif head == "source":
            if not (ROOT / args[0]).is_file():
                problems.append(f"{cmd}: {args[0]} does not exist")
        elif head == "llmtrain" or head == ".venv/bin/llmtrain":
            if args[0] not in subcommands:
                problems.append(f"{cmd}: no llmtrain subcommand {args[0]!r}")
        elif head.startswith(".venv/bin/"):
            if not (ROOT / head).is_file():
                problems.append(f"{cmd}: {head} does not exist")
        elif head in PREREQUISITES:
            named = PREREQUISITES[head]
            if named and named not in readme.split("## Install on EKS", 1)[1].split("```", 1)[0]:
                problems.append(f"{cmd}: {head} is not named as a prerequisite")
        else:
            problems.append(f"{cmd}: {head!r} is neither a make target, a .venv/bin tool nor a prerequisite")
        inputs = args[:-1] if head == "cp" else args  # cp's last argument is what it makes
        problems += [
            f"{cmd}: {a} does not exist"
            for a in inputs
            if re.fullmatch(r"(charts|examples|terraform|scripts|docs)/[\w./-]+", a) and not (ROOT / a).exists()
        ]
    return problems


def test_every_command_of_the_readme_and_the_quick_start_exists():
    from llmtrain.cli import build_parser

    subparsers = [a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction"]
    subcommands = set(subparsers[0].choices)
    targets = _make_targets()
    assert {"demo", "test", "test-fast", "venv"} <= targets
    readme = (ROOT / "README.md").read_text()
    commands = [c for page in FRONT_PAGES for c in _commands(page)]
    assert any(c.startswith("make demo") for c in commands) and any(c.startswith("llmtrain plan") for c in commands)
    problems = [p for c in commands for p in _check(c, targets, subcommands, readme)]
    assert not problems, "\n".join(problems)
