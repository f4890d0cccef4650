"""Stand-ins for what the tool scripts call (go, python's pip, the built binaries), so each script's
cold path (nothing cached: download, build, verify, install) runs for real in seconds.

Every stand-in prints its answer the way a real tool may: in several writes, with a pause between
them (``SLOW_EMIT``). A script that pipes such output into a reader that stops early (``grep -q``,
``head``) under ``set -o pipefail`` then fails every time, not one time in twenty: the reader exits,
the writer's next write gets SIGPIPE, and pipefail fails the pipeline.

The stand-in ``go`` understands the calls the scripts make and nothing else:
``go version``, ``go version -m BIN``, ``go build -o DIR/ PKG...``, ``go install PKG@V``,
``go mod download -json MOD[@V]`` (its ``Dir`` is ``$STANDIN_MODS/<module path>``) and
``go list -m -f '{{.Version}}' MOD``. Each call is appended to ``$STANDIN_LOG``. What a binary it
builds prints is ``$STANDIN_SAYS/<name>`` (one line a write), or a few lines naming it.
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import tarfile
import zipfile
from pathlib import Path

# One line per write, a pause after each: whoever reads only the first match has exited by the next.
SLOW_EMIT = r"""
emit() { local l; for l in "$@"; do printf '%s\n' "$l"; sleep 0.15; done; }
"""

_GO = (
    "#!/usr/bin/env bash\n"
    + SLOW_EMIT
    + r"""
echo "$*" >> "$STANDIN_LOG"
binary() {  # a built tool: answers any question slowly, in several lines ($STANDIN_SAYS/<name> if set)
    local name lines
    name="$(basename "$1")"
    lines=("$name standin-version" "built by the stand-in go" "third line" "fourth line")
    [ -f "$STANDIN_SAYS/$name" ] && mapfile -t lines < "$STANDIN_SAYS/$name"
    { echo '#!/usr/bin/env bash'; declare -f emit; printf 'emit'; printf ' %q' "${lines[@]}"; echo; } > "$1"
    chmod +x "$1"
}
case "$1" in
version)
    if [ "$2" = -m ]; then
        # go version -m: the path, the main module, then its dependencies (the real one has ~40).
        emit "$3: go9.99.0" "	path	$(cat "$3.pkg" 2>/dev/null)" "	mod	$(cat "$3.mod" 2>/dev/null)	h1:x=" \
            "	dep	a.example/one	v1.0.0	h1:y=" "	dep	a.example/two	v1.0.0	h1:z=" "	build	CGO_ENABLED=0"
    else
        echo "go version go9.99.0 linux/amd64"
    fi ;;
build)
    shift; out=""
    while [ $# -gt 0 ]; do
        case "$1" in
        -o) out="$2"; shift 2 ;;
        -*) shift ;;
        *) break ;;
        esac
    done
    for pkg in "$@"; do
        binary "${out%/}/$(basename "$pkg")"
    done ;;
