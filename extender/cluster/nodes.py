"""``NodeReader``: Node objects as gpufrac reads them, and the node specs the cache takes.

Each Node is read once per event (``podspec.nodes.node_observation``); what cannot be used
is quarantined (kind ``node``: no usable name, an unreadable inventory, a heartbeat from the
future; kind ``gpu``: impossible readings, or a UUID another node keeps, per
``extender.gpu_owners``). A spec is made from the last observation and the clock, so a
stale heartbeat makes the node's GPUs infeasible without a new event (``specs``).
Thread-safe: the node watch and housekeeping call it from two threads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from extender.cluster.objects import object_key
from extender.gpu_owners import GpuOwners, rank
from extender.quarantine import Quarantine
from podspec import annotations as ann
from podspec.nodes import MAX_CLOCK_SKEW_S, NodeObservation, node_observation
from podspec.pods import quote
from scoring.state import NodeSpec

log = logging.getLogger(__name__)


class NodeReader:
    """The last observation of every Node, and the GPU UUIDs each keeps.

    Parameters
    ----------
    quarantine : Quarantine
    now : callable returning a timezone-aware datetime
        Wall clock for heartbeat ages.
    stale_after_s : float
        A node whose inventory heartbeat is older is infeasible (``inventory stale``).
    """

    def __init__(self, quarantine: Quarantine, now: Callable[[], datetime], stale_after_s: float) -> None:
        self.quarantine = quarantine
        self._now = now
        self._stale_after_s = stale_after_s
        self._observations: dict[str, NodeObservation] = {}
        self._owners = GpuOwners()
        self._flagged_gpus: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def observe(self, obj: Mapping[str, Any]) -> NodeObservation | None:
        """The node as gpufrac reads it; None (quarantined) when it has no usable name.

        An unusable inventory, or a heartbeat more than ``MAX_CLOCK_SKEW_S`` ahead of this
        clock, quarantines the node (kind ``node``); it keeps its CPU and memory and takes
        no GPU pod.
        """
        try:
            obs = node_observation(obj)
        except ValueError as exc:
            self.quarantine.reject("node", object_key(obj, namespaced=False), str(exc))
            return None
        if obs.heartbeat is not None and not obs.problem and obs.age_s(self._now()) is None:
            obs = replace(obs, problem=f"{ann.INVENTORY}.heartbeat: {obs.heartbeat.isoformat()} is more than "
                                       f"{MAX_CLOCK_SKEW_S:.0f} s ahead of this clock")
        if obs.problem and not obs.problem.startswith("no "):
            self.quarantine.reject("node", obs.name, obs.problem)
        else:
            self.quarantine.clear("node", obs.name)
            if obs.problem:
                log.info("node %s: no usable GPUs: %s", obs.name, obs.problem)
        return obs

    def labels(self) -> dict[str, tuple[tuple[str, str], ...]]:
        """Each node's labels (``NodeObservation.labels``), for the defragmentation plan."""
        with self._lock:
            return {name: o.labels for name, o in self._observations.items()}

    def _spec(self, obs: NodeObservation, now: datetime) -> NodeSpec:
        """The node's spec at ``now``, without the GPUs another node keeps; under the lock."""
        lost = self._owners.lost(obs.name)
        usable = replace(obs, gpus=tuple(g for g in obs.gpus if g.uuid not in lost)) if lost else obs
        return usable.spec(now, self._stale_after_s)

    def _judge_gpus(self, name: str) -> None:
        """Quarantine ``name``'s GPUs with impossible readings or a UUID another node keeps
        (kind ``gpu``, key ``node/UUID``), and clear its entries that no longer hold; under
        the lock."""
        obs = self._observations.get(name)
        entries: dict[str, str] = {}
        if obs is not None:
            field = f"{ann.INVENTORY}.gpus"
            for uuid, why in obs.flagged:
                entries[f"{name}/{uuid}"] = f"{field}[{quote(uuid)}].{why}; the GPU takes no pods"
            for uuid, keeper in self._owners.lost(name).items():
                entries[f"{name}/{uuid}"] = (
                    f"{field}[{quote(uuid)}].uuid: also listed by node {quote(keeper)}, which keeps it "
                    f"(the older Node); not usable on this node until one of the two stops listing it")
        for key in self._flagged_gpus.pop(name, set()) - entries.keys():
            self.quarantine.clear("gpu", key)
        for key, message in entries.items():
            self.quarantine.reject("gpu", key, message)
        if entries:
            self._flagged_gpus[name] = set(entries)

    def relist(self, items: Sequence[Any]) -> list[NodeSpec]:
        """A full Node list: every node's spec (what ``GpuCache.set_nodes`` takes)."""
        now = self._now()
        observations = {o.name: o for o in map(self.observe, items) if o is not None}
        with self._lock:
            gone = set(self._observations) - set(observations)
            self._observations = observations
            self._owners.clear()
            for o in observations.values():
                self._owners.put(o.name, rank(o.name, o.created), (g.uuid for g in o.gpus))
            for name in set(observations) | set(self._flagged_gpus):
                self._judge_gpus(name)
            specs = [self._spec(o, now) for o in observations.values()]
        # Nodes deleted while the watch was down are no longer quarantined.
        self.quarantine.retain("node", {object_key(obj, namespaced=False) for obj in items})
        if gone:
            log.info("relist: %d nodes gone", len(gone))
        return specs

    def apply(self, kind: str, obj: Mapping[str, Any]) -> tuple[str | None, list[NodeSpec], set[str]]:
        """One node watch event: the node removed (its name, or None), the specs of the nodes
        it touched (itself and those sharing a GPU UUID with it), and their names."""
        removed: str | None = None
        if kind == "DELETED":
            removed = object_key(obj, namespaced=False)
            self.quarantine.clear("node", removed)
            with self._lock:
                self._observations.pop(removed, None)
                touched = self._owners.remove(removed)
                self._judge_gpus(removed)
        else:
            obs = self.observe(obj)
            if obs is None:
                return None, [], set()
            with self._lock:
                self._observations[obs.name] = obs
                touched = self._owners.put(obs.name, rank(obs.name, obs.created), (g.uuid for g in obs.gpus))
        now = self._now()
        with self._lock:
            for name in touched:
                self._judge_gpus(name)
            specs = [self._spec(self._observations[n], now) for n in sorted(touched) if n in self._observations]
        return removed, specs, set(touched)

    def specs(self) -> list[NodeSpec]:
        """Every node's spec at this instant (housekeeping: heartbeats that went stale)."""
        now = self._now()
        with self._lock:
            return [self._spec(obs, now) for obs in self._observations.values()]

    def ages(self) -> dict[str, float | None]:
        """Seconds since each node's inventory heartbeat (None: no valid inventory)."""
        now = self._now()
        with self._lock:
            return {name: obs.age_s(now) for name, obs in self._observations.items()}
