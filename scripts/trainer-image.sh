#!/usr/bin/env bash
# Builds the trainer image (the Dockerfile's `trainer` target) on this machine, with no registry, and
# exports it as an OCI archive a local node's containerd imports. Prints the path of the image's
# manifest file (JSON, below) on stdout; progress goes to stderr.
#
#   bash scripts/trainer-image.sh [build]   # build if needed (make trainer-image)
#   bash scripts/trainer-image.sh key       # the image key for the working tree (16 hex), nothing built
#   bash scripts/trainer-image.sh clean     # delete the builder's storage and every image (next build is cold)
#
# What cannot be had here is replaced by build args only (the Dockerfile's header): the CUDA base by
# an Ubuntu 24.04 (noble) rootfs made with mmdebstrap from archive.ubuntu.com (the CUDA image's own
# distribution, so requirements/trainer-image.txt installs unchanged), and the EFA installer skipped
# (EFA_INSTALLER_VERSION=none). The image runs CPU pods; GPU and EFA pods need the released image.
#
# Builder: buildah as root (Debian 12's 1.28.2 or newer), `bud --format docker` (OCI format drops
# SHELL and with it pipefail), `--network host` (the default network leaves netavark's iptables
# chains behind), `--pull=never`, `--layers`. The host's CA bundle is the build secret `build-ca`
# (pip behind a TLS-intercepting proxy): $LLMTRAIN_BUILD_CA, else $PIP_CERT, $SSL_CERT_FILE or
# /etc/ssl/certs/ca-certificates.crt; it is never written into the image and is not part of the key.
#
# Cache, all under $LLMTRAIN_CACHE (default ~/.cache/llmtrain), one build at a time (flock):
#   buildah/storage                   buildah's image store (overlay driver; ~12 GB for one lock)
#   trainer-image/<key16>.tar         the image as an OCI archive (~3.3 GB; the last 2 keys kept)
#   trainer-image/<key16>.json        its manifest file (schema 1): "ref" (llmtrain.local/trainer:<key16>,
#                                     also the archive's org.opencontainers.image.ref.name), "key",
#                                     "archive" (file name beside it), "archive_path", "archive_bytes",
#                                     "manifest_digest" (the archive's OCI manifest: what containerd
#                                     lists after `ctr -n k8s.io images import`), "image_id",
#                                     "base_ref", "build_args", "git_commit", "git_dirty", "built_at",
#                                     "timings_s" {"base", "build", "export"} (0: not done this run)
#   trainer-image/current.json        -> the newest one
# The key is the sha256 over every input: the Dockerfile, .dockerignore and the git-tracked files of
# the build context (.dockerignore's allow-list; untracked files are not built, and not keyed), the
# build args, the base's own key (its recipe below) and buildah's version. An image already tagged
# with the key is not built again, and its archive is not exported again.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${LLMTRAIN_CACHE:-$HOME/.cache/llmtrain}"
STORE="$CACHE/buildah"
OUT="$CACHE/trainer-image"
REPO=llmtrain.local/trainer
BASE_REPO=llmtrain.local/ubuntu-base
KEEP=2

# --- the base: Ubuntu 24.04 noble, minbase + what the Dockerfile's first RUN needs to start --------
# Trust anchor: the ubuntu-keyring package of noble's release pocket, pinned by sha256, and the
# archive signing key (2018) in it, pinned by fingerprint. apt: minbase leaves it out on Ubuntu;
# python3-venv: in universe; ubuntu-keyring: apt inside the image verifies the archive with it.
UBUNTU_MIRROR=http://archive.ubuntu.com/ubuntu
UBUNTU_SECURITY=http://security.ubuntu.com/ubuntu
UBUNTU_SUITE=noble
KEYRING_DEB=pool/main/u/ubuntu-keyring/ubuntu-keyring_2023.11.28.1_all.deb
KEYRING_DEB_SHA256=36de43b15853ccae0028e9a767613770c704833f82586f28eb262f0311adb8a8
ARCHIVE_KEY_FPR=F6ECB3762474EDA9D21B7022871920D1991BC93C
BASE_PACKAGES=apt,ubuntu-keyring,python3,python3-venv,ca-certificates,libcap2-bin
BASE_SOURCES=(
    "deb $UBUNTU_MIRROR $UBUNTU_SUITE main universe"
    "deb $UBUNTU_MIRROR $UBUNTU_SUITE-updates main universe"
    "deb $UBUNTU_SECURITY $UBUNTU_SUITE-security main universe"
)
BUILDAH_MIN=1.28.0   # bud --secret, --layers with --format docker
RUNC_MIN=1.1.0 # Debian 12's runc 1.1.5 ran the spike
MMDEBSTRAP_MIN=1.0.0

