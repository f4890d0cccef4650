//go:build tools

// Package tools records the JobSet controller built by scripts/install-tools.sh so that
// `go mod tidy` keeps its dependency graph pinned in go.sum.
package tools

import _ "sigs.k8s.io/jobset"
