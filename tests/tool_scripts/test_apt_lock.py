"""scripts/lib/apt.sh on a fresh machine, where make's parallel jobs install packages at the same time:
`make setup` (the README's `make demo`) builds the tools and the trainer image in parallel, and each
apt-get installs its own. apt-get fails at once on a lock that another one holds ("Could not get
lock /var/lib/apt/lists/lock", exit 100), which ended a fresh machine's first `make test` warm-up.

The stand-in apt-get holds its lock as the real one does (a second one fails at once, exit 100), and
the first one's install holds it until the test lets it go, so the second caller's attempt happens
while the first holds the lock, every time."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import tool_standins as standin

ROOT = Path(__file__).resolve().parents[2]

_APT_GET = r"""#!/bin/bash
if ! mkdir "$STANDIN_APT/lock" 2>/dev/null; then
    echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by another apt-get" >&2
    exit 100
fi
echo "apt-get $*" >> "$STANDIN_APT/calls"
if [[ " $* " == *" install "* && ! -e "$STANDIN_APT/release" ]]; then
    touch "$STANDIN_APT/holding"
    while [[ ! -e "$STANDIN_APT/release" ]]; do sleep 0.02; done
fi
rmdir "$STANDIN_APT/lock"
"""

_ID = "#!/bin/sh\necho 0\n"


def _install(env: dict, pkg: str) -> subprocess.Popen:
    script = f'set -euo pipefail; die() {{ echo "$*" >&2; exit 1; }}; log() {{ :; }}; source "$1"; apt_install {pkg}'
    return subprocess.Popen(
        ["bash", "-c", script, "apt", str(ROOT / "scripts/lib/apt.sh")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _descendants(pid: int) -> list[str]:
    """The commands of `pid`'s descendant processes."""
    parents: dict[int, int] = {}
    comms: dict[int, str] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        comm_end = stat.rindex(")")
        comms[int(d)] = stat[stat.index("(") + 1 : comm_end]
        parents[int(d)] = int(stat[comm_end + 2 :].split()[1])
    out, frontier = [], {pid}
    while frontier:
        kids = {p for p, pp in parents.items() if pp in frontier}
        out += [comms[k] for k in kids]
        frontier = kids
    return out


def _until(pred, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_two_parallel_installs_wait_for_each_other_instead_of_failing_on_the_lock(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    standin.executable(bindir / "apt-get", _APT_GET)
    standin.executable(bindir / "id", _ID)
    apt = tmp_path / "apt"
    apt.mkdir()
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", STANDIN_APT=str(apt), TMPDIR=str(tmp_path))

    first = _install(env, "etcd-server")
    second = None
    try:
        _until(lambda: (apt / "holding").exists() or first.poll() is not None, "the first install to hold the lock")
        assert first.poll() is None, first.communicate()
        second = _install(env, "buildah")
        # the second waits for ours (flock) rather than running apt-get into the held lock and failing
        _until(
            lambda: second.poll() is not None or "flock" in _descendants(second.pid),
            "the second install to wait or end",
        )
        assert second.poll() is None, f"the second install ended while the first held the lock: {second.communicate()}"
    finally:
        (apt / "release").touch()  # the stand-in holding the lock ends, also when the test fails
    out1, out2 = first.communicate(timeout=30), second.communicate(timeout=30)
    assert (first.returncode, second.returncode) == (0, 0), (out1, out2)
    calls = (apt / "calls").read_text().splitlines()
    assert [c.split()[-1] for c in calls if " install " in c] == ["etcd-server", "buildah"], calls
