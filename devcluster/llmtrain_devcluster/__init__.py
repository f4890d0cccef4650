"""A real local Kubernetes control plane for tests, the demo and contributors.

Binaries come from ``make tools`` (scripts/install-tools.sh); see :mod:`.tools`.

    from llmtrain_devcluster import DevCluster
    with DevCluster("/tmp/dc") as c:
        c.kubectl("get", "namespaces")

CLI: ``python -m llmtrain_devcluster up|down|status [--state-dir .dev-cluster]``.
"""

from .cluster import DevCluster, KubectlError, project_crd_manifest, start_etcd, stop_process
from .process import DevClusterError, free_port
from .tools import ToolNotFoundError, find_tool, pytorchjob_crd_path, tools_dir

__all__ = [
    "DevCluster",
    "DevClusterError",
    "KubectlError",
    "ToolNotFoundError",
    "find_tool",
    "free_port",
    "project_crd_manifest",
    "pytorchjob_crd_path",
    "start_etcd",
    "stop_process",
    "tools_dir",
]
