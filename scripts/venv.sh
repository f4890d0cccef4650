#!/usr/bin/env bash
# Builds the project's Python environment in two layers, so a fresh clone on a warm machine is
# ready in seconds:
#   1. third-party packages, exactly as pinned in constraints.txt, in a venv cached OUTSIDE the
#      repo and keyed by the pins: $LLMTRAIN_CACHE/venv/<key>  (rebuilt only when a pin changes)
#   2. a small .venv in the repo that sees layer 1 through a .pth file and holds the project
#      itself as an editable install.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
CACHE=${LLMTRAIN_CACHE:-$HOME/.cache/llmtrain}
key=$( { "$PYTHON" -c 'import sys; print(sys.version)'; cat constraints.txt; } | sha256sum | cut -c1-16)
deps="$CACHE/venv/$key"

if [ ! -f "$deps/.complete" ]; then
  # Two clones installing the same key at once: the second waits for the first's layer instead of
  # deleting it half-built.
  mkdir -p "$CACHE/venv"
  exec 9>"$deps.lock"
  flock 9
  if [ ! -f "$deps/.complete" ]; then
    echo "venv: installing pinned dependencies into $deps (first time only)"
    rm -rf "$deps"
    "$PYTHON" -m venv "$deps"
    "$deps/bin/pip" install -q --upgrade pip==26.3 setuptools==84.2.1
    "$deps/bin/pip" install -q -r constraints.txt
    touch "$deps/.complete"
  fi
  exec 9>&-
fi

site=$("$deps/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ ! -x .venv/bin/python ] || [ "$(cat .venv/.deps 2>/dev/null)" != "$deps" ]; then
  rm -rf .venv
  # --without-pip: pip and setuptools come from the dependency layer, pinned with the rest.
  "$PYTHON" -m venv --without-pip .venv
  here_site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # addsitedir (not a bare path) so the dependency layer's own .pth files are processed too.
  echo "import site; site.addsitedir('$site')" > "$here_site/_llmtrain_deps.pth"
  echo "$deps" > .venv/.deps
fi
# devcluster/ is not part of the package (pyproject.toml): a path entry of its own, for the tests,
# benchmarks and `make dev-cluster`.
here_site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$PWD/devcluster" > "$here_site/_llmtrain_devcluster.pth"
.venv/bin/python -m pip install -q --no-deps --no-build-isolation -e . >.venv/install.log 2>&1 || { cat .venv/install.log; exit 1; }
# Every command of the dependency layer (mkdocs, pytest, ruff, mypy, torchrun, ...) in .venv/bin,
# where the docs tell users to run them: a Python console script is copied with .venv's
# interpreter in place of the layer's (so it sees the project too), a binary is linked.
.venv/bin/python scripts/venv_bin.py "$deps/bin" .venv/bin
# The docs site's mermaid (pinned; served by the site itself, not a CDN).
.venv/bin/python scripts/docs_mermaid.py >/dev/null
touch .venv/.installed
echo "venv: ready (.venv, dependencies from $deps)"
