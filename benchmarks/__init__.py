"""Replay and benchmarks: gpufrac driven over HTTP the way kube-scheduler drives it."""
