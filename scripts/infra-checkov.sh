#!/usr/bin/env bash
# Prints the path of a pinned checkov, installing it first if needed.
#
# checkov lives in its OWN virtualenv, outside the repo, because it pins a different python-hcl2
# (module `hcl2`) than the project's dev environment uses:
#   $LLMTRAIN_CACHE/checkov-<version>/
# Its full dependency set is pinned by scripts/infra-checkov-constraints.txt; the venv is rebuilt
# only when that file changes. ~30 s cold, instant warm.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
CACHE=${LLMTRAIN_CACHE:-$HOME/.cache/llmtrain}
constraints=scripts/infra-checkov-constraints.txt
version=$(sed -n 's/^checkov==//p' "$constraints")
[ -n "$version" ] || { echo "infra-checkov: no checkov== pin in $constraints" >&2; exit 1; }
dest="$CACHE/checkov-$version"
key=$( { "$PYTHON" -c 'import sys; print(sys.version)'; cat "$constraints"; } | sha256sum | cut -c1-16)

if [ "$(cat "$dest/.complete" 2>/dev/null)" != "$key" ]; then
  # make test's xdist workers ask at once: one installs, the others wait for it instead of
  # deleting its half-built venv.
  mkdir -p "$CACHE"
  exec 9>"$dest.lock"
  flock 9
  if [ "$(cat "$dest/.complete" 2>/dev/null)" != "$key" ]; then
    echo "infra-checkov: installing checkov $version into $dest (first time only)" >&2
    rm -rf "$dest"
    "$PYTHON" -m venv "$dest"
    "$dest/bin/pip" install -q --disable-pip-version-check -r "$constraints" >&2
    "$dest/bin/checkov" --version >/dev/null
    echo "$key" > "$dest/.complete"
  fi
  exec 9>&-
fi
echo "$dest/bin/checkov"
