"""A real local Kubernetes control plane for tests, the demo and contributors.

Binaries come from ``make tools`` (scripts/install-tools.sh); see :mod:`.tools`.

    from llmtrain_devcluster import DevCluster
    with DevCluster("/tmp/dc") as c:
        c.kubectl("get", "namespaces")

``DevCluster(..., chain=True)`` adds kube-scheduler, kwok GPU nodes shaped from the instance
catalog and the Kubeflow training-operator (see :mod:`.chain`).

CLI: ``python -m llmtrain_devcluster up|down|status [--state-dir .dev-cluster] [--chain]``.
"""

from .chain import DEFAULT_NODES, FAIL_EXIT_CODE_ANNOTATION, FAIL_POD_LABEL, node_manifest
from .cluster import DevCluster, KubectlError, project_crd_manifest, start_etcd, stop_process
from .process import DevClusterError, free_port
from .tools import ToolNotFoundError, find_tool, kwok_stages_dir, pytorchjob_crd_path, tools_dir

__all__ = [
    "DEFAULT_NODES",
    "FAIL_EXIT_CODE_ANNOTATION",
    "FAIL_POD_LABEL",
    "DevCluster",
    "DevClusterError",
    "KubectlError",
    "ToolNotFoundError",
    "find_tool",
    "free_port",
    "kwok_stages_dir",
    "node_manifest",
    "project_crd_manifest",
    "pytorchjob_crd_path",
    "start_etcd",
    "stop_process",
    "tools_dir",
]
