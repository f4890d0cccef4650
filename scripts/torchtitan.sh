#!/usr/bin/env bash
# A separate venv with torchtitan for bench/gpu.py's torchtitan row (issue 12), built on top of the
# project's dependency layer: torch, numpy, safetensors, tokenizers ... come from that layer at the
# constraints.txt pins (pip sees them as installed through a .pth file, as in scripts/venv.sh), so
# both sides of the comparison run the same torch. Only torchtitan and what it adds (datasets,
# tyro, torchdata, tensorboard and their dependencies) are installed here; the resolved versions are
# written to <venv>/freeze.txt. Cached under $LLMTRAIN_CACHE/torchtitan/<key>.
#
#   scripts/torchtitan.sh            # prints the site-packages dir to pass as --torchtitan-path
#   .venv/bin/python bench/gpu.py --torchtitan-path "$(scripts/torchtitan.sh)"
set -euo pipefail
cd "$(dirname "$0")/.."
TORCHTITAN_VERSION=0.2.2   # bench/gpu.py TORCHTITAN_VERSION
PYTHON=${PYTHON:-python3}
CACHE=${LLMTRAIN_CACHE:-$HOME/.cache/llmtrain}
[ -x .venv/bin/python ] || bash scripts/venv.sh >&2
deps=$(cat .venv/.deps)
key=$( { echo "$TORCHTITAN_VERSION"; echo "$deps"; cat constraints.txt; } | sha256sum | cut -c1-16)
dir="$CACHE/torchtitan/$key"
if [ ! -f "$dir/.complete" ]; then
  echo "torchtitan: installing torchtitan==$TORCHTITAN_VERSION into $dir (first time only)" >&2
  rm -rf "$dir"
  "$PYTHON" -m venv --without-pip "$dir"
  site=$("$deps/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  here=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "import site; site.addsitedir('$site')" > "$here/_llmtrain_deps.pth"
  # -c constraints.txt: nothing the project pins may change version (pip sees the layer's packages as
  # installed and adds only the missing ones, here, never in the shared layer).
  "$deps/bin/python" -m pip --python "$dir/bin/python" install -q -c constraints.txt "torchtitan==$TORCHTITAN_VERSION" >&2 \
    || { echo "torchtitan: install failed" >&2; exit 1; }
  "$deps/bin/python" -m pip --python "$dir/bin/python" freeze --path "$here" > "$dir/freeze.txt"
  touch "$dir/.complete"
fi
"$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'
