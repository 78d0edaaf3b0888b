"""Shared builders: small clusters and pods, in the core's terms and as Kubernetes JSON."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from scoring.specs import GpuSpec, NodeSpec


def gpu_node(name: str, n_gpus: int, *, model: str = "T4", memory_mib: int = 16384,
             cpu_milli: int = 64000, host_mib: int = 262144, replicas: int = 8,
             healthy: tuple[bool, ...] | None = None) -> NodeSpec:
    """A node with ``n_gpus`` identical GPUs (UUIDs ``GPU-<name>-<i>``)."""
    ok = healthy or (True,) * n_gpus
    return NodeSpec(name, cpu_milli, host_mib, tuple(
        GpuSpec(i, f"GPU-{name}-{i}", model, memory_mib, replicas, ok[i]) for i in range(n_gpus)))


def pod_json(name: str = "p", *, uid: str | None = None, gpus: int | str | None = 1,
             annotations: dict[str, str] | None = None, cpu: str = "1", memory: str = "1Gi",
             node: str | None = None, phase: str = "Pending") -> dict[str, Any]:
    """A Pod object as kube-scheduler sends it."""
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}}
    if gpus is not None:
        resources["limits"] = {"gpufrac.io/gpu": str(gpus)}
    pod: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "default", "uid": uid or f"uid-{name}",
                     "annotations": dict(annotations or {})},
        "spec": {"containers": [{"name": "c", "resources": resources}]},
        "status": {"phase": phase},
    }
    if node:
        pod["spec"]["nodeName"] = node
    return pod


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test under ``tests/e2e`` as ``e2e`` (``pytest -m "not e2e"`` skips them)."""
    for item in items:
        if "e2e" in item.path.parent.parts:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture
def rng() -> np.random.Generator:
    """Seeded generator: every random test is reproducible."""
    return np.random.default_rng(20261122)
