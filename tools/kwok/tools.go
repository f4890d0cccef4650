//go:build tools

// Package tools records the kwok binary built by scripts/install-tools.sh so that
// `go mod tidy` keeps its full dependency graph pinned in go.sum.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
