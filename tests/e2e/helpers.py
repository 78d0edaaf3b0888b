"""Builders and the invariant checker for the end-to-end tests."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from harness.controlplane import add_fake_node, fake_node_gpus
from harness.invariants import check_invariants

__all__ = ["SCHEDULER", "check_invariants", "gpu_pod", "make_nodes", "new_namespace"]

SCHEDULER = "gpufrac-scheduler"


def make_nodes(api: client.CoreV1Api, group: str, count: int, gpus: int, model: str = "A10",
               memory_mib: int = 24576, replicas: int = 4, **kw: Any) -> list[str]:
    """Create ``count`` fake GPU nodes labelled ``gpufrac.io/test-group=group``."""
    names = []
    for i in range(count):
        name = f"{group}-{i:03d}"
        add_fake_node(api, name, fake_node_gpus(name, gpus, model, memory_mib, replicas), **kw)
        api.patch_node(name, {"metadata": {"labels": {"gpufrac.io/test-group": group}}})
        names.append(name)
    return names


def gpu_pod(name: str, group: str, *, gpus: int = 1, fraction: str | None = None,
            memory: str | None = None, model: str | None = None, qos: str | None = None,
            cpu: str = "100m", mem: str = "128Mi", scheduler: str = SCHEDULER,
            extra_annotations: dict[str, str] | None = None) -> client.V1Pod:
    """A pod asking gpufrac for GPUs, pinned to a test group's nodes by nodeSelector."""
    annotations = dict(extra_annotations or {})
    for key, value in (("fraction", fraction), ("memory", memory), ("gpu-model", model), ("qos", qos)):
        if value is not None:
            annotations[f"gpufrac.io/{key}"] = value
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, annotations=annotations),
        spec=client.V1PodSpec(
            scheduler_name=scheduler, node_selector={"gpufrac.io/test-group": group},
            termination_grace_period_seconds=0,
            containers=[client.V1Container(name="main", image="registry.k8s.io/pause:3.10",
                                           resources=client.V1ResourceRequirements(
                                               requests={"cpu": cpu, "memory": mem},
                                               limits={"gpufrac.io/gpu": str(gpus)}))]))


def new_namespace(api: client.CoreV1Api, name: str) -> str:
    """Create a namespace for one test."""
    api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    return name
