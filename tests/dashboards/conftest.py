"""Fixtures for the dashboard / alert-rule checks: the real promtool binary."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from plugins.needs import needs

ROOT = Path(__file__).resolve().parents[2]


def find_promtool() -> Path:
    """promtool as installed by `make tools` (Debian's prometheus package, linked into the tools
    cache); falls back to PATH so the rule checks also run where only the Debian package is."""
    try:
        from llmtrain_devcluster.tools import ToolNotFoundError, find_tool

        try:
            return find_tool("promtool")
        except ToolNotFoundError:
            pass
    except ImportError:
        pass
    p = shutil.which("promtool")
    if not p:
        raise FileNotFoundError("promtool not found: run `make tools` (apt-get install prometheus)")
    return Path(p)


@pytest.fixture(scope="session")
@needs("tools")
def promtool() -> Path:
    return find_promtool()