install)
    pkg="${@: -1}"; path="${pkg%@*}"; ver="${pkg##*@}"
    dest="${GOBIN:?go install needs GOBIN here}/$(basename "$path")"
    binary "$dest"
    echo "$path" > "$dest.pkg"
    # The module a package belongs to: the stand-in knows the ones the scripts install.
    case "$path" in
    github.com/yannh/kubeconform/*) echo "github.com/yannh/kubeconform	$ver" > "$dest.mod" ;;
    *) echo "${path}	$ver" > "$dest.mod" ;;
    esac ;;
mod)
    [ "$2" = download ] || { echo "stand-in go: no 'mod $2'" >&2; exit 2; }
    mod="${@: -1}"; mod="${mod%@*}"
    [ -d "$STANDIN_MODS/$mod" ] || { echo "stand-in go: no module $mod" >&2; exit 1; }
    emit "{" "	\"Path\": \"$mod\"," "	\"Version\": \"v0.0.0\"," "	\"Dir\": \"$STANDIN_MODS/$mod\"," \
        "	\"GoMod\": \"$STANDIN_MODS/$mod/go.mod\"" "}" ;;
list)
    mod="${@: -1}"
    sed -n "s|^[[:space:]]*\(require[[:space:]]*\)\{0,1\}$mod \(v[^[:space:]]*\).*|\2|p" go.mod ;;
*) echo "stand-in go: no '$1'" >&2; exit 2 ;;
esac
"""
)


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def slow_tool(path: Path, *lines: str) -> Path:
    """An executable that prints ``lines`` whatever it is asked, one write and a pause each."""
    quoted = " ".join("'" + ln.replace("'", "'\\''") + "'" for ln in lines)
    return executable(path, f"#!/usr/bin/env bash\n{SLOW_EMIT}\nemit {quoted}\n")


def go(bindir: Path) -> Path:
    return executable(bindir / "go", _GO)


def module(mods: Path, path: str, files: dict[str, str]) -> Path:
    """A stand-in module source tree at ``$STANDIN_MODS/<path>`` holding ``files``."""
    root = mods / path
    for rel, text in files.items():
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return root


def debian(bindir: Path) -> None:
    """A ``dpkg-query`` and an ``apt-get`` over a stand-in package database, ``$STANDIN_DEBS``.

    ``$STANDIN_DEBS/available/<pkg>/{version,root/...}`` is what ``apt-get install <pkg>`` can
    install (it copies the entry to ``$STANDIN_DEBS/installed/<pkg>``); ``dpkg-query -W -f=FMT <pkg>``
    answers ``ii <version>`` for an installed one (status 1 otherwise) and ``dpkg-query -L <pkg>``
    lists the installed files, whose paths lie under the entry's ``root`` (in several writes)."""
    executable(
        bindir / "dpkg-query",
        "#!/usr/bin/env bash\n"
        + SLOW_EMIT
        + r"""
echo "dpkg-query $*" >> "$STANDIN_LOG"
pkg="${@: -1}"; d="$STANDIN_DEBS/installed/$pkg"
[ -d "$d" ] || { echo "dpkg-query: no packages found matching $pkg" >&2; exit 1; }
case "$1" in
-W) printf 'ii %s' "$(cat "$d/version")" ;;
-L) mapfile -t files < <(find "$d/root" -mindepth 1 | sort); emit "${files[@]}" ;;
*) echo "stand-in dpkg-query: no '$1'" >&2; exit 2 ;;
esac
""",
    )
    executable(
        bindir / "apt-get",
        r"""#!/usr/bin/env bash
echo "apt-get $*" >> "$STANDIN_LOG"
args=()
while [ $# -gt 0 ]; do
    case "$1" in -o) shift 2 ;; *) args+=("$1"); shift ;; esac  # -o OPTION=VALUE, as apt-get takes it
done
[ "${args[0]}" = update ] && exit 0
for a in "${args[@]}"; do
    case "$a" in -*|install) continue ;; esac
    [ -d "$STANDIN_DEBS/available/$a" ] || { echo "E: Unable to locate package $a" >&2; exit 100; }
    mkdir -p "$STANDIN_DEBS/installed" && cp -a "$STANDIN_DEBS/available/$a" "$STANDIN_DEBS/installed/"
done
""",
    )


def debian_package(debs: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """Package ``name`` at ``version``, available to the stand-in apt-get: ``files`` maps a path
    under its root (``usr/bin/containerd``) to the lines its executable prints. Returns its root."""
    d = debs / "available" / name
    (d / "root").mkdir(parents=True, exist_ok=True)
    (d / "version").write_text(version)
    for rel, says in files.items():
        slow_tool(d / "root" / rel, *says.splitlines())
    return d / "root"


def gcc(bindir: Path) -> Path:
    """A ``gcc`` that "compiles" any source into a stand-in binary at ``-o``."""
    return executable(
        bindir / "gcc",
        "#!/usr/bin/env bash\n"
        + r"""
echo "gcc $*" >> "$STANDIN_LOG"
while [ $# -gt 0 ]; do [ "$1" = -o ] && { out="$2"; shift; }; shift; done
printf '#!/bin/sh\necho pause\n' > "${out:?gcc needs -o here}" && chmod +x "$out"
""",
    )


def helm_wheel(dest: Path, helm_script: str) -> tuple[Path, str]:
    """A wheel laid out like the pinned kubectl layer wheel: *.jsii.tgz > package/lib/layer.zip > helm/helm.

    Returns its path and sha256."""
    layer = io.BytesIO()
    with zipfile.ZipFile(layer, "w") as z:
        z.writestr("helm/helm", helm_script)
    tgz = io.BytesIO()
    with tarfile.open(fileobj=tgz, mode="w:gz") as t:
        data = layer.getvalue()
        info = tarfile.TarInfo("package/lib/layer.zip")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    whl = io.BytesIO()
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("standin_layer/_jsii/standin.jsii.tgz", tgz.getvalue())
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / "standin_layer-0.0.0-py3-none-any.whl"
    path.write_bytes(whl.getvalue())
    return path, hashlib.sha256(whl.getvalue()).hexdigest()


def python(bindir: Path) -> Path:
    """A python whose pip and venv are stand-ins; anything else runs the real interpreter.

    ``-m pip download ... -d DIR NAME`` copies ``$STANDIN_WHEEL`` into DIR; ``-m venv DEST`` makes a
    venv whose ``pip install`` installs ``$STANDIN_CHECKOV`` as its ``checkov``."""
    real = sys.executable
    return executable(
        bindir / "python3",
        f"""#!/usr/bin/env bash
echo "python $*" >> "$STANDIN_LOG"
if [ "$1 $2" = "-m pip" ]; then
    case "$3" in
    --version) echo "pip 0.0 (stand-in)"; exit 0 ;;
    download)
        while [ $# -gt 0 ]; do [ "$1" = -d ] && {{ cp "$STANDIN_WHEEL" "$2/"; exit 0; }}; shift; done
        exit 2 ;;
    esac
fi
if [ "$1 $2" = "-m venv" ]; then
    mkdir -p "$3/bin"
    printf '#!/usr/bin/env bash\necho "pip $*" >> "$STANDIN_LOG"\n' > "$3/bin/pip"
    printf 'cp "$STANDIN_CHECKOV" "%s/bin/checkov"\n' "$3" >> "$3/bin/pip"
    chmod +x "$3/bin/pip"
    exit 0
fi
exec {real} "$@"
""",
    )


def env(tmp: Path, bindir: Path, **extra: str) -> dict[str, str]:
    """The scripts' environment: stand-ins first on PATH, a scratch cache, nothing of this machine's Go."""
    return {
        "PATH": f"{bindir}{os.pathsep}/usr/bin:/bin",
        "HOME": str(tmp / "home"),
        "LLMTRAIN_CACHE": str(tmp / "cache"),
        "STANDIN_LOG": str(tmp / "calls.log"),
        "STANDIN_MODS": str(tmp / "mods"),
        "STANDIN_SAYS": str(tmp / "says"),
        "STANDIN_DEBS": str(tmp / "debs"),
        "GO": str(bindir / "go"),
        **extra,
    }


def calls(tmp: Path) -> list[str]:
    log = tmp / "calls.log"
    return log.read_text().splitlines() if log.exists() else []
