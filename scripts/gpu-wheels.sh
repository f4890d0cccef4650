#!/usr/bin/env bash
# The wheels that bench/gpu.py needs on the borrowed GPU machine and its image lacks (bench/gpu_wheels.txt),
# for that machine's Python 3.12 on x86-64, into .whl/ (git-ignored). The device tool's `run` carries the
# folder (carry [".whl"]); scripts/gpu-bench.sh installs it there. The machine reaches no registry, so
# every wheel is named in the list (--no-deps), one version each: the folder is rebuilt from the list, so a
# wheel the list no longer names does not travel. What travels (working tree + carried paths) is limited
# to 64 MiB in all: this fails above GPU_WHEELS_LIMIT_MIB.
#
#   make gpu-wheels        # or: bash scripts/gpu-wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
LIMIT_MIB=${GPU_WHEELS_LIMIT_MIB:-32}
mapfile -t pins < <(sed -e 's/#.*//' bench/gpu_wheels.txt | awk 'NF {print $1}')
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# pip matches manylinux_2_N tags exactly: offer the common ones (the device notes' recipe).
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d "$tmp" "${pins[@]}"
count=$(find "$tmp" -name '*.whl' | wc -l)
if [ "$count" -ne "${#pins[@]}" ]; then
  echo "gpu-wheels: ${#pins[@]} pins in bench/gpu_wheels.txt but $count wheels downloaded" >&2
  exit 1
fi
kib=$(du -sk "$tmp" | cut -f1)
if [ "$kib" -gt $((LIMIT_MIB * 1024)) ]; then
  echo "gpu-wheels: $((kib / 1024)) MiB of wheels, over the ${LIMIT_MIB} MiB kept for them (64 MiB travel in all)" >&2
  exit 1
fi
rm -rf .whl
mkdir .whl
mv "$tmp"/*.whl .whl/
echo "gpu-wheels: $count wheels, $((kib / 1024 + 1)) MiB in .whl/ (carry it: carry [\".whl\"])"
