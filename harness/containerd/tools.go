//go:build tools

// Package tools pins the containerd commands the real-node tests build (containerd 2.x:
// Kubernetes 1.36's kubelet no longer supports the 1.x that Debian ships), so
// `go mod tidy` keeps them.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
