"""One GPU UUID, one node: which node keeps a GPU that two inventories list.

A GPU UUID is unique by NVML's contract, and the core counts allocations by UUID, so two
Nodes whose ``gpufrac.io/inventory`` list the same UUID (a cloned VM image, a copied
inventory, an agent bug) cannot both be believed. The rule, the same on every replica
because it reads only the Node objects:

- The **older Node object keeps the GPU** (``metadata.creationTimestamp``, which the API
  server sets; ties, and nodes without a readable one, by name, a missing time last). A
  clone or a copied inventory appears on the newer node, while the pods already placed
  on the GPU were placed on the older one and stay counted there.
- The newer node **loses that GPU** (its other GPUs, CPU and memory stay usable) and the
  conflict is quarantined (kind ``gpu``, ``node/UUID``) until one of the two inventories
  stops listing it or one node is deleted; then the GPU is usable again where it is listed.

``GpuOwners`` keeps the index incrementally: a node event costs the UUIDs of that node and
of the nodes sharing one with it, never a pass over the cluster.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

Rank = tuple[int, float, str]
"""Sort key of a node: (0 with a creation time, else 1; the time in seconds since the
epoch; the name)."""


def rank(name: str, created: datetime | None) -> Rank:
    """The order in which nodes keep a shared UUID: older first (compared as instants,
    whatever UTC offset the timestamps carry), then by name."""
    if created is None:
        return (1, 0.0, name)
    return (0, created.timestamp(), name)


class GpuOwners:
    """UUID -> nodes listing it, and which of them keeps it. Not thread-safe (the node
    watch's thread owns it, under its observation lock)."""

    def __init__(self) -> None:
        self._listed_by: dict[str, set[str]] = {}
        self._uuids: dict[str, tuple[str, ...]] = {}
        self._rank: dict[str, Rank] = {}

    def put(self, name: str, node_rank: Rank, uuids: Iterable[str]) -> set[str]:
        """Record that ``name`` lists ``uuids`` now; the nodes whose usable GPUs may have
        changed (``name`` and every node sharing a UUID with its old or new list)."""
        touched = self.remove(name)
        new = tuple(uuids)
        self._uuids[name] = new
        self._rank[name] = node_rank
        for u in new:
            holders = self._listed_by.setdefault(u, set())
            holders.add(name)
            touched |= holders
        touched.add(name)
        return touched

    def remove(self, name: str) -> set[str]:
        """Forget ``name``; the other nodes that shared a UUID with it."""
        touched: set[str] = set()
        for u in self._uuids.pop(name, ()):
            holders = self._listed_by.get(u)
            if holders is None:
                continue
            holders.discard(name)
            if holders:
                touched |= holders
            else:
                del self._listed_by[u]
        self._rank.pop(name, None)
        return touched

    def clear(self) -> None:
        """Forget every node (before a relist)."""
        self._listed_by.clear()
        self._uuids.clear()
        self._rank.clear()

    def lost(self, name: str) -> dict[str, str]:
        """UUIDs ``name`` lists that another node keeps: UUID -> the node that keeps it."""
        out: dict[str, str] = {}
        for u in self._uuids.get(name, ()):
            holders = self._listed_by[u]
            if len(holders) > 1:
                keeper = min(holders, key=self._rank.__getitem__)
                if keeper != name:
                    out[u] = keeper
        return out
