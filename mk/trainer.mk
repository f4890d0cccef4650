# Trainer targets (owned by the trainer work; included by the top Makefile: VENV, PY, $(VENV)/.installed).
BENCH_TRAINER_ARGS ?=

.PHONY: bench-trainer test-trainer

## bench-trainer: trainer step time vs a minimal PyTorch loop (same model and data), as a ratio
bench-trainer: $(VENV)/.installed
	$(PY) bench/trainer_overhead.py $(BENCH_TRAINER_ARGS)

## test-trainer: only the trainer tests (multi-process, CPU/gloo)
test-trainer: $(VENV)/.installed
	$(PY) -m pytest tests/trainer -m trainer $(PYTEST_ARGS)
