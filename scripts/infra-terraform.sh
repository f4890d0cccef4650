#!/usr/bin/env bash
# Prints the path of a pinned terraform binary, building it first if needed.
#
# Terraform v1.5.7 (the last MPL-2.0 release) is built from its Go module source into
#   $LLMTRAIN_CACHE/terraform-1.5.7/bin/terraform
# so every machine checks formatting (`terraform fmt -check`) and evaluates the catalog-derived
# locals (`terraform console`) with the same build. Needs only `go` and the Go module proxy; about
# 2-3 minutes cold on 2 cores, instant warm. A terraform already on PATH is deliberately NOT used:
# its version (and so its fmt output) would differ from machine to machine.
# Providers are never needed: fmt and console on provider-free files run without `terraform init`.
set -euo pipefail
VERSION=1.5.7
CACHE=${LLMTRAIN_CACHE:-$HOME/.cache/llmtrain}
dest="$CACHE/terraform-$VERSION"
bin="$dest/bin/terraform"

if [ ! -x "$bin" ] || [ ! -f "$dest/.complete" ]; then
  command -v go >/dev/null || { echo "infra-terraform: 'go' is needed to build terraform $VERSION" >&2; exit 1; }
  echo "infra-terraform: building terraform v$VERSION into $dest (first time only)" >&2
  rm -rf "$dest"
  mkdir -p "$dest/bin"
  # Own module/build caches under the tool dir, so the build never depends on the user's GOPATH.
  GOBIN="$dest/bin" GOPATH="$dest/gopath" GOMODCACHE="$dest/gopath/mod" GOCACHE="$dest/gocache" \
    GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0 \
    go install -trimpath -ldflags="-s -w" "github.com/hashicorp/terraform@v$VERSION" >&2
  # Keep the binary, drop ~1.5 GB of module and build caches.
  chmod -R u+w "$dest/gopath" 2>/dev/null || true
  rm -rf "$dest/gopath" "$dest/gocache"
  "$bin" version -json | grep -q "\"terraform_version\": \"$VERSION\"" || { echo "infra-terraform: built binary is not v$VERSION" >&2; exit 1; }
  touch "$dest/.complete"
fi
echo "$bin"
