#!/usr/bin/env bash
# Print the path of a `go` new enough to build every tools module (tools/*/go.mod); when the
# one found is missing or too old, bootstrap the pinned toolchain (tools/go/pins.env) into
#   ${LLMTRAIN_CACHE:-$HOME/.cache/llmtrain}/go/<version>.linux-<arch>/bin/go
# from the Go module proxy, checksum verified. Used by scripts/install-tools.sh, so a fresh
# machine needs no Go preinstalled.
#
# Which go is tried: $GO if set, else `go` on PATH, else /usr/local/go/bin/go.
# Env: GOPROXY (its first http(s) entry is used; default https://proxy.golang.org),
#      LLMTRAIN_GO_PINS (another pins file; tests use it).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PINS="${LLMTRAIN_GO_PINS:-$ROOT/tools/go/pins.env}"
# shellcheck source=../tools/go/pins.env
source "$PINS"
CACHE="${LLMTRAIN_CACHE:-$HOME/.cache/llmtrain}"

log() { echo "go-toolchain: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# The newest `go` directive of the tools modules: the one version that builds them all.
required_version() {
    local v best=0
    for f in "$ROOT"/tools/*/go.mod; do
        v="$(sed -n 's/^go \([0-9][0-9.]*\)[[:space:]]*$/\1/p' "$f")"
        [[ -n "$v" ]] || continue
        best="$(printf '%s\n%s\n' "$best" "$v" | sort -V | tail -n1)"
    done
    echo "$best"
}

# "go version go1.26.8 linux/amd64" -> 1.26.8 ; nothing when $1 is not a working go.
go_version_of() {
    local out
    out="$(GOTOOLCHAIN=local "$1" version 2>/dev/null)" || return 0
    sed -n 's/^go version go\([0-9][0-9.]*\).*/\1/p' <<<"$out"
}

at_least() { printf '%s\n%s\n' "$2" "$1" | sort -V -C; }  # $1 >= $2: already in version order

NEED="$(required_version)"
candidate="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
have="$(go_version_of "$candidate")"
if [[ -n "$have" ]] && at_least "$have" "$NEED"; then
    echo "$candidate"
    exit 0
fi
if [[ -n "$have" ]]; then why="go$have is older than the go$NEED the tools modules need"; else why="not a working go"; fi
log "$candidate: $why; bootstrapping $GO_TOOLCHAIN_VERSION"
at_least "${GO_TOOLCHAIN_VERSION#go}" "$NEED" ||
    die "pinned $GO_TOOLCHAIN_VERSION (tools/go/pins.env) is older than go$NEED; bump it"

case "$(uname -m)" in
    x86_64 | amd64) arch=amd64 ;;
    aarch64 | arm64) arch=arm64 ;;
    *) die "no pinned Go toolchain for $(uname -m)" ;;
esac
[[ "$(uname -s)" == Linux ]] || die "no pinned Go toolchain for $(uname -s); install Go >= $NEED"
sumvar="GO_TOOLCHAIN_SHA256_linux_$arch"
want="${!sumvar:-}"
[[ -n "$want" ]] || die "$sumvar is not pinned in $PINS"

modver="v0.0.1-$GO_TOOLCHAIN_VERSION.linux-$arch"
dest="$CACHE/go/$GO_TOOLCHAIN_VERSION.linux-$arch"
if [[ ! -x "$dest/bin/go" ]]; then
    mkdir -p "$CACHE/go"
    exec 8>"$CACHE/go/.lock"
    flock 8
fi
if [[ ! -x "$dest/bin/go" ]]; then
    proxy=https://proxy.golang.org
    IFS=',|' read -r -a entries <<<"${GOPROXY:-}"
    for e in "${entries[@]}"; do
        if [[ "$e" == http://* || "$e" == https://* ]]; then proxy="${e%/}"; break; fi
    done
    url="$proxy/golang.org/toolchain/@v/$modver.zip"
    log "download $url"
    t0=$(date +%s)
    python3 - "$url" "$want" "$dest" "golang.org/toolchain@$modver/" <<'PYEOF'
import hashlib, io, os, shutil, sys, urllib.request, zipfile
url, want, dest, prefix = sys.argv[1:]
data = urllib.request.urlopen(url, timeout=600).read()
got = hashlib.sha256(data).hexdigest()
if got != want:
    sys.exit(f"go-toolchain: ERROR: sha256 mismatch for {url}: got {got}, pinned {want}")
tmp = dest + ".tmp"
shutil.rmtree(tmp, ignore_errors=True)
with zipfile.ZipFile(io.BytesIO(data)) as z:
    for info in z.infolist():
        if not info.filename.startswith(prefix):
            sys.exit(f"go-toolchain: ERROR: unexpected path {info.filename!r} in {url}")
        rel = info.filename[len(prefix):]
        if not rel or rel.startswith("/") or ".." in rel.split("/"):
            continue
        out = os.path.join(tmp, rel)
        if info.is_dir():
            os.makedirs(out, exist_ok=True)
            continue
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with z.open(info) as src, open(out, "wb") as f:
            shutil.copyfileobj(src, f)
        mode = (info.external_attr >> 16) & 0o777
        os.chmod(out, mode or 0o644)
shutil.rmtree(dest, ignore_errors=True)
os.replace(tmp, dest)
PYEOF
    log "unpacked into $dest in $(($(date +%s) - t0))s"
fi
got="$(go_version_of "$dest/bin/go")"
[[ "go$got" == "$GO_TOOLCHAIN_VERSION" ]] || die "$dest/bin/go reports '${got:-nothing}', expected $GO_TOOLCHAIN_VERSION"
echo "$dest/bin/go"
