//go:build tools

// Package tools records the Kueue controller binary built by scripts/install-kueue.sh so that
// `go mod tidy` keeps its full dependency graph pinned in go.sum.
package tools

import _ "sigs.k8s.io/kueue/cmd/kueue"
