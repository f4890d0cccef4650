"""A dev cluster writes nothing outside its state directory.

The chain cluster (all seven components, the training-operator's certificate workaround included)
runs in a child whose ``/tmp`` is a fresh, empty tmpfs in a private mount namespace; its state
directory is ``/tmp/state``. Whatever else appears in that ``/tmp``, while the cluster is up or
after it is down, was written outside the state directory by the dev cluster or a component.
(training-operator v1.9.x stats a hard-coded ``/tmp/k8s-webhook-server/serving-certs/tls.crt``;
the dev cluster used to write it there.)
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow]

_CHILD = r"""
import json, os, sys
from llmtrain_devcluster import DevCluster

# the checkout, the Python layer and the tools, bound back where they live under /tmp
KEEP = [k for k in os.environ.get("LLMTRAIN_TEST_KEEP", "").split(os.pathsep) if k]

def outside():
    found = []
    for root, dirs, files in os.walk("/tmp"):
        if root == "/tmp":
            dirs[:] = [d for d in dirs if d != "state"]
        dirs[:] = [d for d in dirs if os.path.join(root, d) not in KEEP]
        on_path = {os.path.join(root, d) for d in dirs if any(k.startswith(os.path.join(root, d) + "/") for k in KEEP)}
        found += [os.path.join(root, n) for n in dirs + files if os.path.join(root, n) not in on_path]
    return sorted(found)

os.makedirs("/tmp/state")
cluster = DevCluster("/tmp/state/dc", chain=True, nodes={"p5.48xlarge": 1})
with cluster:
    during = outside()
after = outside()
print(json.dumps({"during": during, "after": after}))
"""


def _under_tmp(paths: list[Path]) -> list[str]:
    """The real paths among `paths` that lie under /tmp, none inside another."""
    real = sorted({str(p.resolve()) for p in paths if p.resolve().is_relative_to("/tmp")})
    return [p for p in real if not any(p.startswith(q + "/") for q in real if q != p)]


def _private_tmp_prefix() -> list[str] | None:
    """``unshare`` with a private mount namespace (user namespace too when not root), or None."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    for flags in (["--mount"], ["--mount", "--map-root-user"]):
        cmd = [unshare, *flags, "--propagation", "private", "--"]
        if subprocess.run([*cmd, "sh", "-c", "mount -t tmpfs tmpfs /tmp"], capture_output=True).returncode == 0:
            return cmd
    return None


def test_a_chain_cluster_writes_nothing_outside_its_state_dir(own_clusters):
    prefix = _private_tmp_prefix()
    if prefix is None:
        pytest.skip("needs a private mount namespace (unshare --mount) to give the cluster an empty /tmp")
    env = {k: v for k, v in os.environ.items() if k != "TMPDIR"}  # tempfile's default: /tmp
    # What the child runs from would vanish under the new tmpfs where it lives under /tmp (CI's
    # clean clone may; a cold measurement's caches may too): the checkout, the interpreter's
    # dependency layer and the llmtrain cache (the tools) are each held open on an fd first and
    # bound back at the same path.
    cache = Path(os.environ.get("LLMTRAIN_CACHE") or Path.home() / ".cache/llmtrain")
    keep = _under_tmp([REPO, Path(sys.prefix), *map(Path, site.getsitepackages()), cache])
    env["LLMTRAIN_TEST_KEEP"] = os.pathsep.join(keep)
    fds = range(3, 3 + len(keep))
    script = " && ".join(
        [f"exec {fd}<{shlex.quote(p)}" for fd, p in zip(fds, keep, strict=True)]
        + ["mount -t tmpfs tmpfs /tmp"]
        + [
            f"mkdir -p {q} && mount --no-canonicalize --bind /proc/self/fd/{fd} {q} && exec {fd}<&-"
            for fd, q in zip(fds, map(shlex.quote, keep), strict=True)
        ]
        + ['exec "$0" "$@"']
    )
    r = subprocess.run(
        [*prefix, "sh", "-c", script, sys.executable, "-c", _CHILD],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert r.returncode == 0, f"child failed ({r.returncode}):\n{r.stderr[-4000:]}"
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen == {"during": [], "after": []}, seen
