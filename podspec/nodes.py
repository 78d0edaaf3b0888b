"""Nodes as gpufrac reads them: a Node object's allocatable CPU and memory and its
``gpufrac.io/inventory`` annotation (published by the node agent), before the heartbeat is judged."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from podspec import annotations as ann
from podspec.pods import item_name
from podspec.quantities import MAX_CORES, MAX_MEMORY_BYTES, MIB, PodSpecError, quantity, quote
from scoring.specs import GpuSpec, NodeSpec

MAX_CLOCK_SKEW_S = 300.0
"""How far in the future a heartbeat may lie for ``NodeObservation.age_s``, a reading by this
machine's clock (``gpufrac inspect``); the extender judges freshness by when it saw the
heartbeat change, not by its clock (``extender.cluster.node_reader``)."""

PLAUSIBLE_YEARS = (2000, 2200)
"""Years a heartbeat may name; any other is not a time an agent wrote (quarantined)."""


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
    flagged : tuple of (str, str)
        GPUs whose readings are impossible, as (UUID, "field: why"): kept in ``gpus`` as unhealthy,
        so nothing is placed there and the pods already there are still counted.
    created : datetime or None
        ``metadata.creationTimestamp`` (set by the API server); None when absent or
        unreadable. Decides which of two nodes listing one GPU UUID keeps it.
    labels : tuple of (str, str)
        ``metadata.labels``, sorted, at most ``MAX_LABELS`` (empty when unreadable): what a
        pod's ``nodeSelector`` is matched against by the defragmentation plan.
    """

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[GpuSpec, ...]
    heartbeat: datetime | None
    problem: str = ""
    flagged: tuple[tuple[str, str], ...] = ()
    created: datetime | None = None
    labels: tuple[tuple[str, str], ...] = ()

    def age_s(self, now: datetime) -> float | None:
        """Seconds since the heartbeat, never negative (a heartbeat up to ``MAX_CLOCK_SKEW_S``
        ahead reads 0); None without a usable inventory or with a heartbeat further ahead."""
        if self.heartbeat is None or self.problem:
            return None
        age = (now - self.heartbeat).total_seconds()
        return None if age < -MAX_CLOCK_SKEW_S else max(age, 0.0)

    def spec(self, now: datetime, stale_after_s: float) -> NodeSpec:
        """The node for the core: ready only with a valid inventory at most ``stale_after_s``
        old, and not more than ``MAX_CLOCK_SKEW_S`` in the future."""
        age = self.age_s(now)
        fresh = age is not None and age <= stale_after_s
        return NodeSpec(self.name, self.cpu_milli, self.memory_mib, self.gpus, ready=fresh)


def _judged(g: ann.GpuInventory) -> tuple[GpuSpec, str]:
    """The GPU for the core, and why its readings are impossible (``""`` when they are not):
    memory used above total, or pods using more than the GPU has. Such a GPU is unhealthy."""
    pods_used = sum(p.memory_used_mib for p in g.pods)
    why = ""
    if g.memory_used_mib > g.memory_mib:
        why = f"memory_used_mib: {g.memory_used_mib} MiB is above memory_mib {g.memory_mib} MiB"
    elif pods_used > g.memory_mib:
        why = f"pods[].memory_used_mib: {pods_used} MiB in all is above memory_mib {g.memory_mib} MiB"
    return GpuSpec(g.index, g.uuid, g.model, g.memory_mib, g.replicas, g.healthy and not why,
                   min(g.memory_used_mib, g.memory_mib)), why


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
    created = _timestamp(meta.get("creationTimestamp"))
    obs = _observation(name, meta, node.get("status"))
    return replace(obs, created=created, labels=_labels(meta.get("labels")))


MAX_LABELS = 256
"""Node labels kept; a node with more keeps none (no nodeSelector then matches it)."""


def _labels(raw: Any) -> tuple[tuple[str, str], ...]:
    """A node's labels, sorted; empty when unreadable or more than ``MAX_LABELS``."""
    if (not isinstance(raw, Mapping) or len(raw) > MAX_LABELS
            or not all(isinstance(k, str) and isinstance(v, str) and len(k) <= 317 and len(v) <= 63
                       for k, v in raw.items())):
        return ()
    return tuple(sorted(raw.items()))


def _timestamp(value: Any) -> datetime | None:
    """An RFC 3339 timestamp as a timezone-aware datetime; None when it is not one."""
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def _observation(name: str, meta: Mapping[str, Any], status: Any) -> NodeObservation:
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
    judged = [_judged(g) for g in sorted(inv.gpus, key=lambda g: g.index)]
    flagged = tuple((spec.uuid, why) for spec, why in judged if why)
    heartbeat = inv.heartbeat if inv.heartbeat.tzinfo else inv.heartbeat.replace(tzinfo=UTC)
    if not PLAUSIBLE_YEARS[0] <= heartbeat.year < PLAUSIBLE_YEARS[1]:
        return NodeObservation(name, cpu_milli, memory_mib, (), None,
                               f"{ann.INVENTORY}.heartbeat: {heartbeat.isoformat()} is not a plausible time "
                               f"(years {PLAUSIBLE_YEARS[0]}-{PLAUSIBLE_YEARS[1] - 1})")
    return NodeObservation(name, cpu_milli, memory_mib, tuple(spec for spec, _ in judged), heartbeat,
                           flagged=flagged)
