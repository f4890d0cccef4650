"""scripts/trainer-image.sh (make trainer-image) against stand-ins: its key, its cold path, its warm
path that builds nothing, its pruning and its failure messages.

The real build (an Ubuntu base made by mmdebstrap, `buildah bud` of the Dockerfile's trainer target,
~7 min cold and 6.3 GB) is not part of `make test`; bench/results/trainer_image_build.json records
one. Here buildah, mmdebstrap, curl, dpkg-deb, gpg, apt-get and `id` are stand-ins that log their
calls and answer in several writes with pauses (tool_standins.SLOW_EMIT), in a small git repository
that holds the project's Dockerfile and .dockerignore and a few files in their places.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import tool_standins as standin

REPO = Path(__file__).resolve().parents[2]
FPR = "F6ECB3762474EDA9D21B7022871920D1991BC93C"

# buildah: `--root R --runroot R --storage-driver D` then a command; images are files in $STANDIN_STORE.
_BUILDAH = (
    "#!/usr/bin/env bash\n"
    + standin.SLOW_EMIT
    + r"""
echo "buildah $*" >> "$STANDIN_LOG"
while [ "${1#--}" != "$1" ] && [ "$1" != --version ]; do shift 2; done
img() { echo "$STANDIN_STORE/$(echo "$1" | tr '/:' '__')"; }
mkdir -p "$STANDIN_STORE"
case "$1" in
--version) emit "buildah version ${STANDIN_BUILDAH_VERSION:-1.28.2} (image-spec 1.1.0-rc2, runtime-spec 1.0.2-dev)" ;;
inspect)
    ref="${@: -1}"
    [ -f "$(img "$ref")" ] || { echo "no image $ref" >&2; exit 125; }
    [ "$4" = --format ] && emit "$(cat "$(img "$ref")")" || emit "{" "  \"Type\": \"buildah 0.0.1\"" "}" ;;
from) echo working-container ;;
add | config | umount) ;;
commit | bud)
    ref="${@: -1}"
    while [ $# -gt 0 ]; do [ "$1" = -t ] && ref="$2"; shift; done
    echo "id-$RANDOM$RANDOM" > "$(img "$ref")"
    echo "built $ref" >&2 ;;
push)
    while [ "$1" != --digestfile ]; do shift; done
    echo "sha256:$(printf %064d 7)" > "$2"
    dest="$4"; path="${dest#oci-archive:}"; path="${path%:*}"; path="${path%:*}"
    echo "an oci archive of $3" > "$path" ;;
rmi) [ "$2" = --prune ] || rm -f "$(img "$2")" ;;
*) echo "stand-in buildah: no '$1'" >&2; exit 2 ;;
esac
"""
)

_MMDEBSTRAP = (
    "#!/usr/bin/env bash\n"
    + standin.SLOW_EMIT
    + r"""
