# Dev-cluster tooling (owned by the local-control-plane work; included by the top Makefile).
# Needs from the top Makefile: VENV, PY and the $(VENV)/.installed target.
DEV_CLUSTER_STATE ?= .dev-cluster
# e.g. DEV_CLUSTER_FLAGS="--no-project-crd --crd extra.yaml --nodes p5.48xlarge=4"
DEV_CLUSTER_FLAGS ?=
# chain: + kube-scheduler, kwok GPU nodes, training-operator, JobSet; light: control plane only
DEV_CLUSTER_MODE ?= chain

.PHONY: tools kueue peer-tools dev-cluster dev-cluster-down dev-cluster-status

## tools: build/install the pinned kube-apiserver, controller-manager, scheduler, kubectl, kubelet,
## kwok, training-operator, jobset-controller, kueue (one Go module, tools/k8s), CoreDNS (tools/coredns),
## etcd, helm, promtool, and the real node's runtime (Debian's containerd, runc, CNI plugins) and
## images (bootstraps the pinned Go when go is missing or old)
tools:
	bash scripts/install-tools.sh

## kueue: Kueue is one of the tools (`make tools` builds it with the others, from one module); kept
## as a name for DEV_CLUSTER_FLAGS=--kueue and the Kueue chain tests
kueue: tools

## peer-tools: build Kubeflow Trainer v2's controller manager (pinned in tools/trainer; its own cache
## key) for bench/operator_scale.py --peer, on the chain's JobSet controller; not used by make test
peer-tools:
	bash scripts/install-peer-tools.sh

## dev-cluster: start a local cluster in $(DEV_CLUSTER_STATE): etcd + apiserver + controller-manager,
## and with DEV_CLUSTER_MODE=chain (default) kube-scheduler, kwok GPU nodes, training-operator and JobSet;
## DEV_CLUSTER_FLAGS=--real-node adds a real kubelet node (containerd, CNI bridge, CoreDNS; root)
dev-cluster: tools $(VENV)/.installed
	$(PY) -m llmtrain_devcluster up --state-dir $(DEV_CLUSTER_STATE) \
		$(if $(filter chain,$(DEV_CLUSTER_MODE)),--chain,) $(DEV_CLUSTER_FLAGS)

## dev-cluster-down: stop it, leaving no process behind
dev-cluster-down:
	$(PY) -m llmtrain_devcluster down --state-dir $(DEV_CLUSTER_STATE)

dev-cluster-status:
	$(PY) -m llmtrain_devcluster status --state-dir $(DEV_CLUSTER_STATE)