log() { echo "trainer-image: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
# shellcheck source=lib/apt.sh
source "$ROOT/scripts/lib/apt.sh"

at_least() { printf '%s\n%s\n' "$2" "$1" | sort -V -C; }
sha256() { local s; s="$(sha256sum "$@")"; echo "${s%% *}"; }
now() { echo "$EPOCHREALTIME"; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# The version a tool prints first ("buildah version 1.28.2 (...)", "mmdebstrap 1.3.5"), or "".
tool_version() {
    local out
    out="$("$1" --version 2>/dev/null)" || return 0
    [[ "$out" =~ ([0-9]+\.[0-9]+(\.[0-9]+)?) ]] && echo "${BASH_REMATCH[1]}"
    return 0
}

# A tool at least $2, apt-get installing package $3 when the command is missing.
need_tool() {
    local cmd="$1" min="$2" pkg="$3" v
    if ! command -v "$cmd" >/dev/null; then
        apt_install "$pkg"
        command -v "$cmd" >/dev/null || die "$cmd not found after apt-get install $pkg"
    fi
    v="$(tool_version "$cmd")"
    [[ -n "$v" ]] || die "cannot read $cmd's version (\`$cmd --version\`)"
    at_least "$v" "$min" ||
        die "$cmd $v is too old: this build needs $cmd >= $min (Debian 12's package or newer); upgrade it and retry with: make trainer-image"
    echo "$v"
}

bah() { buildah --root "$STORE/storage" --runroot "$RUNROOT" --storage-driver overlay "$@"; }
have_image() { bah inspect --type image "$1" >/dev/null 2>&1; }

# --- the key ---------------------------------------------------------------------------------------
# The build context: .dockerignore is an allow-list (`*`, then `!path` lines, then exclusions); the
# context holds the git-tracked files it allows, as they are in the working tree.
context_files() {
    local line pathspec=()
    while IFS= read -r line || [[ -n "$line" ]]; do
        case "$line" in
        '' | '#'* | '*' | '**/'*) ;;
        '!'*) pathspec+=("${line#!}") ;;
        *) pathspec+=(":(exclude)$line") ;;
        esac
    done <"$ROOT/.dockerignore"
    git -C "$ROOT" ls-files -z -- Dockerfile .dockerignore "${pathspec[@]}"
}

base_key() {
    local recipe
    recipe="$(printf '%s\n' "llmtrain ubuntu-base v1" "mmdebstrap --variant=minbase" "$UBUNTU_SUITE" \
        "$BASE_PACKAGES" "$KEYRING_DEB" "$KEYRING_DEB_SHA256" "$ARCHIVE_KEY_FPR" "${BASE_SOURCES[@]}" \
        "buildah $BUILDAH_VERSION")"
    sha256 <<<"$recipe"
}

