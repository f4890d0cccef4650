//go:build tools

// Package tools records the binary scripts/install-tools.sh builds from this module (CoreDNS,
// the real node's cluster DNS) so that `go mod tidy` keeps its dependency graph pinned in go.sum.
// Its own module: CoreDNS v1.15.0 needs k8s.io/client-go v0.37.1, newer than tools/k8s's aligned
// v0.36.x set, so it cannot join that module.
package tools

import (
	_ "github.com/coredns/coredns"
)
