"""``NodeReader``: Node objects as gpufrac reads them, and the node specs the cache takes.

Each Node is read once per event (``podspec.nodes.node_observation``); what cannot be used
is quarantined (kind ``node``: no usable name, an unreadable inventory, an implausible
heartbeat; kind ``gpu``: impossible readings, or a UUID another node keeps, per
``extender.gpu_owners``). A spec is made from the last observation and this process's
monotonic clock, so a stale heartbeat makes the node's GPUs infeasible without a new event
(``specs``). Thread-safe: the node watch and housekeeping call it from two threads.

**Freshness by local observation.** The heartbeat is the agent's clock, not this replica's:
an inventory is as old as the time since *this process saw its heartbeat change* (as the node
lifecycle controller judges kubelet's status by its own probe time), never the heartbeat
compared with the local clock. A replica whose clock is ten minutes ahead or behind the
agents' judges them as one whose clock agrees. The difference of the two clocks when a new
heartbeat is seen is kept as the node's clock skew (``skews``, exported as
``gpufrac_clock_skew_seconds``) and logged once it passes ``CLOCK_SKEW_WARN_S``. A node first
seen (start-up, a new node) counts as fresh until ``stale_after_s`` passes without a change.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from extender.cluster.objects import object_key
from extender.gpu_owners import GpuOwners, rank
from extender.quarantine import Quarantine
from podspec import annotations as ann
from podspec.nodes import NodeObservation, node_observation
from podspec.quantities import quote
from scoring.specs import GpuSpec, NodeSpec

log = logging.getLogger(__name__)

CLOCK_SKEW_WARN_S = 30.0
"""A node whose heartbeat differs from this clock by more is logged once (module notes)."""


@dataclass(frozen=True, slots=True)
class _Heartbeat:
    """A heartbeat value as this process first saw it: when (monotonic), and the clocks' difference."""

    value: datetime
    seen_s: float
    skew_s: float


class NodeReader:
    """The last observation of every Node, and the GPU UUIDs each keeps.

    Parameters
    ----------
    quarantine : Quarantine
    now : callable returning a timezone-aware datetime
        Wall clock: only to measure the clock skew of the heartbeats (module notes).
    stale_after_s : float
        A node whose heartbeat this process has not seen change for longer is infeasible
        (``inventory stale``).
    monotonic : callable returning seconds
        This process's clock for inventory ages.
    """

    def __init__(self, quarantine: Quarantine, now: Callable[[], datetime], stale_after_s: float,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.quarantine = quarantine
        self._now = now
        self._monotonic = monotonic
        self._stale_after_s = stale_after_s
        self._beats: dict[str, _Heartbeat] = {}
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
        self._note_heartbeat(obs)
        if obs.problem and not obs.problem.startswith("no "):
            self.quarantine.reject("node", obs.name, obs.problem)
        else:
            self.quarantine.clear("node", obs.name)
            if obs.problem:
                log.info("node %s: no usable GPUs: %s", obs.name, obs.problem)
        return obs

    def _note_heartbeat(self, obs: NodeObservation) -> None:
        """Remember when this process first saw the node's heartbeat value (module notes)."""
        with self._lock:
            prev = self._beats.get(obs.name)
            if obs.heartbeat is None or obs.problem:
                self._beats.pop(obs.name, None)
                return
            if prev is not None and prev.value == obs.heartbeat:
                return
            skew = (obs.heartbeat - self._now()).total_seconds()
            self._beats[obs.name] = _Heartbeat(obs.heartbeat, self._monotonic(), skew)
        if abs(skew) > CLOCK_SKEW_WARN_S and (prev is None or abs(prev.skew_s) <= CLOCK_SKEW_WARN_S):
            log.warning("node %s: its agent's clock is %+.0f s from this replica's (heartbeat %s); "
                        "freshness is judged by when the heartbeat changes, not by either clock",
                        obs.name, skew, obs.heartbeat.isoformat())

    def _age(self, obs: NodeObservation, mono: float) -> float | None:
        """Seconds since this process saw the node's heartbeat change; None without a usable
        inventory. Under the lock."""
        beat = self._beats.get(obs.name)
        if beat is None or obs.heartbeat is None or obs.problem:
            return None
        return max(mono - beat.seen_s, 0.0)

    def skews(self) -> dict[str, float]:
        """Each node's heartbeat minus this clock when the heartbeat was last seen to change,
        seconds (positive: the agent's clock is ahead)."""
        with self._lock:
            return {name: b.skew_s for name, b in self._beats.items()}

    def labels(self) -> dict[str, tuple[tuple[str, str], ...]]:
        """Each node's labels (``NodeObservation.labels``), for the defragmentation plan."""
        with self._lock:
            return {name: o.labels for name, o in self._observations.items()}

    def _spec(self, obs: NodeObservation, mono: float) -> NodeSpec:
        """The node's spec at ``mono`` (this process's clock), without the GPUs another node
        keeps: ready only with a usable inventory seen changing within ``stale_after_s``;
        under the lock."""
        lost = self._owners.lost(obs.name)
        usable = replace(obs, gpus=tuple(g for g in obs.gpus if g.uuid not in lost)) if lost else obs
        age = self._age(obs, mono)
        return NodeSpec(usable.name, usable.cpu_milli, usable.memory_mib, usable.gpus,
                        ready=age is not None and age <= self._stale_after_s)

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
        observations = {o.name: o for o in map(self.observe, items) if o is not None}
        now = self._monotonic()
        with self._lock:
            gone = set(self._observations) - set(observations)
            for name in gone:
                self._beats.pop(name, None)
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
                self._beats.pop(removed, None)
                touched = self._owners.remove(removed)
                self._judge_gpus(removed)
        else:
            obs = self.observe(obj)
            if obs is None:
                return None, [], set()
            with self._lock:
                self._observations[obs.name] = obs
                touched = self._owners.put(obs.name, rank(obs.name, obs.created), (g.uuid for g in obs.gpus))
        now = self._monotonic()
        with self._lock:
            for name in touched:
                self._judge_gpus(name)
            specs = [self._spec(self._observations[n], now) for n in sorted(touched) if n in self._observations]
        return removed, specs, set(touched)

    def specs(self) -> list[NodeSpec]:
        """Every node's spec at this instant (housekeeping: heartbeats that went stale)."""
        now = self._monotonic()
        with self._lock:
            return [self._spec(obs, now) for obs in self._observations.values()]

    def gpus(self, node: str) -> tuple[GpuSpec, ...] | None:
        """The GPUs of ``node``'s inventory in index order, unhealthy ones included (empty
        when it has no valid inventory); None for a node not seen."""
        with self._lock:
            obs = self._observations.get(node)
        return None if obs is None else obs.gpus

    def ages(self) -> dict[str, float | None]:
        """Seconds since this process saw each node's heartbeat change (None: no valid inventory)."""
        now = self._monotonic()
        with self._lock:
            return {name: self._age(obs, now) for name, obs in self._observations.items()}
