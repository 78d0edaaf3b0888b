"""Builders and the invariant checker for the end-to-end tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kubernetes import client

from harness.controlplane import add_fake_node, fake_node_gpus
from harness.invariants import check_invariants
from harness.processes import Proc, wait_until

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


def race_pairs(api: client.CoreV1Api, ns: str, pairs: Sequence[tuple[Proc, Proc]], create: Callable[[], None],
               pods: int, timeout_s: float) -> None:
    """Run ``create`` (the pods of ``ns``) while the scheduler pairs (gpufrac, kube-scheduler)
    race to bind them; wait until ``pods`` are bound, then stop every pair. A failure carries
    the pairs' logs."""
    try:
        create()
        wait_until(lambda: sum(1 for p in api.list_namespaced_pod(ns).items if p.spec.node_name) >= pods,
                   timeout_s, f"{pods} pods bound by {len(pairs)} schedulers at once", interval_s=0.5)
    except Exception:
        raise AssertionError("\n".join(f"--- {proc.name} ---\n{proc.tail(3000)}" for pair in pairs
                                       for proc in pair)) from None
    finally:
        for gpufrac, sched in pairs:
            sched.stop()
            gpufrac.stop()
