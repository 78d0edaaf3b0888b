"""What kube-scheduler does around an extender, emulated for the replay.

The replay plays kube-scheduler: it keeps the scheduler's own view of each node (CPU, memory,
pod count, ``gpufrac.io/gpu`` slots), filters with the in-tree resource fit, calls the
extender, and combines scores as ``pkg/scheduler/schedule_one.go`` does::

    total(node) = sum_p weight_p * score_p(node) + sum_e extender_score_e(node) * weight_e * 10

then picks uniformly at random among the nodes with the highest total (``selectHost``).

In-tree score plugins emulated (the rest score every openb node the same: no taints, no
affinity, no topology constraints, no images, so they cannot change the choice):

- ``NodeResourcesFit`` (``noderesources/least_allocated.go`` / ``most_allocated.go``):
  per resource ``(alloc - req) * 100 / alloc`` (least) or ``req * 100 / alloc`` (most),
  integer division, weighted mean over cpu and memory; pods requesting nothing count as
  100m CPU / 200Mi (``schedutil.DefaultMilliCPURequest``, ``DefaultMemoryRequest``).
- ``NodeResourcesBalancedAllocation`` (``balanced_allocation.go``): ``(1 - std) * 100``
  of the cpu and memory fractions after placement.

``percentageOfNodesToScore`` (``schedule_one.go`` ``numFeasibleNodesToFind``): the scheduler
stops looking after ``max(100, n * p / 100)`` feasible nodes, ``p`` adaptive
(``50 - n / 125``, at least 5) when 0, starting where the previous cycle stopped.

One cycle through the extender (``schedule_with_extender``): ``filter`` on the in-tree
survivors, ``prioritize`` unless one node is left, ``selectHost``; the candidates are sent as
names or, for an extender that is not ``nodeCacheCapable``, as Node objects (``ClusterNames``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from numpy.typing import NDArray

from benchmarks.extender_client import ExtenderClient, InProcessClient, node_object
from scoring.specs import NodeSpec

MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10
DEFAULT_MILLI_CPU = 100
DEFAULT_MEMORY_MIB = 200
MIN_FEASIBLE_NODES_TO_FIND = 100
MIN_FEASIBLE_NODES_PERCENTAGE = 5
DEFAULT_PODS_PER_NODE = 110


@dataclass(frozen=True)
class Profile:
    """The parts of a KubeSchedulerConfiguration the replay acts on."""

    extender_weight: int
    node_cache_capable: bool
    percentage_of_nodes_to_score: int
    fit_strategy: str = "LeastAllocated"
    fit_weight: int = 1
    balanced_weight: int = 1
    fit_resources: dict[str, int] = field(default_factory=lambda: {"cpu": 1, "memory": 1})
    extender_all_pods: bool = False
    """No ``managedResources``: kube-scheduler sends every pod, CPU-only ones included, to the
    extender (``HTTPExtender.IsInterested``), which then filters, scores and binds them."""

    @classmethod
    def from_file(cls, path: Path) -> Profile:
        """Read ``scheduler-config.yaml`` (first profile, first extender).

        Raises
        ------
        ValueError
            When the file has no extender or uses a scoring strategy the replay cannot emulate.
        """
        cfg: dict[str, Any] = yaml.safe_load(path.read_text())
        ext = (cfg.get("extenders") or [None])[0]
        if not ext:
            raise ValueError(f"{path}: no extenders[] entry")
        prof = (cfg.get("profiles") or [{}])[0]
        weights = {"NodeResourcesFit": 1, "NodeResourcesBalancedAllocation": 1}
        score = ((prof.get("plugins") or {}).get("score") or {})
        for entry in score.get("disabled") or []:
            if entry.get("name") in ("*", *weights):
                for name in weights if entry["name"] == "*" else [entry["name"]]:
                    weights[name] = 0
        for entry in score.get("enabled") or []:
            if entry.get("name") in weights:
                weights[entry["name"]] = int(entry.get("weight", 1))
        strategy, resources = "LeastAllocated", {"cpu": 1, "memory": 1}
        for pc in prof.get("pluginConfig") or []:
            if pc.get("name") == "NodeResourcesFit":
                ss = (pc.get("args") or {}).get("scoringStrategy") or {}
                strategy = ss.get("type", strategy)
                if ss.get("resources"):
                    resources = {r["name"]: int(r.get("weight", 1)) for r in ss["resources"]}
        if strategy not in ("LeastAllocated", "MostAllocated"):
            raise ValueError(f"{path}: replay cannot emulate scoring strategy {strategy}")
        return cls(
            extender_weight=int(ext.get("weight", 1)),
            node_cache_capable=bool(ext.get("nodeCacheCapable", False)),
            percentage_of_nodes_to_score=int(cfg.get("percentageOfNodesToScore", 0) or 0),
            fit_strategy=strategy,
            fit_weight=weights["NodeResourcesFit"],
            balanced_weight=weights["NodeResourcesBalancedAllocation"],
            fit_resources={k: v for k, v in resources.items() if k in ("cpu", "memory")},
            extender_all_pods=not ext.get("managedResources"),
        )


class SchedulerView:
    """kube-scheduler's node cache for the replay: allocatable and requested per node.

    Parameters
    ----------
    cpu_milli, memory_mib, gpu_slots : ndarray of shape (n_nodes,), int64
        Allocatable CPU, memory, and ``gpufrac.io/gpu`` (GPUs x replica slots).
    profile : Profile
    rng : numpy.random.Generator
        Tie-breaks (``selectHost``).
    """

    def __init__(self, cpu_milli: NDArray[np.int64], memory_mib: NDArray[np.int64],
                 gpu_slots: NDArray[np.int64], profile: Profile, rng: np.random.Generator) -> None:
        self.cpu_alloc = np.asarray(cpu_milli, dtype=np.int64)
        self.mem_alloc = np.asarray(memory_mib, dtype=np.int64)
        self.slot_alloc = np.asarray(gpu_slots, dtype=np.int64)
        n = self.cpu_alloc.shape[0]
        self.cpu_req = np.zeros(n, dtype=np.int64)
        self.mem_req = np.zeros(n, dtype=np.int64)
        self.nonzero_cpu = np.zeros(n, dtype=np.int64)
        self.nonzero_mem = np.zeros(n, dtype=np.int64)
        self.pods = np.zeros(n, dtype=np.int64)
        self.slots = np.zeros(n, dtype=np.int64)
        self.profile = profile
        self.rng = rng
        self.next_start = 0

    @property
    def n_nodes(self) -> int:
        """Number of nodes."""
        return int(self.cpu_alloc.shape[0])

    def feasible(self, cpu_milli: int, memory_mib: int, gpus: int) -> NDArray[np.int64]:
        """Nodes passing the in-tree fit, cut to ``numFeasibleNodesToFind`` as kube-scheduler.

        Returns
        -------
        ndarray of shape (m,), int64
            Node indices in the order kube-scheduler visits them.
        """
        ok = ((self.cpu_req + cpu_milli <= self.cpu_alloc)
              & (self.mem_req + memory_mib <= self.mem_alloc)
              & (self.pods + 1 <= DEFAULT_PODS_PER_NODE)
              & (self.slots + gpus <= np.where(gpus > 0, self.slot_alloc, np.iinfo(np.int64).max)))
        n = self.n_nodes
        want = self._num_to_find(n)
        order = np.roll(np.arange(n), -self.next_start)
        found = order[ok[order]]
        if found.shape[0] > want:
            last = int(np.flatnonzero(ok[order])[want - 1])
            self.next_start = (self.next_start + last + 1) % n
            return found[:want]
        self.next_start = self.next_start % n  # visited every node: kube-scheduler adds n
        return found

    def _num_to_find(self, n: int) -> int:
        pct = self.profile.percentage_of_nodes_to_score
        if n < MIN_FEASIBLE_NODES_TO_FIND or pct >= 100:
            return n
        if pct <= 0:
            pct = max(MIN_FEASIBLE_NODES_PERCENTAGE, 50 - n // 125)
        return max(n * pct // 100, MIN_FEASIBLE_NODES_TO_FIND)

    def in_tree_scores(self, nodes: NDArray[np.int64], cpu_milli: int, memory_mib: int) -> NDArray[np.int64]:
        """Weighted sum of the emulated in-tree score plugins on ``nodes`` (int64)."""
        p = self.profile
        cpu = self.nonzero_cpu[nodes] + (cpu_milli or DEFAULT_MILLI_CPU)
        mem = self.nonzero_mem[nodes] + (memory_mib or DEFAULT_MEMORY_MIB)
        ca, ma = self.cpu_alloc[nodes], self.mem_alloc[nodes]
        total = np.zeros(nodes.shape[0], dtype=np.int64)
        if p.fit_weight:
            parts, wsum = np.zeros(nodes.shape[0], dtype=np.int64), 0
            for name, req, alloc in (("cpu", cpu, ca), ("memory", mem, ma)):
                w = p.fit_resources.get(name, 0)
                if not w:
                    continue
                if p.fit_strategy == "LeastAllocated":
                    s = np.where(req > alloc, 0, (alloc - req) * MAX_NODE_SCORE // np.maximum(alloc, 1))
                else:
                    s = np.minimum(req, alloc) * MAX_NODE_SCORE // np.maximum(alloc, 1)
                parts += w * s
                wsum += w
            total += p.fit_weight * (parts // max(wsum, 1))
        if p.balanced_weight:
            fc = np.minimum(cpu / np.maximum(ca, 1), 1.0)
            fm = np.minimum(mem / np.maximum(ma, 1), 1.0)
            std = np.abs(fc - fm) / 2
            total += p.balanced_weight * ((1 - std) * MAX_NODE_SCORE).astype(np.int64)
        return total

    def select(self, nodes: NDArray[np.int64], totals: NDArray[np.int64]) -> int:
        """``selectHost``: a node with the top total, uniformly at random among ties."""
        top = np.flatnonzero(totals == totals.max())
        return int(nodes[top[0] if top.shape[0] == 1 else self.rng.choice(top)])

    def assume(self, node: int, cpu_milli: int, memory_mib: int, gpus: int) -> None:
        """Account a pod placed on ``node`` (kube-scheduler's assume)."""
        self._account(node, cpu_milli, memory_mib, gpus, 1)

    def release(self, node: int, cpu_milli: int, memory_mib: int, gpus: int) -> None:
        """Forget a pod that left ``node`` (the inverse of ``assume``)."""
        self._account(node, cpu_milli, memory_mib, gpus, -1)

    def _account(self, node: int, cpu_milli: int, memory_mib: int, gpus: int, sign: int) -> None:
        self.cpu_req[node] += sign * cpu_milli
        self.mem_req[node] += sign * memory_mib
        self.nonzero_cpu[node] += sign * (cpu_milli or DEFAULT_MILLI_CPU)
        self.nonzero_mem[node] += sign * (memory_mib or DEFAULT_MEMORY_MIB)
        self.pods[node] += sign
        self.slots[node] += sign * gpus


@dataclass(frozen=True)
class ClusterNames:
    """Node names in row order, and the reverse lookup, built once per replay."""

    names: list[str]
    pos: dict[str, int]
    node_objects: list[dict[str, Any]] | None

    @classmethod
    def build(cls, specs: list[NodeSpec], node_cache_capable: bool) -> ClusterNames:
        """From the cluster file's specs; Node objects only when the extender needs them."""
        names = [s.name for s in specs]
        objects = None if node_cache_capable else [node_object(s) for s in specs]
        return cls(names, {n: i for i, n in enumerate(names)}, objects)

    def args(self, pod: dict[str, Any], nodes: np.ndarray) -> dict[str, Any]:
        """``ExtenderArgs`` for these node rows (names, or full Node objects)."""
        rows = nodes.tolist()
        if self.node_objects is None:
            return {"Pod": pod, "Nodes": None, "NodeNames": [self.names[i] for i in rows]}
        return {"Pod": pod, "Nodes": {"metadata": {}, "items": [self.node_objects[i] for i in rows]},
                "NodeNames": None}


def schedule_with_extender(client: ExtenderClient | InProcessClient, view: SchedulerView, cluster: ClusterNames,
                           pod: dict[str, Any], cpu_milli: int, memory_mib: int, feasible: np.ndarray,
                           profile: Profile) -> int:
    """kube-scheduler's cycle for one pod after its in-tree filter: ``filter``, ``prioritize``
    unless one node is left, ``selectHost``; the chosen row, or -1."""
    res = client.filter(cluster.args(pod, feasible))
    if res.get("Error"):
        return -1
    if cluster.node_objects is None:
        passed = res.get("NodeNames") or []
    else:
        passed = [it["metadata"]["name"] for it in (res.get("Nodes") or {}).get("items") or []]
    if not passed:
        return -1
    nodes = np.fromiter((cluster.pos[n] for n in passed), dtype=np.int64, count=len(passed))
    if nodes.shape[0] == 1:
        return int(nodes[0])  # kube-scheduler skips scoring with one feasible node
    totals = view.in_tree_scores(nodes, cpu_milli, memory_mib)
    ext = np.zeros(view.n_nodes, dtype=np.int64)
    for h in client.prioritize(cluster.args(pod, nodes)):
        ext[cluster.pos[h["Host"]]] = h["Score"]
    scale = MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY
    return view.select(nodes, totals + ext[nodes] * profile.extender_weight * scale)
