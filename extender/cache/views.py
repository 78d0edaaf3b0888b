"""Read views of the ledger: what ``/allocations``, ``/nodes``, ``/readyz`` and ``/metrics`` show.

Pure reads; ``GpuCache`` decides when they run under its lock (``allocations``) and when
they must not wait for it (``summary``, ``metrics_view``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import islice
from typing import Any

import numpy as np

from extender.cache.ledger import Ledger
from extender.cache.records import WAITING_EXAMINED, MetricsView, PodRecord, is_pending
from extender.translate import inbound
from scoring.fit import fragmented_on
from scoring.state import ClusterState


def allocations(ledger: Ledger) -> list[dict[str, Any]]:
    """Every bound pod's allocation, for ``/allocations`` and the replay's placements.

    ``gpu_milli`` is the share the pod's record gives it; ``held_milli`` and
    ``gpu_memory_mib`` what the cache counts per GPU (less than recorded only for an
    over-commit, whose reason is in ``overcommit``; empty otherwise).
    """
    state = ledger.state
    out: list[dict[str, Any]] = []
    for rec in ledger.pods.values():
        a = rec.allocation
        if a is None:
            continue
        row = state.node_index[a.node]
        held = rec.held
        cols = [c for h in held for c in h.gpu_cols]
        out.append({
            "uid": rec.intent.uid,
            "namespace": rec.intent.namespace,
            "name": rec.intent.name,
            "node": a.node,
            "gpu_indices": [int(state.gpu_index[row, c]) for c in cols],
            "gpu_uuids": [state.gpu_uuid[row][c] for c in cols],
            "gpu_milli": a.gpu_milli if not rec.overcommit_reason else (
                rec.intent.assigned_gpu_milli or rec.intent.gpu_milli),
            "gpu_memory_mib": [m for h in held for m in h.gpu_memory_mib],
            "held_milli": [h.gpu_milli for h in held for _ in h.gpu_cols],
            "qos": a.qos.wire_name,
            "cpu_milli": a.cpu_milli,
            "memory_mib": a.memory_mib,
            "overcommit": rec.overcommit_reason,
        })
    return out


def node_inventory(state: ClusterState) -> list[dict[str, Any]]:
    """Every node's GPUs as the cache counts them, for ``/nodes`` and ``gpufrac inspect --url``.

    Parameters
    ----------
    state : ClusterState
        Read only (a copy: ``GpuCache.state_copy``).

    Returns
    -------
    list of dict
        Per node, sorted by name: ``name``, ``ready`` (a fresh, valid inventory), ``cpu_milli``,
        ``memory_mib`` (allocatable) and ``gpus``: per GPU ``index``, ``uuid``, ``model``,
        ``healthy``, ``memory_mib`` (total) and ``replicas`` (time-slicing replica slots).
    """
    out = []
    for name in sorted(state.node_names):
        r = state.node_index[name]
        gpus = [{"index": int(state.gpu_index[r, c]), "uuid": state.gpu_uuid[r][c],
                 "model": state.models[int(state.gpu_model[r, c])], "healthy": bool(state.gpu_healthy[r, c]),
                 "memory_mib": int(state.gpu_mem_total_mib[r, c]), "replicas": int(state.gpu_replicas[r, c])}
                for c in np.flatnonzero(state.gpu_exists[r]).tolist()]
        out.append({"name": name, "ready": bool(state.node_ready[r]), "cpu_milli": int(state.cpu_alloc_milli[r]),
                    "memory_mib": int(state.mem_alloc_mib[r]), "gpus": gpus})
    return out


@dataclass(frozen=True, slots=True)
class GpuRoom:
    """One GPU of a node as ``gpu_rooms`` reads it: what is free of it in the whole book
    (annotation pods and claims), and its totals."""

    index: int
    uuid: str
    healthy: bool
    free_milli: int
    memory_free_mib: int
    slots_free: int
    memory_mib: int
    replicas: int


def gpu_rooms(state: ClusterState, nodes: Iterable[str]) -> dict[str, list[GpuRoom]]:
    """Per known node of ``nodes``, its GPUs in column (index) order with what is free of each."""
    out: dict[str, list[GpuRoom]] = {}
    for name in nodes:
        r = state.node_index.get(name)
        if r is None:
            continue
        out[name] = [GpuRoom(int(state.gpu_index[r, c]), state.gpu_uuid[r][c], bool(state.gpu_healthy[r, c]),
                             int(state.gpu_free_milli[r, c]), int(state.gpu_mem_free_mib[r, c]),
                             int(state.gpu_slots_free[r, c]), int(state.gpu_mem_total_mib[r, c]),
                             int(state.gpu_replicas[r, c]))
                     for c in np.flatnonzero(state.gpu_exists[r]).tolist()]
    return out


def summary(state: ClusterState, records: list[PodRecord]) -> dict[str, int]:
    """Totals for metrics and readiness: nodes, GPUs, allocated milli, pods, over-commits."""
    return {
        "nodes": state.n_nodes,
        "gpus": int(state.gpu_exists.sum()),
        "gpu_allocated_milli": int(state.gpu_used_milli.sum()),
        "pods": len(records),
        "pods_bound": sum(1 for r in records if r.allocation is not None),
        "pods_overcommitted": sum(1 for r in records if r.overcommit_reason),
    }


def waiting_for_fragmentation(ledger: Ledger) -> int:
    """Of the oldest ``WAITING_EXAMINED`` pending GPU pods (event order), those whose request is
    free in pieces on the cluster (``scoring.fit.fragmented_on``, every node)."""
    oldest = islice((rec for rec in ledger.pods.values() if is_pending(rec)), WAITING_EXAMINED)
    return sum(fragmented_on(ledger.state, inbound.pod_request(rec.intent, ledger.state)) > 0 for rec in oldest)


def metrics_view(ledger: Ledger, count_waiting: bool = False) -> MetricsView:
    """Per-GPU allocation and per-tenant usage, copied at one instant (``MetricsView``); with
    ``count_waiting``, the pods waiting for fragmentation too."""
    s = ledger.state
    rows, cols = np.nonzero(s.gpu_exists)
    used = s.gpu_used_milli[rows, cols].tolist()
    mem = s.gpu_mem_used_mib[rows, cols].tolist()
    total = s.gpu_mem_total_mib[rows, cols].tolist()
    replicas = s.gpu_replicas[rows, cols].tolist()
    pods = s.gpu_pods[rows, cols].tolist()
    healthy = s.gpu_healthy[rows, cols].tolist()
    model = s.gpu_model[rows, cols].tolist()
    ready = s.node_ready[rows].tolist()
    gpus = [(s.node_names[r], s.gpu_uuid[r][c], s.models[model[i]] if 0 <= model[i] < len(s.models) else "",
             used[i], mem[i], total[i], replicas[i], pods[i], bool(healthy[i]), bool(ready[i]))
            for i, (r, c) in enumerate(zip(rows.tolist(), cols.tolist(), strict=True))]
    tenants = [(name, u.gpu_milli, u.gpu_memory_mib, t.quota_gpu_milli, t.quota_gpu_memory_mib)
               for name, (t, u) in sorted(ledger.tenancy.by_tenant().items())]
    return MetricsView(gpus, tenants, waiting_for_fragmentation(ledger) if count_waiting else None)
