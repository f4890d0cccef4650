#!/usr/bin/env bash
# Prints the directory of a pinned kubeconform build, building it first if needed:
#   $LLMTRAIN_CACHE/kubeconform-<version>/bin/kubeconform      (built from its Go module)
#   $LLMTRAIN_CACHE/kubeconform-<version>/crds/*.yaml          (Prometheus Operator CRDs, pinned)
# kubeconform validates manifests offline against JSON schemas. The schemas come from the dev
# cluster's own kube-apiserver (/openapi/v2 of Kubernetes v1.36 built from k8s.io/kubernetes, plus
# the CRDs installed there: see tests/charts/kube_json_schemas.py), because the usual schema
# repository is not reachable from our machines; the ServiceMonitor/PodMonitor/PrometheusRule
# CRDs the chart uses are taken from the pinned prometheus-operator Go module for that.
# Needs only the Go module proxy: `go` is found (or bootstrapped) by scripts/go-toolchain.sh, like
# every script that builds Go. Serialised with flock: parallel callers wait.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KUBECONFORM_VERSION=v0.8.0
PROMETHEUS_OPERATOR_VERSION=v0.85.0
CACHE=${LLMTRAIN_CACHE:-$HOME/.cache/llmtrain}
dest="$CACHE/kubeconform-$KUBECONFORM_VERSION-po-$PROMETHEUS_OPERATOR_VERSION"
mkdir -p "$CACHE"
exec 9>"$CACHE/.kubeconform.lock"
flock 9
if [ ! -f "$dest/.complete" ]; then
  GO="$(bash "$ROOT/scripts/go-toolchain.sh")"
  echo "install-kubeconform: building kubeconform $KUBECONFORM_VERSION into $dest (first time only)" >&2
  rm -rf "$dest"
  mkdir -p "$dest/bin" "$dest/crds"
  work="$dest/.work"
  export GOPATH="$work/gopath" GOMODCACHE="$work/gopath/mod" GOCACHE="$work/gocache" GOFLAGS=-mod=mod \
    GOTOOLCHAIN=local CGO_ENABLED=0
  GOBIN="$dest/bin" "$GO" install -trimpath -ldflags="-s -w" \
    "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION" >&2
  dir=$("$GO" mod download -json "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION" |
    sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  for crd in servicemonitors podmonitors prometheusrules; do
    cp "$dir/example/prometheus-operator-crd/monitoring.coreos.com_$crd.yaml" "$dest/crds/"
  done
  chmod -R u+w "$work" 2>/dev/null || true
  rm -rf "$work"
  # `go install` stamps the module version into the binary (kubeconform -v prints "development").
  # The whole output first, then the match: `go version -m | grep -q` under pipefail fails whenever
  # go is still writing when grep exits (SIGPIPE).
  stamp="$("$GO" version -m "$dest/bin/kubeconform")"
  grep -Eq "^\s+mod\s+github.com/yannh/kubeconform\s+$KUBECONFORM_VERSION\s" <<<"$stamp" ||
    { echo "install-kubeconform: built binary is not $KUBECONFORM_VERSION; retry with: make kubeconform" >&2; exit 1; }
  touch "$dest/.complete"
fi
echo "$dest"
