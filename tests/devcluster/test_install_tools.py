"""scripts/install-tools.sh keeps its cache intact when the tools' env.sh is sourced
(issue 10, defect 2: `command -v etcd` found the cache's own symlink and bin/etcd became a
link to itself, so every later dev cluster failed with "etcd not found").

The script runs for real against a scratch cache whose Go-built tools are links to the
installed ones (so nothing is rebuilt); etcd and promtool are linked by the script itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from llmtrain_devcluster.tools import TOOLS, tools_dir, tools_key

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "install-tools.sh"
SYSTEM_LINKED = ("etcd", "promtool")  # the script links these to the system's binaries


def _scratch_cache(tmp_path: Path) -> Path:
    real = tools_dir()
    dest = tmp_path / "cache" / "tools" / tools_key()
    (dest / "bin").mkdir(parents=True)
    for name in TOOLS:
        if name not in SYSTEM_LINKED:
            (dest / "bin" / name).symlink_to(real / "bin" / name)
    for sub in ("crds", "kwok", "jobset", "kueue", "images"):  # what the script copies or builds
        shutil.copytree(real / sub, dest / sub)
    return dest


def _install(tmp_path: Path, *, source_env: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LLMTRAIN_TOOLS_DIR"}
    env["LLMTRAIN_CACHE"] = str(tmp_path / "cache")
    env["GO"] = "/nonexistent/go"  # nothing may need building here
    cmd = f"bash {SCRIPT}"
    if source_env:
        cmd = f"source {tmp_path}/cache/tools/current/env.sh && {cmd}"
    return subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, text=True, timeout=120)


def _system(name: str) -> Path:
    found = shutil.which(name, path=os.environ["PATH"] + os.pathsep + "/usr/bin")
    assert found, f"{name} is not installed on this machine"
    return Path(found).resolve()


def _assert_system_links(dest: Path, tmp_path: Path, when: str) -> None:
    for name in SYSTEM_LINKED:
        link = dest / "bin" / name
        target = Path(os.readlink(link))
        # Points at the system binary, never back into the tools cache (itself).
        assert not str(target).startswith(str(tmp_path)), f"{when}: bin/{name} -> {target}"
        assert link.resolve() == _system(name), f"{when}: bin/{name} -> {target}"
    out = subprocess.run([dest / "bin" / "etcd", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and "etcd Version" in out.stdout, f"{when}: {out.stderr}"


def test_make_tools_twice_with_env_sh_sourced_keeps_the_system_links(kube_tools, tmp_path):
    dest = _scratch_cache(tmp_path)
    first = _install(tmp_path, source_env=False)
    assert first.returncode == 0, first.stderr
    _assert_system_links(dest, tmp_path, "after the first run")
    for i in (1, 2):
        r = _install(tmp_path, source_env=True)
        assert r.returncode == 0, r.stderr
        _assert_system_links(dest, tmp_path, f"after sourced run {i}")


def test_a_cache_already_broken_by_the_old_script_is_repaired(kube_tools, tmp_path):
    dest = _scratch_cache(tmp_path)
    for name in SYSTEM_LINKED:  # what the defect left behind: links to themselves
        (dest / "bin" / name).symlink_to(dest / "bin" / name)
    r = _install(tmp_path, source_env=False)
    assert r.returncode == 0, r.stderr
    for name in SYSTEM_LINKED:
        assert (dest / "bin" / name).resolve() == _system(name)
