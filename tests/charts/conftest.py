"""Chart fixtures: the pinned helm binary and a working copy of charts/ with dependencies built.

The copy keeps `helm dependency build` output (charts/llmtrain-operator/charts/*.tgz, Chart.lock)
out of the repo; helm's cache/config/data homes live in the temp dir too, so nothing touches $HOME.
"""

from __future__ import annotations

import shutil

import pytest

from chart_helpers import CHARTS, Helm


@pytest.fixture(scope="session")
def helm(tmp_path_factory) -> Helm:
    from llmtrain_devcluster.tools import find_tool

    work = tmp_path_factory.mktemp("charts")
    h = Helm(find_tool("helm"), work / "helm-home", work / "charts")
    shutil.copytree(CHARTS, h.charts, ignore=shutil.ignore_patterns("*.tgz", "Chart.lock"))
    h.run("dependency", "build", h.operator_chart)
    return h
