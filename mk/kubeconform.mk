# kubeconform (manifest validation against Kubernetes 1.35 and CRD schemas; see
# scripts/install-kubeconform.sh). Included by the top Makefile; adds itself to `make test`.
.PHONY: kubeconform
## kubeconform: build the pinned kubeconform and fetch the pinned Prometheus Operator CRDs into the cache
kubeconform:
	@bash scripts/install-kubeconform.sh >/dev/null

test: kubeconform
