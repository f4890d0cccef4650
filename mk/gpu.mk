# The borrowed GPU machine's bench (issue 32; included by the top Makefile). Not part of make test.

.PHONY: gpu-wheels gpu-smoke

## gpu-wheels: download what bench/gpu.py needs on the GPU machine and its image lacks (bench/gpu_wheels.txt)
## into .whl/, for that machine's Python 3.12; the device tool's run carries it: carry [".whl"]
gpu-wheels:
	bash scripts/gpu-wheels.sh

## gpu-smoke: the GPU machine's one command (scripts/gpu-bench.sh) on this CPU under the machine's torch
## (2.11), in a throw-away venv built once under $(LLMTRAIN_CACHE)/gpu-smoke (~5 GB); writes
## bench/results/gpu_smoke_cpu.json
gpu-smoke: gpu-wheels
	bash scripts/gpu-smoke.sh
