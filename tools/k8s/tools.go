//go:build tools

// Package tools records the binaries built by scripts/install-tools.sh so that
// `go mod tidy` keeps their full dependency graph pinned in go.sum.
package tools

import (
	_ "github.com/kubeflow/training-operator/cmd/training-operator.v1"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "sigs.k8s.io/jobset"
	_ "sigs.k8s.io/kueue/cmd/kueue"
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
