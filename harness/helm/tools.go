//go:build tools

// Package tools pins the Helm command the chart tests build (harness/helm.py), so
// `go mod tidy` keeps it.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
