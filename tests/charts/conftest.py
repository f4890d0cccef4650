"""Chart fixtures: the pinned helm binary bound to the repository's charts/ as they are checked in.

No `helm dependency build`: the etcd subchart is vendored in charts/llmtrain-operator/charts/, so
the tests see exactly what a clean clone, `helm install` and Argo CD see. helm's cache/config/data
homes live in a temp dir, so nothing touches $HOME.
"""

from __future__ import annotations

import pytest
from chart_helpers import CHARTS, Helm

from plugins.needs import needs


@pytest.fixture(scope="session")
@needs("tools")
def helm(tmp_path_factory) -> Helm:
    from llmtrain_devcluster.tools import find_tool

    return Helm(find_tool("helm"), tmp_path_factory.mktemp("helm-home"), CHARTS)
