# Dev-cluster tooling (owned by the local-control-plane work; included by the top Makefile).
# Needs from the top Makefile: VENV, PY and the $(VENV)/.installed target.
DEV_CLUSTER_STATE ?= .dev-cluster
# e.g. DEV_CLUSTER_FLAGS="--no-project-crd --crd extra.yaml"
DEV_CLUSTER_FLAGS ?=

.PHONY: tools dev-cluster dev-cluster-down dev-cluster-status

## tools: build/install the pinned kube-apiserver, controller-manager, kubectl, etcd, helm, promtool
tools:
	bash scripts/install-tools.sh

## dev-cluster: start a local control plane (etcd + apiserver + controller-manager) in $(DEV_CLUSTER_STATE)
dev-cluster: tools $(VENV)/.installed
	$(PY) -m llmtrain_devcluster up --state-dir $(DEV_CLUSTER_STATE) $(DEV_CLUSTER_FLAGS)

## dev-cluster-down: stop it, leaving no process behind
dev-cluster-down:
	$(PY) -m llmtrain_devcluster down --state-dir $(DEV_CLUSTER_STATE)

dev-cluster-status:
	$(PY) -m llmtrain_devcluster status --state-dir $(DEV_CLUSTER_STATE)
