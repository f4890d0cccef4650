# llmtrain — every install step lives here (pinned, cached outside the repo under
# $(LLMTRAIN_CACHE)); a fresh clone needs only `make demo` or `make test`.
SHELL := /bin/bash
export LLMTRAIN_CACHE ?= $(HOME)/.cache/llmtrain
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# make test's xdist workers: most of the suite waits on clusters and processes, so 2 cores run
# more workers than cores (tests/plugins/schedule.py groups and orders the work).
PYTEST_WORKERS ?= 4

.PHONY: help venv test test-fast test-peer demo clean lint
help:
	@echo "make demo          set everything up and run the local demo (dev cluster, operator, CPU training)"
	@echo "make test          run the whole test suite (builds tools on first run)"
	@echo "make test-fast     the edit loop: unit, table, property and static tests (no cluster, no Go build)"
	@echo "make test-peer     the Kubeflow Trainer v2 peer-benchmark tests (builds make peer-tools)"
	@echo "make lint          ruff and mypy (also run by make test), and ruff's format check"
	@echo "make tools         build/install the pinned Kubernetes tools into $(LLMTRAIN_CACHE)"
	@echo "make kueue         the same as make tools (Kueue is one of them), for --kueue and its chain tests"
	@echo "make dev-cluster   start a local kube-apiserver + etcd + controller-manager"
	@echo "make gpu-wheels    the wheels the borrowed GPU machine lacks, into .whl/ (docs/performance/gpu.md)"
	@echo "make gpu-smoke     the GPU machine's bench command on this CPU under its torch (a ~5 GB venv, once)"
	@echo "make trainer-image the trainer image built here with buildah (no CUDA base, no EFA; ~12 min cold, then cached)"

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml constraints.txt scripts/venv.sh scripts/venv_bin.py scripts/docs_mermaid.py tools/mermaid/pins.env
	bash scripts/venv.sh

include $(sort $(wildcard mk/*.mk))

# kueue (= tools): tests/chain/test_kueue_chain.py (slow) runs the real Kueue
# The peer suite (Kubeflow Trainer v2 for bench/operator_scale.py --peer) has its own build and command.
# PYTHONDONTWRITEBYTECODE emptied: with it set (some shells and CI images do), every pytest worker
# re-rewrote every test module's asserts and every operator, trainer and CLI process compiled the
# project's modules again (__pycache__ is git-ignored). trainer-image: tests/test_demo.py runs real
# pods of it.
test: venv tools kueue trainer-image
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -m "not peer" -n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder $(PYTEST_ARGS)

test-peer: venv tools peer-tools
	$(PY) -m pytest -m peer $(PYTEST_ARGS)

# No cluster and no tool that make venv does not install: the fixtures mark what needs them
# (tests/plugins/needs.py), so test-fast needs neither `make tools` nor Go.
test-fast: venv
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -m "not cluster and not tools and not slow and not peer" $(PYTEST_ARGS)

# The demo leaves the dev cluster running for exploration; `make dev-cluster-down` stops it.
# The demo's chain cluster runs Kueue: two p5 jobs share one queue with quota for one, one job on
# each backend (the chart enables both); and a real node, where the CPU jobs run as pods of the
# trainer image (make trainer-image, built by make setup beside the tools).
demo: DEV_CLUSTER_FLAGS += --kueue --real-node
demo: CHART_VALUES += --set 'backends.enabled={pytorchjob,jobset}'
demo: SETUP_IMAGE = trainer-image
demo: setup dev-cluster chart-install chart-operator-kubeconfig
	$(PY) scripts/demo.py

# The Python layer (mostly downloads) and the Go tools (CPU) at the same time, lines kept whole;
# for the demo the trainer image's build too (SETUP_IMAGE).
.PHONY: setup
SETUP_IMAGE ?=
setup:
	@$(MAKE) --no-print-directory -j3 -Oline venv tools $(SETUP_IMAGE)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache

# ruff and mypy, configured in pyproject.toml, with zero findings on the shipped code; `make test`
# runs the same checks (tests/lint/test_lint.py), and the format check on the whole tree.
.PHONY: lint
lint: venv
	$(PY) -m ruff check operator trainer devcluster
	$(PY) -m mypy
	$(PY) -m ruff format --check .
