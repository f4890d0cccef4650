#!/usr/bin/env bash
# The one command for a borrowed GPU machine (docs/performance/gpu.md): the fair llmtrain-vs-torchtitan
# bench with the machine's own python3 and torch, everything written under $OUT, in under 8 minutes.
#
#   here, once:      make gpu-wheels                       (the packages the machine lacks, into .whl/)
#   device tool:     run  command: bash scripts/gpu-bench.sh   carry: [".whl"]   timeout_s: 600
#   here, CPU smoke: make gpu-smoke                        (this script under torch 2.11, on the CPU)
#
# Files under $OUT: gpu-bench.json (versions found, every row, comparisons), gpu-bench.md (the docs
# table), gpu-bench.log (this whole run's output). Extra arguments go to bench/gpu.py.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?OUT: the folder to write the results to (the device tool sets it)}"
PY=${PYTHON:-python3}
# Seconds for the rows together: bench/gpu.py boxes each row inside it and writes the JSON after each.
# The wheel install (~10 s), the probe and the driver fit in the rest of the 8 minutes.
BUDGET=${GPU_BENCH_BUDGET_S:-420}
mkdir -p "$OUT"
log="$OUT/gpu-bench.log"
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
{
  if ! compgen -G ".whl/*.whl" >/dev/null; then
    echo "gpu-bench: no wheels in .whl/: run 'make gpu-wheels' on the developer machine and carry .whl"
    exit 2
  fi
  # The device notes' recipe: no index (no network there), no dependencies (each one is in the list).
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl ||
    { echo "gpu-bench: installing the carried wheels failed"; exit 2; }
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
  # A last guard over bench/gpu.py's own boxes: it is killed (and its rows' process groups with it) well
  # inside the device call's limit, and the JSON it wrote after its last finished row stays.
  timeout -k 15 $((BUDGET + 45)) "$PY" bench/gpu.py --budget "$BUDGET" \
    --out "$OUT/gpu-bench.json" --table "$OUT/gpu-bench.md" "$@"
} 2>&1 | tee "$log"
