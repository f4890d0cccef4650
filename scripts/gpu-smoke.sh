#!/usr/bin/env bash
# The GPU machine's one command (scripts/gpu-bench.sh), run here on the CPU under that machine's torch:
# a throw-away Python 3.12 venv with bench/gpu_machine.txt (torch 2.11 and the image's packages that the
# bench imports) and NOTHING of the project's dependency layer, the carried wheels (.whl/, make gpu-wheels)
# installed into it as the machine installs them, then bench/gpu.py's CPU path with compile rows. It proves
# that the trainer and the torchtitan rows import and train on that torch, and that the wheel list is
# complete, before any GPU time is spent. Not part of `make test`: the venv is ~4 GB (torch's CUDA wheels;
# PyPI has no CPU-only torch), built once under $LLMTRAIN_CACHE/gpu-smoke/<key>.
#
#   make gpu-smoke         # writes bench/results/gpu_smoke_cpu.json (GPU_SMOKE_RESULT)
#
# Python: GPU_SMOKE_PYTHON, else the first python3.12 found (the machine's minor version), else python3 as
# a proxy (the report's env.python says which one ran).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${LLMTRAIN_CACHE:-$HOME/.cache/llmtrain}
RESULT=${GPU_SMOKE_RESULT:-bench/results/gpu_smoke_cpu.json}

is_312() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; }
python=${GPU_SMOKE_PYTHON:-}
if [ -z "$python" ]; then
  for cand in python3.12 "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12; do
    if is_312 "$cand"; then python=$cand; break; fi
  done
fi
if [ -z "$python" ]; then
  python=python3
  echo "gpu-smoke: no python3.12 here; $($python --version) stands in for the machine's 3.12" >&2
fi

[ -d .whl ] || bash scripts/gpu-wheels.sh

key=$( { "$python" -c 'import sys; print(sys.version)'; cat bench/gpu_machine.txt; } | sha256sum | cut -c1-16)
venv="$CACHE/gpu-smoke/$key"
if [ ! -f "$venv/.complete" ]; then
  echo "gpu-smoke: building $venv from bench/gpu_machine.txt (first time only, ~4 GB)" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q -r bench/gpu_machine.txt
  touch "$venv/.complete"
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# The machine's command, with its python; --device cpu --quick: the tiny shape; --cpu-compile: the
# compile rows too (inductor's C++ backend), which the CPU path of `make test` leaves out.
OUT="$out" PYTHON="$venv/bin/python" GPU_BENCH_BUDGET_S=${GPU_SMOKE_BUDGET_S:-1500} \
  nice -n 10 bash scripts/gpu-bench.sh --device cpu --quick --cpu-compile
cp "$out/gpu-bench.json" "$RESULT"
echo "gpu-smoke: wrote $RESULT"
