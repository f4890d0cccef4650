"""Locate the pinned binaries that ``scripts/install-tools.sh`` (``make tools``) installs.

Layout (outside the repo, shared by every clone on the machine)::

    ${LLMTRAIN_CACHE:-~/.cache/llmtrain}/tools/<key>/bin/{kube-apiserver,kube-controller-manager,
                      kube-scheduler,kubectl,kubelet,kwok,training-operator,jobset-controller,kueue,etcd,helm,
                      promtool,coredns,containerd,containerd-shim-runc-v2,ctr,runc,busybox}
    ${LLMTRAIN_CACHE:-~/.cache/llmtrain}/tools/<key>/cni/{bridge,host-local,loopback}
    ${LLMTRAIN_CACHE:-~/.cache/llmtrain}/tools/<key>/images/{pause,busybox}.tar
    ${LLMTRAIN_CACHE:-~/.cache/llmtrain}/tools/<key>/crds/{kubeflow.org_pytorchjobs,jobset.x-k8s.io_jobsets}.yaml
    ${LLMTRAIN_CACHE:-~/.cache/llmtrain}/tools/<key>/jobset/webhook/{manifests.yaml,patches/*.yaml}
    ${LLMTRAIN_CACHE:-~/.cache/llmtrain}/tools/<key>/kueue/{crds,webhook,manager}/...
    ${LLMTRAIN_CACHE:-~/.cache/llmtrain}/tools/<key>/kwok/stages/{node,pod}/...
    ${LLMTRAIN_CACHE:-~/.cache/llmtrain}/tools/current -> <key>

``<key>`` is the first 16 hex digits of sha256 over the tools modules' pin files (``_KEY_FILES``,
relative to ``tools/``: ``tools/k8s`` pins every Kubernetes tool, ``tools/coredns`` the real node's
DNS), computed here exactly as the script computes it, so a checkout always finds the tools
matching its pins.
``LLMTRAIN_TOOLS_DIR`` (a ``<key>`` directory) overrides the lookup.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = [
    "NODE_TOOLS",
    "TOOLS",
    "ToolNotFoundError",
    "UnmarkedTestError",
    "find_tool",
    "jobset_crd_path",
    "jobset_webhook_dir",
    "kwok_stages_dir",
    "node_cni_dir",
    "node_image",
    "pytorchjob_crd_path",
    "refuse_in_unmarked_test",
    "tools_dir",
]

TOOLS = (
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kubelet",
    "kwok",
    "training-operator",
    "jobset-controller",
    "kueue",
    "etcd",
    "helm",
    "promtool",
    "coredns",
)
# The real node's runtime: Debian's binaries, which install-tools.sh links into bin/ (dpkg says
# where), and what it builds beside them.
NODE_TOOLS = ("containerd", "containerd-shim-runc-v2", "ctr", "runc", "busybox")

# Same files, same order as KEY_FILES in scripts/install-tools.sh.
_KEY_FILES = ("k8s/pins.env", "k8s/go.mod", "k8s/go.sum", "coredns/pins.env", "coredns/go.mod", "coredns/go.sum")
_HINT = "run `make tools` (scripts/install-tools.sh) first"


class ToolNotFoundError(FileNotFoundError):
    """A dev-cluster tool is not installed where ``make tools`` puts it."""


class UnmarkedTestError(RuntimeError):
    """A test uses a tool or a cluster without the marker that keeps it out of ``make test-fast``."""


# Set by the tests' plugin (tests/plugins/needs.py) to the id of a running test that is not marked
# ``tools`` / ``cluster``: such a test gets neither, wherever it asks (in-process or a subprocess).
TEST_GUARD_ENV = {"tools": "LLMTRAIN_TEST_WITHOUT_TOOLS", "cluster": "LLMTRAIN_TEST_WITHOUT_CLUSTER"}


def refuse_in_unmarked_test(kind: str, what: str) -> None:
    test = os.environ.get(TEST_GUARD_ENV[kind])
    if test:
        raise UnmarkedTestError(
            f"{test} uses {what} but is not marked `{kind}`: take it from a fixture marked "
            f'@needs("{kind}") (tests/plugins/needs.py), so that `make test-fast` leaves the test out'
        )


def cache_dir() -> Path:
    return Path(os.environ.get("LLMTRAIN_CACHE") or Path.home() / ".cache" / "llmtrain")


def _repo_tools_root() -> Path | None:
    # devcluster/llmtrain_devcluster/tools.py -> repo root is parents[2]
    root = Path(__file__).resolve().parents[2] / "tools"
    return root if all((root / f).is_file() for f in _KEY_FILES) else None


def tools_key(tools_root: Path | None = None) -> str | None:
    """The cache key for the pins under ``tools_root`` (default: this checkout's ``tools/``)."""
    root = tools_root or _repo_tools_root()
    if root is None:
        return None
    h = hashlib.sha256()
    for f in _KEY_FILES:
        h.update((root / f).read_bytes())
    return h.hexdigest()[:16]


def tools_dir() -> Path:
    """The directory holding ``bin/`` and ``crds/`` for this checkout's pins."""
    refuse_in_unmarked_test("tools", "the Kubernetes tools (make tools)")
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
                f"dev-cluster tools for this checkout's pins (key {key}) are not installed in {root}; {_HINT}"
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


def kwok_stages_dir() -> Path:
    """kwok's own stage YAMLs (``kustomize/stage/{node,pod}`` of the pinned kwok module)."""
    p = tools_dir() / "kwok" / "stages"
    if not (p / ".complete").is_file():
        raise ToolNotFoundError(f"kwok stages not found at {p}; {_HINT}")
    return p


def pytorchjob_crd_path() -> Path:
    """Kubeflow's own PyTorchJob CRD YAML, copied from the training-operator Go module."""
    p = tools_dir() / "crds" / "kubeflow.org_pytorchjobs.yaml"
    if not p.is_file():
        raise ToolNotFoundError(f"PyTorchJob CRD not found at {p}; {_HINT}")
    return p


def jobset_crd_path() -> Path:
    """JobSet's own CRD YAML (``config/components/crd/bases``), copied from the pinned JobSet module."""
    p = tools_dir() / "crds" / "jobset.x-k8s.io_jobsets.yaml"
    if not p.is_file():
        raise ToolNotFoundError(f"JobSet CRD not found at {p}; {_HINT}")
    return p


def jobset_webhook_dir() -> Path:
    """JobSet's own ``config/components/webhook`` (``manifests.yaml`` and the release's ``patches/``)."""
    p = tools_dir() / "jobset" / "webhook"
    if not (p / ".complete").is_file():
        raise ToolNotFoundError(f"JobSet webhook manifests not found at {p}; {_HINT}")
    return p


def node_cni_dir() -> Path:
    """The CNI plugins the real node uses (links to Debian's ``containernetworking-plugins``)."""
    p = tools_dir() / "cni"
    if not all((p / n).exists() for n in ("bridge", "host-local", "loopback")):
        raise ToolNotFoundError(f"CNI plugins (bridge, host-local, loopback) not found in {p}; {_HINT}")
    return p


def node_image(name: str) -> Path:
    """One of the real node's OCI image archives built by ``make tools`` (``pause``, ``busybox``)."""
    p = tools_dir() / "images" / f"{name}.tar"
    if not p.is_file():
        raise ToolNotFoundError(f"the node's {name} image archive not found at {p}; {_HINT}")
    return p
