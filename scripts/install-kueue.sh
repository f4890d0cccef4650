#!/usr/bin/env bash
# Build the pinned Kueue controller (sigs.k8s.io/kueue, tools/kueue/go.mod) for the dev cluster's
# --kueue mode, into its OWN cache key, apart from the other tools (scripts/install-tools.sh):
#
#   ${LLMTRAIN_CACHE:-$HOME/.cache/llmtrain}/kueue/<key>/
#     bin/kueue                      (go build of sigs.k8s.io/kueue/cmd/kueue)
#     crds/*.yaml                    (config/components/crd/bases of the same module)
#     webhook/manifests.yaml         (config/components/webhook: the webhook paths it serves)
#     manager/controller_manager_config.yaml (the release's own configuration: its default integrations)
#     VERSION build-times.txt
#
# <key> = first 16 hex digits of sha256 over tools/kueue/go.mod and go.sum;
# llmtrain_devcluster.kueue computes the same key. Bumping Kueue rebuilds Kueue only: the tools
# cache key does not include these files. Idempotent: with the cache present it only prints the
# version. Cold build: ~15 min measured on 2 busy cores (v0.17.0).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MOD="$ROOT/tools/kueue"
CACHE="${LLMTRAIN_CACHE:-$HOME/.cache/llmtrain}"
# Keep in sync with llmtrain_devcluster/kueue.py:KEY_FILES.
KEY="$(cd "$MOD" && cat go.mod go.sum | sha256sum | cut -c1-16)"
DEST="$CACHE/kueue/$KEY"

log() { echo "install-kueue: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

VERSION="$(sed -n 's|^require sigs.k8s.io/kueue \(v[^[:space:]]*\).*|\1|p' "$MOD/go.mod")"
[[ -n "$VERSION" ]] || die "tools/kueue/go.mod has no 'require sigs.k8s.io/kueue vX'"
if [[ -s "$DEST/VERSION" && -x "$DEST/bin/kueue" && -s "$DEST/manager/controller_manager_config.yaml" ]]; then
    echo "kueue $(cat "$DEST/VERSION") ($DEST)"
    exit 0
fi
mkdir -p "$CACHE/kueue"
exec 9>"$CACHE/kueue/.lock"
flock 9
GO="$(bash "$ROOT/scripts/go-toolchain.sh")"
if [[ ! -x "$DEST/bin/kueue" ]]; then
    tmp="$DEST/.build"
    rm -rf "$tmp" && mkdir -p "$tmp"
    log "go build kueue $VERSION (2 cores: expect ~15 minutes cold)"
    t0=$(date +%s)
    (cd "$MOD" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" \
        "$GO" build -trimpath -ldflags="-s -w" -o "$tmp/" sigs.k8s.io/kueue/cmd/kueue)
    mkdir -p "$DEST/bin" && mv -f "$tmp/kueue" "$DEST/bin/kueue" && rm -rf "$tmp"
    echo "kueue-go-build $(($(date +%s) - t0))s $(date -u +%Y-%m-%dT%H:%M:%SZ)" >>"$DEST/build-times.txt"
fi
src="$(cd "$MOD" && GOTOOLCHAIN=local GOFLAGS=-mod=readonly "$GO" mod download -json sigs.k8s.io/kueue |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[[ -d "$src/config/components/crd/bases" ]] || die "Kueue CRDs not found under $src"
rm -rf "$DEST/crds.tmp" "$DEST/webhook.tmp" "$DEST/manager.tmp"
mkdir -p "$DEST/crds.tmp" "$DEST/webhook.tmp" "$DEST/manager.tmp"
install -m 644 "$src"/config/components/crd/bases/*.yaml "$DEST/crds.tmp/"
install -m 644 "$src/config/components/webhook/manifests.yaml" "$DEST/webhook.tmp/"
install -m 644 "$src/config/components/manager/controller_manager_config.yaml" "$DEST/manager.tmp/"
for d in crds webhook manager; do rm -rf "${DEST:?}/$d" && mv "$DEST/$d.tmp" "$DEST/$d"; done
echo "$VERSION" >"$DEST/VERSION.tmp" && mv -f "$DEST/VERSION.tmp" "$DEST/VERSION"
echo "kueue $VERSION ($DEST)"
