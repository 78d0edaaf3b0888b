//go:build tools

// Package tools pins the kubelet the real-node tests build, from the same k8s.io/kubernetes
// release as ../kube (its own module, so that adding it left ../kube's build cache valid).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kubelet"
)
