#!/usr/bin/env bash
# Prints the path of a pinned terraform binary, building it first if needed.
#
# Terraform v1.5.7 (the last MPL-2.0 release) is built from its Go module source into
#   $LLMTRAIN_CACHE/terraform-1.5.7/bin/terraform
# so every machine checks formatting (`terraform fmt -check`) and evaluates the catalog-derived
# locals (`terraform console`) with the same build. Needs only the Go module proxy (`go` is found or
# bootstrapped by scripts/go-toolchain.sh, like every script that builds Go); about
# 2-3 minutes cold on 2 cores, instant warm. A terraform already on PATH is deliberately NOT used:
# its version (and so its fmt output) would differ from machine to machine.
# Providers are never needed: fmt and console on provider-free files run without `terraform init`.
#
# Like scripts/install-tools.sh: flock-protected (two clones or two test runs at once build once,
# the second waits and reuses it), the build goes to a scratch dir and only a verified binary is
# moved into place, and nothing cached is wiped first: Go's own module and build caches (shared
# with install-tools.sh) are kept, so an interrupted build resumes instead of starting over.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION=1.5.7
CACHE=${LLMTRAIN_CACHE:-$HOME/.cache/llmtrain}
dest="$CACHE/terraform-$VERSION"
bin="$dest/bin/terraform"

complete() { [ -x "$bin" ] && [ -f "$dest/.complete" ]; }

if ! complete; then
  mkdir -p "$CACHE"
  exec 9>"$CACHE/terraform-$VERSION.lock"
  flock 9
fi
if ! complete; then  # still missing once we hold the lock: nobody else built it meanwhile
  GO="$(bash "$ROOT/scripts/go-toolchain.sh")"
  echo "infra-terraform: building terraform v$VERSION into $dest (first time only)" >&2
  tmp="$dest/.build"
  rm -rf "$tmp"  # only a previous interrupted build's output, never a cache
  mkdir -p "$tmp" "$dest/bin"
  GOBIN="$tmp" GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0 \
    "$GO" install -trimpath -ldflags="-s -w" "github.com/hashicorp/terraform@v$VERSION" >&2
  # Read the whole output first: `terraform version | grep -q` under pipefail failed at random
  # (grep exits at its match, terraform's next write gets SIGPIPE, the pipeline fails).
  built="$("$tmp/terraform" version -json)" ||
    { echo "infra-terraform: the built terraform does not run (\`terraform version -json\` failed); retry with: make infra-tools" >&2; exit 1; }
  grep -q "\"terraform_version\": \"$VERSION\"" <<<"$built" ||
    { echo "infra-terraform: built binary is not v$VERSION (it says: ${built:0:200}); retry with: make infra-tools" >&2; exit 1; }
  mv -f "$tmp/terraform" "$bin"
  rm -rf "$tmp"
  touch "$dest/.complete"
fi
echo "$bin"
