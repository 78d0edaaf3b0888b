//go:build tools

// Package tools pins the kube-controller-manager the chart-install tests build (Deployments,
// ReplicaSets and DaemonSets need it), from the same k8s.io/kubernetes release as ../kube (its
// own module, so that adding it left ../kube's and ../kubelet's build caches valid).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
