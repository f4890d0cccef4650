# llmtrain — every install step lives here (pinned, cached outside the repo under
# $(LLMTRAIN_CACHE)); a fresh clone needs only `make demo` or `make test`.
SHELL := /bin/bash
export LLMTRAIN_CACHE ?= $(HOME)/.cache/llmtrain
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: help venv test test-fast test-peer demo clean lint
help:
	@echo "make demo          set everything up and run the local demo (dev cluster, operator, CPU training)"
	@echo "make test          run the whole test suite (builds tools on first run)"
	@echo "make test-fast     everything except tests marked slow"
	@echo "make test-peer     the Kubeflow Trainer v2 peer-benchmark tests (builds make peer-tools)"
	@echo "make lint          ruff and mypy (also run by make test), and ruff's format check"
	@echo "make tools         build/install the pinned Kubernetes tools into $(LLMTRAIN_CACHE)"
	@echo "make kueue         build the pinned Kueue (own cache key) for --kueue and its chain tests"
	@echo "make dev-cluster   start a local kube-apiserver + etcd + controller-manager"
	@echo "make gpu-wheels    the wheels the borrowed GPU machine lacks, into .whl/ (docs/performance/gpu.md)"
	@echo "make gpu-smoke     the GPU machine's bench command on this CPU under its torch (a ~5 GB venv, once)"

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml constraints.txt scripts/venv.sh
	bash scripts/venv.sh

include $(sort $(wildcard mk/*.mk))

# kueue: tests/chain/test_kueue_chain.py (slow) runs the real Kueue; test-fast does not need it
# The peer suite (Kubeflow Trainer v2 for bench/operator_scale.py --peer) has its own build and command.
test: venv tools kueue
	$(PY) -m pytest -m "not peer" $(PYTEST_ARGS)

test-peer: venv tools peer-tools
	$(PY) -m pytest -m peer $(PYTEST_ARGS)

test-fast: venv tools
	$(PY) -m pytest -m "not slow and not peer" $(PYTEST_ARGS)

# The demo leaves the dev cluster running for exploration; `make dev-cluster-down` stops it.
# The demo's chain cluster runs Kueue: two p5 jobs share one queue with quota for one.
demo: DEV_CLUSTER_FLAGS += --kueue
demo: venv tools kueue dev-cluster chart-install chart-operator-kubeconfig
	$(PY) scripts/demo.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache

# ruff and mypy, configured in pyproject.toml, with zero findings on the shipped code; `make test`
# runs the same checks (tests/lint/test_lint.py), and the format check on the whole tree.
.PHONY: lint
lint: venv
	$(PY) -m ruff check operator trainer devcluster
	$(PY) -m mypy
	$(PY) -m ruff format --check .
