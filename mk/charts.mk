# Charts, dashboards and alert rules (included by the top Makefile; needs VENV, PY, and
# DEV_CLUSTER_STATE from mk/tools.mk for the install targets).
CHART := charts/llmtrain-operator
CHART_RELEASE ?= llmtrain
CHART_NAMESPACE ?= llmtrain-system
CHART_VALUES ?=
HELM = $(shell $(PY) -c 'from llmtrain_devcluster.tools import find_tool; print(find_tool("helm"))')
CHART_HELM_ENV = HELM_CACHE_HOME=$(CURDIR)/$(DEV_CLUSTER_STATE)/helm/cache \
	HELM_CONFIG_HOME=$(CURDIR)/$(DEV_CLUSTER_STATE)/helm/config \
	HELM_DATA_HOME=$(CURDIR)/$(DEV_CLUSTER_STATE)/helm/data

.PHONY: charts-gen charts-check chart-lint chart-install chart-uninstall chart-operator-kubeconfig

## charts-gen: regenerate the chart CRDs (from llmtrain.crd) and dashboards/rules copies
charts-gen: $(VENV)/.installed
	$(PY) scripts/gen-chart-crds.py
	$(PY) scripts/gen-dashboards.py

## charts-check: fail if any generated chart/dashboard file is out of date
charts-check: $(VENV)/.installed
	$(PY) scripts/gen-chart-crds.py --check
	$(PY) scripts/gen-dashboards.py --check

# The etcd subchart is vendored in $(CHART)/charts/llmtrain-etcd: no `helm dependency build` step.
chart-lint: tools
	$(CHART_HELM_ENV) $(HELM) lint --strict $(CHART)
	$(CHART_HELM_ENV) $(HELM) lint --strict $(CHART) -f $(CHART)/ci/all-on-values.yaml

## chart-install: helm upgrade --install the operator chart into the dev cluster (make dev-cluster first)
chart-install: tools
	$(CHART_HELM_ENV) KUBECONFIG=$(DEV_CLUSTER_STATE)/kubeconfig $(HELM) upgrade --install \
		$(CHART_RELEASE) $(CHART) --namespace $(CHART_NAMESPACE) --create-namespace $(CHART_VALUES)

chart-uninstall:
	$(CHART_HELM_ENV) KUBECONFIG=$(DEV_CLUSTER_STATE)/kubeconfig $(HELM) uninstall $(CHART_RELEASE) \
		--namespace $(CHART_NAMESPACE)

## chart-operator-kubeconfig: write $(DEV_CLUSTER_STATE)/operator.kubeconfig with the release's
## ServiceAccount token (run the operator locally with exactly the chart's RBAC)
chart-operator-kubeconfig: $(VENV)/.installed
	$(PY) -c 'import sys; from llmtrain_devcluster import DevCluster; \
		print(DevCluster(sys.argv[1]).serviceaccount_kubeconfig(sys.argv[2], sys.argv[3], \
		path=sys.argv[1] + "/operator.kubeconfig", expiration_seconds=86400))' \
		$(DEV_CLUSTER_STATE) $(CHART_NAMESPACE) $(CHART_RELEASE)-llmtrain-operator
