"""Locate the pinned binaries that ``scripts/install-tools.sh`` (``make tools``) installs.

Layout (outside the repo, shared by every clone on the machine)::

    ${LLMTRAIN_CACHE:-~/.cache/llmtrain}/tools/<key>/bin/{kube-apiserver,kube-controller-manager,
                                                         kubectl,etcd,helm,promtool}
    ${LLMTRAIN_CACHE:-~/.cache/llmtrain}/tools/<key>/crds/kubeflow.org_pytorchjobs.yaml
    ${LLMTRAIN_CACHE:-~/.cache/llmtrain}/tools/current -> <key>

``<key>`` is the first 16 hex digits of sha256(tools/k8s/pins.env + go.mod + go.sum), computed
here exactly as the script computes it, so a checkout always finds the tools matching its pins.
``LLMTRAIN_TOOLS_DIR`` (a ``<key>`` directory) overrides the lookup.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = [
    "ToolNotFoundError",
    "find_tool",
    "tools_dir",
    "pytorchjob_crd_path",
    "TOOLS",
]

TOOLS = ("kube-apiserver", "kube-controller-manager", "kubectl", "etcd", "helm", "promtool")

_KEY_FILES = ("pins.env", "go.mod", "go.sum")
_HINT = "run `make tools` (scripts/install-tools.sh) first"


class ToolNotFoundError(FileNotFoundError):
    """A dev-cluster tool is not installed where ``make tools`` puts it."""


def cache_dir() -> Path:
    return Path(os.environ.get("LLMTRAIN_CACHE") or Path.home() / ".cache" / "llmtrain")


def _repo_tools_module() -> Path | None:
    # operator/llmtrain/devcluster/tools.py -> repo root is parents[3]
    mod = Path(__file__).resolve().parents[3] / "tools" / "k8s"
    return mod if all((mod / f).is_file() for f in _KEY_FILES) else None


def tools_key(module_dir: Path | None = None) -> str | None:
    """The cache key for the pins in ``module_dir`` (default: this checkout's tools/k8s)."""
    mod = module_dir or _repo_tools_module()
    if mod is None:
        return None
    h = hashlib.sha256()
    for f in _KEY_FILES:
        h.update((mod / f).read_bytes())
    return h.hexdigest()[:16]


def tools_dir() -> Path:
    """The directory holding ``bin/`` and ``crds/`` for this checkout's pins."""
    env = os.environ.get("LLMTRAIN_TOOLS_DIR")
    if env:
        d = Path(env)
        if not d.is_dir():
            raise ToolNotFoundError(f"LLMTRAIN_TOOLS_DIR={env} does not exist; {_HINT}")
        return d
    root = cache_dir() / "tools"
    key = tools_key()
    if key is not None:
        d = root / key
        if not d.is_dir():
            raise ToolNotFoundError(
                f"dev-cluster tools for this checkout's pins (key {key}) are not installed "
                f"in {root}; {_HINT}"
            )
        return d
    current = root / "current"
    if not current.is_dir():
        raise ToolNotFoundError(f"no dev-cluster tools installed in {root}; {_HINT}")
    return current.resolve()


def find_tool(name: str) -> Path:
    """Absolute path of an installed tool (e.g. ``find_tool("kubectl")``)."""
    d = tools_dir()
    p = d / "bin" / name
    if not (p.exists() and os.access(p, os.X_OK)):
        raise ToolNotFoundError(f"{name} not found at {p}; {_HINT}")
    return p


def pytorchjob_crd_path() -> Path:
    """Kubeflow's own PyTorchJob CRD YAML, copied from the training-operator Go module."""
    p = tools_dir() / "crds" / "kubeflow.org_pytorchjobs.yaml"
    if not p.is_file():
        raise ToolNotFoundError(f"PyTorchJob CRD not found at {p}; {_HINT}")
    return p
