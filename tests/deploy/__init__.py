"""What deploy/ ships: the chart, the kustomize base, the lock, the alert rules."""