# Copies the context into $1 and prints the image key (sha256 over every input).
stage_context_and_key() {
    local ctx="$1" f files=()
    git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1 || die "$ROOT is not a git checkout: the image is built from its tracked files"
    rm -rf "$ctx" && mkdir -p "$ctx"
    mapfile -d '' -t files < <(context_files)
    for f in "${files[@]}"; do
        [[ -f "$ROOT/$f" ]] || continue # tracked, but deleted in the working tree
        mkdir -p "$ctx/$(dirname "$f")"
        cp -p "$ROOT/$f" "$ctx/$f"
    done
    [[ -f "$ctx/Dockerfile" ]] || die "no Dockerfile tracked in $ROOT"
    {
        echo "llmtrain trainer-image v1"
        echo "buildah $BUILDAH_VERSION"
        echo "base $BASE_KEY"
        echo "target trainer"
        printf 'arg %s\n' "${BUILD_ARGS[@]}"
        (cd "$ctx" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
    } | sha256sum | cut -c1-64
}

# --- the base image ----------------------------------------------------------------------------------
make_base() {
    local ref="$1" work kr fprs c t0 out
    have_image "$ref" && return 0
    need_tool mmdebstrap "$MMDEBSTRAP_MIN" mmdebstrap >/dev/null
    command -v gpg >/dev/null || apt_install gpg
    command -v curl >/dev/null || apt_install curl
    log "base $ref: mmdebstrap $UBUNTU_SUITE ($BASE_PACKAGES) from $UBUNTU_MIRROR (first time only, ~30 s)"
    t0=$(now)
    # Not under $CACHE (often in /root, mode 700): apt inside mmdebstrap reads the keyring as _apt.
    work="$(mktemp -d "${TMPDIR:-/tmp}/llmtrain-base.XXXXXX")"
    chmod 755 "$work"
    BASE_WORK="$work" # removed on exit, whatever happens
    curl -fsSL --retry 3 "$UBUNTU_MIRROR/$KEYRING_DEB" -o "$work/keyring.deb" ||
        die "cannot download $UBUNTU_MIRROR/$KEYRING_DEB"
    [[ "$(sha256 "$work/keyring.deb")" == "$KEYRING_DEB_SHA256" ]] ||
        die "$KEYRING_DEB: sha256 $(sha256 "$work/keyring.deb") is not the pinned $KEYRING_DEB_SHA256"
    dpkg-deb -x "$work/keyring.deb" "$work/keyring"
    kr="$work/keyring/usr/share/keyrings/ubuntu-archive-keyring.gpg"
    [[ -f "$kr" ]] || die "$KEYRING_DEB has no usr/share/keyrings/ubuntu-archive-keyring.gpg"
    mkdir -m 700 "$work/gnupg"
    fprs="$(gpg --homedir "$work/gnupg" --batch --with-colons --show-keys "$kr" 2>/dev/null)"
    grep -Eq "^fpr:+$ARCHIVE_KEY_FPR:" <<<"$fprs" ||
        die "the Ubuntu archive keyring does not hold the pinned key $ARCHIVE_KEY_FPR"
    if ! mmdebstrap --variant=minbase --keyring="$kr" --include="$BASE_PACKAGES" \
        "$UBUNTU_SUITE" "$work/rootfs.tar" "${BASE_SOURCES[@]}" >"$work/mmdebstrap.log" 2>&1; then
        out="$(tail -n 15 "$work/mmdebstrap.log")"
        rm -rf "$work"
        die "mmdebstrap failed (is $UBUNTU_MIRROR reachable?); its last lines:"$'\n'"$out"
    fi
    c="$(bah from scratch)"
    bah add "$c" "$work/rootfs.tar" / >&2
    bah config --cmd /bin/bash --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --label "io.llmtrain.base-key=$BASE_KEY" "$c" >&2
    bah commit --quiet --format docker --rm "$c" "$ref" >/dev/null
    rm -rf "$work"
    TIMES[base]="$(since "$t0")"
}

# --- leftovers: what a build must not leave on the host ----------------------------------------------
netavark_rules() {
    local rules
    command -v iptables-save >/dev/null || { echo 0; return 0; }
    rules="$(iptables-save 2>/dev/null)" || true
    grep -ci netavark <<<"$rules" || true
}
store_mounts() {
    local m
    m="$(cat /proc/self/mountinfo)"
    grep -cF " $STORE/" <<<"$m" || true
}

# --- pruning: the last $KEEP keys' images and archives stay ------------------------------------------
prune() {
    local files=() entries=() e j k n=0
    shopt -s nullglob
    files=("$OUT"/*.json)
    shopt -u nullglob
    ((${#files[@]})) || return 0
    # newest first (a build touches its manifest, a no-op too)
    mapfile -t entries < <(stat -c '%.9Y %n' "${files[@]}" | sort -rg)
    for e in "${entries[@]}"; do
        j="${e#* }"
        [[ "$j" != "$OUT/current.json" ]] || continue
        n=$((n + 1))
        ((n > KEEP)) || continue
        k="$(basename "$j" .json)"
        log "prune $REPO:$k"
        bah rmi "$REPO:$k" >/dev/null 2>&1 || true
        rm -f "$OUT/$k.tar" "$j"
    done
}

json_string() { local s="${1//\\/\\\\}"; printf '"%s"' "${s//\"/\\\"}"; }

write_manifest() {
    local file="$1" digest="$2" id="$3" size="$4" commit dirty sep=""
    commit="$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
    dirty=false
    [[ -z "$(git -C "$ROOT" status --porcelain --untracked-files=no -- "${CTX_PATHS[@]}" 2>/dev/null)" ]] || dirty=true
    cat >"$file.tmp" <<EOF
{
  "schema": 1,
  "ref": $(json_string "$REF"),
  "key": $(json_string "$KEY"),
  "archive": $(json_string "$KEY16.tar"),
  "archive_path": $(json_string "$OUT/$KEY16.tar"),
  "archive_bytes": $size,
  "manifest_digest": $(json_string "$digest"),
  "image_id": $(json_string "$id"),
  "base_ref": $(json_string "$BASE_REF"),
  "deps_key": $(json_string "$DEPS_KEY"),
  "build_args": [$(for a in "${BUILD_ARGS[@]}"; do printf '%s' "$sep"; json_string "$a"; sep=", "; done)],
  "buildah_version": $(json_string "$BUILDAH_VERSION"),
  "git_commit": $(json_string "$commit"),
  "git_dirty": $dirty,
  "built_at": $(json_string "$(date -u +%Y-%m-%dT%H:%M:%SZ)"),
  "timings_s": {"base": ${TIMES[base]:-0}, "build": ${TIMES[build]:-0}, "export": ${TIMES[export]:-0}}
}
EOF
    mv -f "$file.tmp" "$file"
}

# -----------------------------------------------------------------------------------------------------
cmd="${1:-build}"
case "$cmd" in build | key | clean) ;; *) die "usage: $0 [build|key|clean]" ;; esac
mkdir -p "$OUT" "$STORE"
exec 9>"$CACHE/buildah.lock"
flock 9
RUNROOT="/run/llmtrain-buildah/$(sha256 <<<"$STORE" | cut -c1-12)"

if [[ "$cmd" == clean ]]; then
    if command -v buildah >/dev/null && [[ -d "$STORE/storage" ]]; then
        bah rm --all >/dev/null 2>&1 || true
        bah rmi --all --force >/dev/null 2>&1 || true
    fi
    rm -rf "$STORE" "$OUT"
    log "removed $STORE and $OUT"
    exit 0
fi

[[ "$cmd" == key ]] || [[ $(id -u) -eq 0 ]] || die "buildah runs as root here (rootless is untested): run as root"
if [[ "$cmd" == key ]]; then
    command -v buildah >/dev/null || die "buildah is not installed (make trainer-image installs it)"
    BUILDAH_VERSION="$(tool_version buildah)"
else
    BUILDAH_VERSION="$(need_tool buildah "$BUILDAH_MIN" buildah)"
    # buildah's RUN steps need an OCI runtime, which its package only recommends (apt_install
    # leaves recommends out): without one, the first RUN fails with "exec: no command"
    need_tool runc "$RUNC_MIN" runc >/dev/null
fi
BASE_KEY="$(base_key)"
BASE_KEY16="${BASE_KEY:0:16}"
BASE_REF="$BASE_REPO:$BASE_KEY16"
BUILD_ARGS=("CUDA_BASE_IMAGE=$BASE_REF" "EFA_INSTALLER_VERSION=none")
CTX="$OUT/context"
KEY="$(stage_context_and_key "$CTX")"
KEY16="${KEY:0:16}"
REF="$REPO:$KEY16"
if [[ "$cmd" == key ]]; then
    rm -rf "$CTX"
    echo "$KEY16"
    exit 0
fi
# What the third-party layers depend on: when it changes, the builder's cached intermediate images of
# the old lock are garbage (~6 GB) and are pruned before the build.
DEPS_KEY="$(cat "$CTX/requirements/bootstrap.txt" "$CTX/requirements/trainer-image.txt" <(echo "$BASE_KEY") | sha256sum | cut -c1-16)"
mapfile -t CTX_PATHS < <(cd "$CTX" && find . -type f | sed 's|^\./||')
MANIFEST="$OUT/$KEY16.json"
declare -A TIMES=()

net0="$(netavark_rules)"
mnt0="$(store_mounts)"
BASE_WORK=""
check_leftovers() {
    local net mnt
    [[ -z "$BASE_WORK" ]] || rm -rf "$BASE_WORK"
    net="$(netavark_rules)"
    mnt="$(store_mounts)"
    if ((mnt > mnt0)); then
        bah umount --all >/dev/null 2>&1 || true
        mnt="$(store_mounts)"
    fi
    ((net <= net0)) || die "the build left netavark iptables rules behind ($net0 before, $net after: iptables-save)"
    ((mnt <= mnt0)) || die "the build left mounts under $STORE behind ($mnt0 before, $mnt after: /proc/self/mountinfo)"
}
trap check_leftovers EXIT

if have_image "$REF" && [[ -f "$MANIFEST" && -f "$OUT/$KEY16.tar" ]]; then
    log "$REF is built and exported (key $KEY16): nothing to do"
else
    if ! have_image "$REF"; then
        make_base "$BASE_REF"
        prev="$(readlink "$OUT/current.json" 2>/dev/null || true)"
        if [[ -n "$prev" && -f "$OUT/$prev" ]]; then
            prev_deps="$(sed -n 's/^  "deps_key": "\(.*\)",$/\1/p' "$OUT/$prev")"
            if [[ -n "$prev_deps" && "$prev_deps" != "$DEPS_KEY" ]]; then
                log "the lock or the base changed: pruning the builder's cached layers of the old one"
                bah rmi --prune >/dev/null 2>&1 || true
            fi
        fi
        ca=()
        for f in "${LLMTRAIN_BUILD_CA:-}" "${PIP_CERT:-}" "${SSL_CERT_FILE:-}" /etc/ssl/certs/ca-certificates.crt; do
            [[ -n "$f" && -s "$f" ]] && { ca=(--secret "id=build-ca,src=$f"); break; }
        done
        log "buildah bud --target trainer -t $REF (key $KEY16; cold: ~7 min, mostly pip installing 3.1 GB of wheels)"
        t0=$(now)
        bah bud --format docker --network host --pull=never --layers --target trainer \
            "${ca[@]}" "${BUILD_ARGS[@]/#/--build-arg=}" -t "$REF" -f "$CTX/Dockerfile" "$CTX" >&2
        TIMES[build]="$(since "$t0")"
    fi
    log "export $REF to $OUT/$KEY16.tar (oci-archive)"
    t0=$(now)
    rm -f "$OUT/$KEY16.tar.tmp" "$OUT/$KEY16.digest"
    bah push --quiet --digestfile "$OUT/$KEY16.digest" "$REF" "oci-archive:$OUT/$KEY16.tar.tmp:$REF" >&2
    mv -f "$OUT/$KEY16.tar.tmp" "$OUT/$KEY16.tar"
    TIMES[export]="$(since "$t0")"
    digest="$(cat "$OUT/$KEY16.digest")"
    rm -f "$OUT/$KEY16.digest"
    id="$(bah inspect --type image --format '{{.FromImageID}}' "$REF")"
    write_manifest "$MANIFEST" "$digest" "$id" "$(stat -c %s "$OUT/$KEY16.tar")"
fi
ln -sfn "$KEY16.json" "$OUT/current.json"
touch "$MANIFEST"
prune
rm -rf "$CTX"
echo "$MANIFEST"
