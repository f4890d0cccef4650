#!/usr/bin/env python3
"""Put the dependency layer's commands into .venv/bin (scripts/venv.sh runs this with .venv's
Python, after the project's editable install).

usage: venv_bin.py DEPS_BIN VENV_BIN

A Python console script of the layer runs the layer's interpreter, which does not see the project
(its editable install and devcluster/ live in .venv): it is copied with .venv's interpreter in its
place. Anything else (ruff's and hadolint's binaries) is linked. The interpreters, pip, the
activate scripts and the project's own commands (llmtrain, llmtrain-operator) stay .venv's own.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import distribution
from pathlib import Path

SKIP_PREFIXES = ("python", "pip", "activate", "Activate", "__pycache__")
SHEBANG_MAX = 127  # the kernel's limit on a #! line; pip falls back to /bin/sh the same way


def _shebang(python: str) -> str:
    if len(python) + 2 <= SHEBANG_MAX:
        return f"#!{python}\n"
    return f"#!/bin/sh\n'''exec' \"{python}\" \"$0\" \"$@\"\n' '''\n"


def link_commands(deps_bin: Path, venv_bin: Path) -> list[str]:
    deps_python = str(deps_bin / "python")
    venv_python = str(venv_bin.absolute() / "python")
    own = {ep.name for ep in distribution("llmtrain").entry_points if ep.group == "console_scripts"}
    done = []
    for src in sorted(deps_bin.iterdir()):
        if src.name.startswith(SKIP_PREFIXES) or src.name in own:
            continue
        if not src.is_file() or not os.access(src, os.X_OK):
            continue
        dst, tmp = venv_bin / src.name, venv_bin / f".{src.name}.tmp"
        tmp.unlink(missing_ok=True)
        head = src.read_bytes()[:4096]
        if head.startswith(b"#!") and deps_python.encode() in head:
            first, body = src.read_text().split("\n", 1)
            if first.startswith("#!/bin/sh"):  # pip's long-path form: the interpreter on line 2
                body = body.split("' '''\n", 1)[1]
            tmp.write_text(_shebang(venv_python) + body)
            tmp.chmod(0o755)
        else:
            tmp.symlink_to(src)
        tmp.replace(dst)
        done.append(src.name)
    return done


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    link_commands(Path(sys.argv[1]), Path(sys.argv[2]))
