"""Nodes as gpufrac reads them: a Node object's allocatable CPU and memory and its
``gpufrac.io/inventory`` annotation (published by the node agent), before the heartbeat is judged."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from podspec import annotations as ann
from podspec.pods import MAX_CORES, MAX_MEMORY_BYTES, MIB, PodSpecError, item_name, quantity, quote
from scoring.state import GpuSpec, NodeSpec


@dataclass(frozen=True, slots=True)
class NodeObservation:
    """A Node object as gpufrac needs it, before the heartbeat is judged.

    Attributes
    ----------
    name : str
    cpu_milli, memory_mib : int
        ``status.allocatable`` cpu (milli-cores) and memory (MiB).
    gpus : tuple of GpuSpec
        From the ``gpufrac.io/inventory`` annotation, in index order; empty when absent or
        invalid.
    heartbeat : datetime or None
        The inventory's heartbeat (timezone-aware); None when absent or invalid.
    problem : str
        Why the inventory is unusable (``""`` when it is fine), for logs.
    """

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[GpuSpec, ...]
    heartbeat: datetime | None
    problem: str = ""

    def spec(self, now: datetime, stale_after_s: float) -> NodeSpec:
        """The node for the core: ready only with a valid inventory at most ``stale_after_s`` old."""
        fresh = (self.heartbeat is not None and not self.problem
                 and (now - self.heartbeat).total_seconds() <= stale_after_s)
        return NodeSpec(self.name, self.cpu_milli, self.memory_mib, self.gpus, ready=fresh)


def node_observation(node: Mapping[str, Any]) -> NodeObservation:
    """Parse a Node object (API JSON, from the node watch).

    CPU and memory come from ``status.allocatable``; the GPUs from the ``gpufrac.io/inventory``
    annotation. An invalid inventory does not raise: the node keeps its CPU and memory (CPU-only
    pods still count there) and gets no usable GPUs, with the reason in ``problem``.

    Raises
    ------
    ValueError
        When the Node has no name.
    """
    name = item_name(node)
    if name is None:
        raise ValueError("Node.metadata.name: missing")
    meta = node["metadata"]
    status = node.get("status")
    alloc = (status.get("allocatable") if isinstance(status, Mapping) else None) or {}
    annotations = meta.get("annotations") or {}
    if not isinstance(alloc, Mapping) or not isinstance(annotations, Mapping):
        return NodeObservation(name, 0, 0, (), None, "status.allocatable and metadata.annotations: must be objects")
    try:
        cpu_milli = math.floor(quantity(alloc.get("cpu", "0"), "cpu",
                                         maximum=MAX_CORES, unit=" cores") * 1000)
        memory_mib = math.floor(quantity(alloc.get("memory", "0"), "memory",
                                          maximum=MAX_MEMORY_BYTES, unit=" bytes") / MIB)
    except PodSpecError as exc:
        return NodeObservation(name, 0, 0, (), None, f"status.allocatable.{exc}")
    raw = annotations.get(ann.INVENTORY)
    if raw is None:
        return NodeObservation(name, cpu_milli, memory_mib, (), None, f"no {ann.INVENTORY} annotation")
    if not isinstance(raw, str):
        return NodeObservation(name, cpu_milli, memory_mib, (), None, f"{ann.INVENTORY}: must be a string")
    try:
        inv = ann.parse_inventory(raw)
    except ValueError as exc:
        return NodeObservation(name, cpu_milli, memory_mib, (), None, str(exc))
    if inv.node != name:
        return NodeObservation(name, cpu_milli, memory_mib, (), None,
                               f"{ann.INVENTORY}: published for node {quote(inv.node)}")
    gpus = tuple(GpuSpec(g.index, g.uuid, g.model, g.memory_mib, g.replicas, g.healthy,
                         g.memory_used_mib)
                 for g in sorted(inv.gpus, key=lambda g: g.index))
    heartbeat = inv.heartbeat if inv.heartbeat.tzinfo else inv.heartbeat.replace(tzinfo=UTC)
    return NodeObservation(name, cpu_milli, memory_mib, gpus, heartbeat)
