"""The invariant checker over the API's state, for the end-to-end tests and the soak benchmark."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from kubernetes import client


def check_invariants(api: client.CoreV1Api, claims: Iterable[Mapping[str, Any]] = ()) -> list[str]:
    """Check gpufrac's allocations as recorded in the API (independently of gpufrac's cache).

    ``claims``: ResourceClaim objects; each allocation result of gpufrac's DRA driver counts on
    its GPU (pool = node, device ``gpu-<index>``) as a pod would: its ``consumedCapacity`` share
    and memory, one replica slot.

    Per GPU (from each node's published inventory): the sum of ``assigned-fraction`` over
    the pods bound to it <= 1000 milli, the sum of ``assigned-memory`` <= its memory, at most
    ``replicas`` pods; every bound pod with ``gpufrac.io/gpu`` has exactly that many assigned
    GPUs, all on its own node; a whole-GPU pod shares its GPUs with no one.

    A node whose inventory annotation does not parse (a fault injected on purpose) is
    skipped with its pods.

    Returns
    -------
    list of str
        One line per violation; empty when all hold.
    """
    import json
    from decimal import Decimal

    from kubernetes.utils.quantity import parse_quantity

    gpus: dict[str, dict[str, Any]] = {}
    unreadable: set[str] = set()  # an inventory made invalid on purpose: its pods are not judged
    for node in api.list_node().items:
        raw = (node.metadata.annotations or {}).get("gpufrac.io/inventory")
        if raw:
            try:
                listed = json.loads(raw)["gpus"]
            except (ValueError, KeyError, TypeError):
                unreadable.add(node.metadata.name)
                continue
            for g in listed:
                gpus[g["uuid"]] = {**g, "node": node.metadata.name}
    share: dict[str, int] = defaultdict(int)
    memory: dict[str, int] = defaultdict(int)
    pods_on: dict[str, list[str]] = defaultdict(list)
    whole: set[str] = set()
    problems = []
    for pod in api.list_pod_for_all_namespaces().items:
        if not pod.spec.node_name or pod.status.phase in ("Succeeded", "Failed") or pod.spec.node_name in unreadable:
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
    by_device = {(g["node"], f"gpu-{g['index']}"): u for u, g in gpus.items()}
    for obj in claims:
        key = f"claim {obj['metadata']['namespace']}/{obj['metadata']['name']}"
        results = (((obj.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
        for r in results:
            if r.get("driver") != "gpu.gpufrac.io":
                continue
            u = by_device.get((r["pool"], r["device"]))
            if u is None:
                problems.append(f"{key}: device {r['device']} is no GPU of node {r['pool']}")
                continue
            consumed = r.get("consumedCapacity") or {}
            share[u] += int(parse_quantity(consumed.get("share", "1000")))
            memory[u] += int(parse_quantity(consumed.get("memory", "0")) / (1024 * 1024))
            pods_on[u].append(key)
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
