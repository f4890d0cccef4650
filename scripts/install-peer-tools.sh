#!/usr/bin/env bash
# Build the peer controller that bench/operator_scale.py --peer measures llmtrain against, into a
# cache of its own (NOT the dev-cluster tools cache: its key, and so `make tools`, are unchanged):
#
#   ${LLMTRAIN_CACHE:-$HOME/.cache/llmtrain}/peer-tools/<key>/
#     bin/trainer-controller-manager   (go build, github.com/kubeflow/trainer/v2: tools/trainer)
#     trainer/{crds,webhook}/*.yaml     (the Trainer module's own manifests/base/{crds,webhook})
#     trainer/runtimes/torch_distributed.yaml
#     VERSIONS build-times.txt
#   ${LLMTRAIN_CACHE}/peer-tools/current -> <key>
#
# The JobSet controller the Trainer renders into is the chain's own (make tools: tools/k8s); this
# script checks that tools/k8s pins the version the Trainer's go.mod requires.
# <key> = first 16 hex digits of sha256 over tools/trainer/go.{mod,sum} (KEY_FILES);
# llmtrain_devcluster.trainer_v2 computes the same key. Idempotent: with the cache present it only
# prints the versions. Go: scripts/go-toolchain.sh, exactly as scripts/install-tools.sh.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TRAINER_MOD="$ROOT/tools/trainer"
JOBSET_MOD="$ROOT/tools/k8s"
CACHE="${LLMTRAIN_CACHE:-$HOME/.cache/llmtrain}"
# Keep in sync with llmtrain_devcluster/trainer_v2.py:_KEY_FILES (a test checks they agree).
KEY_FILES=(trainer/go.mod trainer/go.sum)
KEY="$(cd "$ROOT/tools" && cat "${KEY_FILES[@]}" | sha256sum | cut -c1-16)"
DEST="$CACHE/peer-tools/$KEY"
BIN="$DEST/bin"

log() { echo "install-peer-tools: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

mkdir -p "$CACHE/peer-tools"
exec 9>"$CACHE/peer-tools/.lock"
flock 9
mkdir -p "$BIN"

now() { date +%s; }
record_time() { echo "$1 $2s $(date -u +%Y-%m-%dT%H:%M:%SZ)" >>"$DEST/build-times.txt"; }

GO_BIN=""
go_bin() {
    [[ -n "$GO_BIN" ]] || GO_BIN="$(bash "$ROOT/scripts/go-toolchain.sh")"
    echo "$GO_BIN"
}
go_build() {  # module dir, output dir, packages...
    local mod="$1" out="$2"
    shift 2
    (cd "$mod" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" \
        "$(go_bin)" build -trimpath -ldflags="-s -w" -o "$out/" "$@")
}
mod_dir() {
    (cd "$1" && GOTOOLCHAIN=local GOFLAGS=-mod=readonly "$(go_bin)" mod download -json "$2") |
        sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'
}
# The first match only: sed quits there itself (no `| head` to SIGPIPE it under pipefail).
mod_version() { sed -n "s|^[[:space:]]*\(require[[:space:]]*\)\{0,1\}$2 \(v[^[:space:]]*\).*|\2|;T;p;q" "$1/go.mod"; }

TRAINER_VERSION="$(mod_version "$TRAINER_MOD" github.com/kubeflow/trainer/v2)"
JOBSET_VERSION="$(mod_version "$JOBSET_MOD" sigs.k8s.io/jobset)"
[[ -n "$TRAINER_VERSION" && -n "$JOBSET_VERSION" ]] || die "cannot read the pinned versions from tools/{trainer,k8s}/go.mod"

# JobSet at the version the pinned Trainer's own go.mod requires: the pair Kubeflow released together.
want_jobset="$(cd "$TRAINER_MOD" && GOTOOLCHAIN=local GOFLAGS=-mod=readonly "$(go_bin)" list -m -f '{{.Version}}' sigs.k8s.io/jobset)"
[[ "$want_jobset" == "$JOBSET_VERSION" ]] ||
    die "tools/k8s pins sigs.k8s.io/jobset $JOBSET_VERSION but Trainer $TRAINER_VERSION requires $want_jobset"

build() {  # name, module dir, package, built binary's name
    local name="$1" mod="$2" pkg="$3" built="$4"
    [[ -x "$BIN/$name" ]] && return 0
    local tmp="$DEST/.build-$name" t0
    rm -rf "$tmp" && mkdir -p "$tmp"
    log "go build $pkg (2 cores: expect several minutes cold)"
    t0=$(now)
    go_build "$mod" "$tmp" "$pkg"
    mv -f "$tmp/$built" "$BIN/$name" && rm -rf "$tmp"
    record_time "$name-go-build" "$(($(now) - t0))"
}
build trainer-controller-manager "$TRAINER_MOD" github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager trainer-controller-manager

# The module's own manifests, copied as they are (the dev cluster applies their patches itself).
copy_manifests() {  # dest subdir, source dir, files...
    local sub="$1" src="$2"
    shift 2
    [[ -s "$DEST/$sub/.complete" ]] && return 0
    rm -rf "$DEST/$sub.tmp" && mkdir -p "$DEST/$sub.tmp"
    local f
    for f in "$@"; do
        [[ -s "$src/$f" ]] || die "$src/$f not found"
        install -D -m 644 "$src/$f" "$DEST/$sub.tmp/$f"
    done
    echo ok >"$DEST/$sub.tmp/.complete"
    rm -rf "${DEST:?}/$sub" && mv "$DEST/$sub.tmp" "$DEST/$sub"
}
T="$(mod_dir "$TRAINER_MOD" github.com/kubeflow/trainer/v2)"
copy_manifests trainer "$T/manifests/base" \
    crds/trainer.kubeflow.org_clustertrainingruntimes.yaml crds/trainer.kubeflow.org_trainingruntimes.yaml \
    crds/trainer.kubeflow.org_trainjobs.yaml webhook/manifests.yaml webhook/patch_mutating.yaml \
    webhook/patch_validating.yaml runtimes/torch_distributed.yaml manager/controller_manager_config.yaml

{
    echo "trainer-controller-manager github.com/kubeflow/trainer/v2 $TRAINER_VERSION"
    echo "jobset-controller          sigs.k8s.io/jobset $JOBSET_VERSION (the chain's, make tools)"
} | tee "$DEST/VERSIONS"
ln -sfn "$KEY" "$CACHE/peer-tools/current.tmp" && mv -Tf "$CACHE/peer-tools/current.tmp" "$CACHE/peer-tools/current"
echo "peer tools dir: $DEST"