echo "mmdebstrap $*" >> "$STANDIN_LOG"
[ "$1" = --version ] && { emit "mmdebstrap ${STANDIN_MMDEBSTRAP_VERSION:-1.3.5}"; exit 0; }
for a in "$@"; do case "$a" in *.tar) echo rootfs > "$a" ;; esac; done
"""
)

_CURL = r"""#!/usr/bin/env bash
echo "curl $*" >> "$STANDIN_LOG"
while [ $# -gt 0 ]; do [ "$1" = -o ] && cp "$STANDIN_DEB" "$2"; shift; done
"""

_DPKG_DEB = r"""#!/usr/bin/env bash
echo "dpkg-deb $*" >> "$STANDIN_LOG"
mkdir -p "$3/usr/share/keyrings" && echo keys > "$3/usr/share/keyrings/ubuntu-archive-keyring.gpg"
"""

_GPG = (
    "#!/usr/bin/env bash\n"
    + standin.SLOW_EMIT
    + r"""
emit "pub:-:4096:1:3B4FE6ACC0B21F32:1336770936:::-:::scSC::::::23::0:" \
    "fpr:::::::::790BC7277767219C42C86F933B4FE6ACC0B21F32:" \
    "pub:-:4096:1:871920D1991BC93C:1537196506:::-:::scSC::::::23::0:" \
    "fpr:::::::::${STANDIN_FPR}:" "uid:-::::1537196506::x::Ubuntu::::::::::0:"
"""
)

_APT_GET = r"""#!/usr/bin/env bash
echo "apt-get $*" >> "$STANDIN_LOG"
"""


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def tree(tmp_path) -> Path:
    """A git repository with the project's build inputs in their places (small stand-ins for the
    source trees), the script and its apt helper."""
    root = tmp_path / "repo"
    for rel in ("Dockerfile", ".dockerignore", "scripts/trainer-image.sh", "scripts/lib/apt.sh"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, root / rel)
    files = {
        "pyproject.toml": "[project]\nname = 'llmtrain'\n",
        "constraints.txt": "torch==2.15.0\n",
        "requirements/bootstrap.txt": "pip==26.3 --hash=sha256:00\n",
        "requirements/trainer-image.txt": "torch==2.15.0 --hash=sha256:11\n",
        "operator/llmtrain/__init__.py": "",
        "operator/llmtrain/devcluster/__init__.py": "",
        "trainer/llmtrain_trainer/__init__.py": "",
        "trainer/llmtrain_trainer/launch.py": "print('launch')\n",
        "README.md": "# readme\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "inputs")
    return root


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    bindir = tmp_path / "standin-bin"
    standin.executable(bindir / "buildah", _BUILDAH)
    standin.executable(bindir / "mmdebstrap", _MMDEBSTRAP)
    standin.executable(bindir / "curl", _CURL)
    standin.executable(bindir / "dpkg-deb", _DPKG_DEB)
    standin.executable(bindir / "gpg", _GPG)
    standin.executable(bindir / "apt-get", _APT_GET)
    standin.slow_tool(bindir / "id", "0")  # root: buildah runs as root
    standin.slow_tool(bindir / "runc", "runc version 1.1.5", "commit: v1.1.5", "spec: 1.0.2-dev")
    deb = tmp_path / "ubuntu-keyring.deb"
    deb.write_bytes(b"the pinned keyring package")
    ca = tmp_path / "ca.crt"
    ca.write_text("a CA bundle\n")
    return {
        **standin.env(tmp_path, bindir),
        "STANDIN_STORE": str(tmp_path / "store"),
        "STANDIN_DEB": str(deb),
        "STANDIN_FPR": FPR,
        "LLMTRAIN_BUILD_CA": str(ca),
        "TMPDIR": str(tmp_path),
        "GIT_CONFIG_GLOBAL": os.devnull,
    }


def _pin_keyring(root: Path, deb: Path) -> None:
    """The copy's pinned sha256 is the stand-in package's."""
    script = root / "scripts/trainer-image.sh"
    text = script.read_text()
    sha = hashlib.sha256(deb.read_bytes()).hexdigest()
    pinned = [ln for ln in text.splitlines() if ln.startswith("KEYRING_DEB_SHA256=")]
    assert len(pinned) == 1
    script.write_text(text.replace(pinned[0], f"KEYRING_DEB_SHA256={sha}"))


def _run(root: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(root / "scripts/trainer-image.sh"), *args], env=env, capture_output=True, text=True, timeout=120
    )


def _calls(tmp: Path, prefix: str) -> list[str]:
    return [c for c in standin.calls(tmp) if c.startswith(prefix)]


def _key(root: Path, env: dict) -> str:
    r = _run(root, env, "key")
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


# ------------------------------------------------------------------------------------------------


@pytest.mark.slow(seconds=6)  # the stand-ins' pauses, over ten or more runs of the script
def test_the_key_follows_the_tracked_build_context_and_nothing_else(tree, env):
    key = _key(tree, env)
    assert len(key) == 16 and int(key, 16) >= 0
    assert _key(tree, env) == key  # stable
    (tree / "trainer/llmtrain_trainer/untracked.py").write_text("x = 1\n")  # not tracked: not built
    (tree / "README.md").write_text("# edited, outside the context\n")
    (tree / "operator/llmtrain/devcluster/__init__.py").write_text("# excluded by .dockerignore\n")
    assert _key(tree, env) == key
    for rel, edit in [
        ("trainer/llmtrain_trainer/launch.py", "print('changed')\n"),  # uncommitted edits count
        ("operator/llmtrain/__init__.py", "# changed\n"),
        ("requirements/trainer-image.txt", "torch==2.15.1 --hash=sha256:22\n"),
        ("pyproject.toml", "[project]\nname = 'llmtrain2'\n"),
        (".dockerignore", (tree / ".dockerignore").read_text() + "# changed\n"),
        ("Dockerfile", (tree / "Dockerfile").read_text() + "# changed\n"),
    ]:
        before = (tree / rel).read_text()
        (tree / rel).write_text(edit)
        assert _key(tree, env) != key, rel
        (tree / rel).write_text(before)
        assert _key(tree, env) == key, rel
    assert _key(tree, {**env, "STANDIN_BUILDAH_VERSION": "1.29.0"}) != key  # the builder is an input
    assert not _calls(Path(env["HOME"]).parent, "buildah --root")  # `key` builds nothing


@pytest.mark.slow(seconds=6)  # the stand-ins' pauses, over ten or more runs of the script
def test_cold_build_then_warm_builds_nothing_then_a_source_change_builds_only_the_image(tree, env, tmp_path):
    _pin_keyring(tree, Path(env["STANDIN_DEB"]))
    cold = _run(tree, env)
    assert cold.returncode == 0, cold.stderr
    out = tmp_path / "cache" / "trainer-image"
    key = _key(tree, env)
    manifest_path = Path(cold.stdout.strip())
    assert manifest_path == out / f"{key}.json"
    manifest = json.loads(manifest_path.read_text())
    assert manifest["ref"] == f"llmtrain.local/trainer:{key}" and manifest["key"].startswith(key)
    assert manifest["archive"] == f"{key}.tar" and (out / manifest["archive"]).is_file()
    assert manifest["archive_bytes"] == (out / manifest["archive"]).stat().st_size
    assert manifest["manifest_digest"] == "sha256:" + "0" * 63 + "7"
    assert manifest["build_args"][1] == "EFA_INSTALLER_VERSION=none"
    assert manifest["build_args"][0] == f"CUDA_BASE_IMAGE={manifest['base_ref']}"
    assert set(manifest["timings_s"]) == {"base", "build", "export"}
    assert (out / "current.json").resolve() == manifest_path
    # the base: the pinned keyring, its key's fingerprint, then mmdebstrap from the Ubuntu archive
    (mm,) = [c for c in _calls(tmp_path, "mmdebstrap") if "--version" not in c]
    assert "--variant=minbase" in mm and "noble main universe" in mm and "noble-security main universe" in mm
    assert "--include=apt,ubuntu-keyring,python3,python3-venv,ca-certificates,libcap2-bin" in mm
    (bud,) = [c for c in _calls(tmp_path, "buildah") if " bud " in c]
    for flag in ("--format docker", "--network host", "--pull=never", "--layers", "--target trainer"):
        assert flag in bud, flag
    assert f"--secret id=build-ca,src={env['LLMTRAIN_BUILD_CA']}" in bud
    assert f"--build-arg=CUDA_BASE_IMAGE={manifest['base_ref']} --build-arg=EFA_INSTALLER_VERSION=none" in bud
    assert f"--root {tmp_path}/cache/buildah/storage" in bud and "--storage-driver overlay" in bud
    assert len([c for c in _calls(tmp_path, "buildah") if " push " in c]) == 1
    assert not list(tmp_path.glob("llmtrain-base.*"))  # the base's scratch dir is gone
    assert not (out / "context").exists()

    n = len(standin.calls(tmp_path))
    warm = _run(tree, env)
    assert warm.returncode == 0 and warm.stdout == cold.stdout, warm.stderr
    warm_calls = standin.calls(tmp_path)[n:]
    assert not [c for c in warm_calls if " bud " in c or " push " in c or c.startswith(("mmdebstrap", "curl"))]
    assert "nothing to do" in warm.stderr

    # a source change: a new image on the same base (not made again), exported; the old one kept
    (tree / "trainer/llmtrain_trainer/launch.py").write_text("print('changed')\n")
    src = _run(tree, env)
    assert src.returncode == 0, src.stderr
    assert src.stdout != cold.stdout
    assert len([c for c in _calls(tmp_path, "buildah") if " bud " in c]) == 2
    assert len(_calls(tmp_path, "curl")) == 1
    assert (out / f"{key}.tar").is_file()
    # a third key: the oldest image and its archive are pruned (the last two stay)
    (tree / "trainer/llmtrain_trainer/launch.py").write_text("print('changed again')\n")
    third = _run(tree, env)
    assert third.returncode == 0, third.stderr
    assert sorted(p.name for p in out.glob("*.tar")) == sorted(
        [Path(src.stdout.strip()).with_suffix(".tar").name, Path(third.stdout.strip()).with_suffix(".tar").name]
    )
    assert f"buildah --root {tmp_path}/cache/buildah/storage" in "\n".join(_calls(tmp_path, "buildah"))
    assert [c for c in _calls(tmp_path, "buildah") if c.endswith(f"rmi llmtrain.local/trainer:{key}")]


@pytest.mark.slow(seconds=6)  # the stand-ins' pauses, over ten or more runs of the script
def test_a_lock_change_prunes_the_old_locks_cached_layers_first(tree, env, tmp_path):
    _pin_keyring(tree, Path(env["STANDIN_DEB"]))
    assert _run(tree, env).returncode == 0
    (tree / "trainer/llmtrain_trainer/launch.py").write_text("print('changed')\n")
    assert _run(tree, env).returncode == 0
    assert not [c for c in _calls(tmp_path, "buildah") if "rmi --prune" in c]  # a source change keeps them
    (tree / "requirements/trainer-image.txt").write_text("torch==2.15.1 --hash=sha256:22\n")
    r = _run(tree, env)
    assert r.returncode == 0, r.stderr
    calls = _calls(tmp_path, "buildah")
    prune = [i for i, c in enumerate(calls) if "rmi --prune" in c]
    bud = [i for i, c in enumerate(calls) if " bud " in c]
    assert len(prune) == 1 and prune[0] < bud[-1]


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("no-buildah", "buildah not found after apt-get install buildah"),
        ("no-runc", "runc not found after apt-get install runc"),
        ("old-buildah", "buildah 1.23.1 is too old: this build needs buildah >= 1.28.0"),
        ("old-mmdebstrap", "mmdebstrap 0.8.4 is too old: this build needs mmdebstrap >= 1.0.0"),
        ("keyring-sha", "is not the pinned"),
        ("keyring-fpr", f"does not hold the pinned key {FPR}"),
    ],
)
def test_failures_say_what_is_wrong(tree, env, tmp_path, setup, message):
    bindir = Path(env["PATH"].split(os.pathsep)[0])
    if setup != "keyring-sha":
        _pin_keyring(tree, Path(env["STANDIN_DEB"]))
    if setup in ("no-buildah", "no-runc"):
        tool = setup.removeprefix("no-")
        (bindir / tool).unlink()
        # /usr/bin may hold a real one: the script must find none
        env = {**env, "PATH": f"{bindir}{os.pathsep}{_path_without(tmp_path, tool)}"}
    env = {
        **env,
        **{
            "old-buildah": {"STANDIN_BUILDAH_VERSION": "1.23.1"},
            "old-mmdebstrap": {"STANDIN_MMDEBSTRAP_VERSION": "0.8.4"},
            "keyring-fpr": {"STANDIN_FPR": "0" * 40},
        }.get(setup, {}),
    }
    r = _run(tree, env)
    assert r.returncode == 1, r.stderr
    assert message in r.stderr, r.stderr
    assert not [c for c in standin.calls(tmp_path) if " bud " in c]
    if setup in ("no-buildah", "no-runc"):
        tool = setup.removeprefix("no-")
        installs = [c for c in _calls(tmp_path, "apt-get") if " install " in c]
        assert installs and tool in installs[0], installs
    assert not list((tmp_path / "cache" / "trainer-image").glob("*.json"))
    assert not list(tmp_path.glob("llmtrain-base.*"))  # the base's scratch dir goes, failed or not


def _path_without(tmp: Path, tool: str) -> str:
    """/usr/bin and /bin's tools, except `tool`, as links in a directory of their own."""
    d = tmp / "system-bin"
    d.mkdir(exist_ok=True)
    for src in (Path("/usr/bin"), Path("/bin")):
        for f in src.iterdir():
            if f.name != tool and not (d / f.name).exists():
                (d / f.name).symlink_to(f)
    return str(d)
