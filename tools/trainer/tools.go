//go:build tools

// Package tools records the Kubeflow Trainer v2 controller manager built by
// scripts/install-peer-tools.sh so that `go mod tidy` keeps its dependency graph pinned in go.sum.
package tools

import _ "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"
