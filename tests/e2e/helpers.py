"""Builders and the invariant checker for the end-to-end tests."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from kubernetes import client

from tests.harness.controlplane import add_fake_node, fake_node_gpus

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


def check_invariants(api: client.CoreV1Api) -> list[str]:
    """Check gpufrac's allocations as recorded in the API (independently of gpufrac's cache).

    Per GPU (from each node's published inventory): the sum of ``assigned-fraction`` over
    the pods bound to it <= 1000 milli, the sum of ``assigned-memory`` <= its memory, at most
    ``replicas`` pods; every bound pod with ``gpufrac.io/gpu`` has exactly that many assigned
    GPUs, all on its own node; a whole-GPU pod shares its GPUs with no one.

    Returns
    -------
    list of str
        One line per violation; empty when all hold.
    """
    import json
    from decimal import Decimal

    from kubernetes.utils.quantity import parse_quantity

    gpus: dict[str, dict[str, Any]] = {}
    for node in api.list_node().items:
        raw = (node.metadata.annotations or {}).get("gpufrac.io/inventory")
        if raw:
            for g in json.loads(raw)["gpus"]:
                gpus[g["uuid"]] = {**g, "node": node.metadata.name}
    share: dict[str, int] = defaultdict(int)
    memory: dict[str, int] = defaultdict(int)
    pods_on: dict[str, list[str]] = defaultdict(list)
    whole: set[str] = set()
    problems = []
    for pod in api.list_pod_for_all_namespaces().items:
        if not pod.spec.node_name or pod.status.phase in ("Succeeded", "Failed"):
            continue
        k = sum(int((c.resources.limits or {}).get("gpufrac.io/gpu", 0)) for c in pod.spec.containers)
        if k == 0:
            continue
        key = f"{pod.metadata.namespace}/{pod.metadata.name}"
        ann = pod.metadata.annotations or {}
        uuids = [u for u in ann.get("gpufrac.io/assigned-gpus", "").split(",") if u]
        if len(uuids) != k:
            problems.append(f"{key}: {len(uuids)} assigned GPUs for gpufrac.io/gpu {k}")
            continue
        milli = int(Decimal(ann["gpufrac.io/assigned-fraction"]) * 1000)
        mems = [int(parse_quantity(m) / (1024 * 1024)) for m in ann["gpufrac.io/assigned-memory"].split(",")]
        for u, m in zip(uuids, mems, strict=True):
            g = gpus.get(u)
            if g is None or g["node"] != pod.spec.node_name:
                problems.append(f"{key}: GPU {u} is not on its node {pod.spec.node_name}")
                continue
            share[u] += milli
            memory[u] += m
            pods_on[u].append(key)
            if milli == 1000:
                whole.add(u)
    for u, g in gpus.items():
        if share[u] > 1000:
            problems.append(f"GPU {u} on {g['node']}: {share[u]} milli > 1000")
        if memory[u] > g["memory_mib"]:
            problems.append(f"GPU {u} on {g['node']}: {memory[u]} MiB > {g['memory_mib']}")
        if len(pods_on[u]) > g.get("replicas", 1):
            problems.append(f"GPU {u} on {g['node']}: {len(pods_on[u])} pods > {g['replicas']} replicas")
        if u in whole and len(pods_on[u]) > 1:
            problems.append(f"GPU {u} on {g['node']}: whole-GPU pod shares it with {pods_on[u]}")
    return problems
