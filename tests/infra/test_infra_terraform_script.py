"""scripts/infra-terraform.sh caches like scripts/install-tools.sh: one build at a time (flock), and
nothing cached is wiped before a build (the old script began with `rm -rf` of its whole cache dir
and built with private Go caches it deleted afterwards, so an interrupted or concurrent build
started from nothing and one run could delete the binary another was using).

`go` is the boundary faked here (a real build takes minutes): a stand-in that records how it was
called and "installs" a terraform that reports the pinned version. The script itself runs for real.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.infra

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "infra-terraform.sh"

FAKE_GO = """#!/usr/bin/env bash
# Stand-in for `go install ...terraform@v1.5.7`: record the call, take a while, install a binary.
# `go version` is scripts/go-toolchain.sh's lookup (the script finds Go through it): a new enough Go.
[ "$1" = version ] && { echo "go version go9.99.0 linux/amd64"; exit 0; }
echo "build GOMODCACHE=${GOMODCACHE:-} GOCACHE=${GOCACHE:-}" >> "$FAKE_GO_LOG"
sleep 1
# Its version in several writes, as a real terraform may write it (tests/tool_scripts/tool_standins.py).
cat > "$GOBIN/terraform" <<'TF'
#!/usr/bin/env bash
for l in '{' '  "terraform_version": "1.5.7",' '  "platform": "linux_amd64"' '}'; do echo "$l"; sleep 0.1; done
TF
chmod +x "$GOBIN/terraform"
"""


@pytest.fixture
def env(tmp_path) -> dict:
    bindir = tmp_path / "fake-bin"
    bindir.mkdir()
    go = bindir / "go"  # first on PATH, and GO for good measure: no real build can start
    go.write_text(FAKE_GO)
    go.chmod(0o755)
    return {
        **os.environ,
        "LLMTRAIN_CACHE": str(tmp_path / "cache"),
        "GO": str(go),
        "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
        "FAKE_GO_LOG": str(tmp_path / "go.log"),
    }


def builds(env: dict) -> list[str]:
    log = Path(env["FAKE_GO_LOG"])
    return log.read_text().splitlines() if log.exists() else []


def test_concurrent_runs_build_once_and_both_get_the_binary(env):
    procs = [
        subprocess.Popen(["bash", str(SCRIPT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    paths = {out.strip() for out, _ in outs}
    assert len(paths) == 1
    (path,) = paths
    assert subprocess.run([path, "version", "-json"], capture_output=True, text=True).returncode == 0
    assert len(builds(env)) == 1, builds(env)


def test_a_rebuild_keeps_what_is_cached(env):
    dest = Path(env["LLMTRAIN_CACHE"]) / "terraform-1.5.7"
    # What an interrupted earlier build left: downloaded modules, no finished binary.
    kept = dest / "gopath" / "mod" / "cache" / "download" / "github.com" / "hashicorp" / "terraform" / "@v"
    kept.mkdir(parents=True)
    (kept / "v1.5.7.zip").write_bytes(b"module source")
    r = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (kept / "v1.5.7.zip").read_bytes() == b"module source"
    # The Go caches the build used (Go's own, unless the script points them somewhere) still exist.
    (call,) = builds(env)
    for setting in call.split()[1:]:
        value = setting.split("=", 1)[1]
        assert not value or Path(value).exists(), f"{setting}: deleted after the build"
    # Warm: no build at all, same path.
    again = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and again.stdout == r.stdout and len(builds(env)) == 1
