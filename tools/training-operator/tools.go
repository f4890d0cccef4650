//go:build tools

// Package tools records the training-operator binary built by scripts/install-tools.sh
// so that `go mod tidy` keeps its full dependency graph pinned in go.sum.
package tools

import _ "github.com/kubeflow/training-operator/cmd/training-operator.v1"
