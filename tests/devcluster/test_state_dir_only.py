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
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow]

_CHILD = r"""
import json, os, sys
from llmtrain_devcluster import DevCluster

KEEP = os.environ.get("LLMTRAIN_TEST_KEEP") or None  # the checkout, bound back when it lives under /tmp

def outside():
    found = []
    for root, dirs, files in os.walk("/tmp"):
        if root == "/tmp":
            dirs[:] = [d for d in dirs if d != "state"]
        dirs[:] = [d for d in dirs if os.path.join(root, d) != KEEP]
        on_path = {os.path.join(root, d) for d in dirs if KEEP and KEEP.startswith(os.path.join(root, d) + "/")}
        found += [os.path.join(root, n) for n in dirs + files if os.path.join(root, n) not in on_path]
    return sorted(found)

os.makedirs("/tmp/state")
cluster = DevCluster("/tmp/state/dc", chain=True, nodes={"p5.48xlarge": 1})
with cluster:
    during = outside()
after = outside()
print(json.dumps({"during": during, "after": after}))
"""


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
    # A checkout under /tmp (CI's clean clone may be one) would vanish under the new tmpfs with the
    # interpreter and the code: it is held open on fd 3 first and bound back at the same path.
    script = 'mount -t tmpfs tmpfs /tmp && exec "$0" "$@"'
    if REPO.is_relative_to("/tmp"):
        env["LLMTRAIN_TEST_KEEP"] = str(REPO)
        script = (
            'exec 3<"$LLMTRAIN_TEST_KEEP" && mount -t tmpfs tmpfs /tmp && mkdir -p "$LLMTRAIN_TEST_KEEP" '
            '&& mount --no-canonicalize --bind /proc/self/fd/3 "$LLMTRAIN_TEST_KEEP" && exec 3<&- && exec "$0" "$@"'
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
