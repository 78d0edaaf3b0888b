"""The defragmentation plan's search (``extender.cache.defrag``): for one waiting pod, the
target node, the fewest running pods to move off it, and where each of them fits instead;
on a scratch copy of the arrays that the plan's steps change as they are found.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from extender.cache.records import PodRecord
from extender.cache.victims import fewest_victims, fits_without
from extender.translate import inbound
from podspec.pods import PodIntent
from scoring.evaluated import Evaluation
from scoring.fit import ClusterTerms, fit
from scoring.memo import Memo
from scoring.request import MILLI_PER_GPU, PodRequest
from scoring.scorer import Scorer
from scoring.specs import Allocation
from scoring.state import ClusterState

MAX_TARGETS_PER_POD = 16
"""Target nodes tried per waiting pod."""
MAX_CANDIDATES_PER_NODE = 16
"""Running pods considered for moving off one target node (the lowest classes first)."""
MAX_TRIES = 256
"""Fit checks of the exact victim search per target node (then the greedy set)."""
MOVABLE_KINDS = frozenset({"ReplicaSet", "StatefulSet", "Job", "ReplicationController"})
"""Controllers that recreate an evicted pod, which kube-scheduler then places anew. Not a
DaemonSet's pod (it comes back to the same node), nor a bare or static pod (it never comes back)."""


Labels = Mapping[str, tuple[tuple[str, str], ...]]


@dataclass(frozen=True, slots=True)
class DisruptionBudget:
    """A PodDisruptionBudget as the plan counts it.

    Attributes
    ----------
    key : str
        ``namespace/name``.
    allowed : int
        Disruptions it allows now (``status.disruptionsAllowed``; 0 while the disruption
        controller has not processed its generation, as the Eviction API counts it).
    pods : frozenset of str
        UIDs of the pods it covers.
    """

    key: str
    allowed: int
    pods: frozenset[str]


@dataclass(frozen=True, slots=True)
class Move:
    """A running pod to evict so that its controller recreates it elsewhere.

    Attributes
    ----------
    uid, pod : str
        The pod (``pod``: ``namespace/name``).
    node : str
        Where it runs now (the step's target).
    qos : str
        Its QoS class (wire name).
    priority : int
    gpu_milli : int
        Share it holds, milli-GPU (summed over its GPUs).
    fits_on : str
        A node where it fits once the plan's earlier moves are made (the scorer's best).
    controller : str
        ``Kind/name`` of what recreates it.
    budgets : tuple of str
        The PodDisruptionBudgets covering it (``namespace/name``).
    """

    uid: str
    pod: str
    node: str
    qos: str
    priority: int
    gpu_milli: int
    fits_on: str
    controller: str
    budgets: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Step:
    """Room for one waiting pod: its target node and the moves that free it."""

    uid: str
    pod: str
    node: str
    gpu_count: int
    gpu_milli: int
    moves: tuple[Move, ...]


def node_selector_matches(selector: tuple[tuple[str, str], ...], labels: tuple[tuple[str, str], ...]) -> bool:
    """Whether every ``nodeSelector`` entry is among the node's labels."""
    return not selector or set(selector) <= set(labels)


def allowed_nodes(state: ClusterState, node_labels: Labels, selector: tuple[tuple[str, str], ...]) -> np.ndarray:
    """The ready nodes a pod with ``selector`` may use, bool of shape (n_nodes,); a node whose
    labels are unknown matches only an empty selector."""
    rows = state.node_ready.copy()
    if selector:
        for r, name in enumerate(state.node_names):
            rows[r] &= node_selector_matches(selector, node_labels.get(str(name), ()))
    return rows


class MoveSearch:
    """The plan's working state: the scratch arrays, the movable pods per node, the budgets
    left, the nodes already targeted."""

    def __init__(self, state: ClusterState, scorer: Scorer, node_labels: Labels, deadline: float) -> None:
        self.state = state
        self.scorer = scorer
        self.labels = node_labels
        self.deadline = deadline
        self.left: dict[str, int] = {}
        self.budgets_of: dict[str, list[str]] = {}
        self.on_node: dict[str, list[tuple[str, PodRecord]]] = {}
        self.targeted: set[int] = set()
        self._terms: ClusterTerms | None = None
        self._memo = Memo()
        self._fits_now: dict[tuple[PodRequest, tuple[tuple[str, str], ...]], np.ndarray] = {}
        self._allowed_rows: dict[tuple[tuple[str, str], ...], np.ndarray] = {}

    def set_budgets(self, budgets: Sequence[DisruptionBudget]) -> None:
        """The PodDisruptionBudgets the moves must respect (before the first ``step``)."""
        self.left = {b.key: max(0, b.allowed) for b in budgets}
        self.budgets_of = {}
        for b in budgets:
            for uid in b.pods:
                self.budgets_of.setdefault(uid, []).append(b.key)

    def add_running(self, uid: str, rec: PodRecord) -> None:
        """Index a pod that may be moved (module notes: what may move, bar class and priority)."""
        i = rec.intent
        if (rec.allocation is None or rec.assumed_until is not None or rec.overcommit_reason
                or not i.gpu_count or i.finished or i.placement_rules
                or i.controller.split("/", 1)[0] not in MOVABLE_KINDS):
            return
        self.on_node.setdefault(rec.allocation.node, []).append((uid, rec))

    def allowed_rows(self, selector: tuple[tuple[str, str], ...]) -> np.ndarray:
        """Rows of the ready nodes a pod with ``selector`` may use, bool of shape (n_nodes,)."""
        rows = self._allowed_rows.get(selector)
        if rows is None:
            rows = self._allowed_rows[selector] = allowed_nodes(self.state, self.labels, selector)
        return rows

    def step(self, uid: str, intent: PodIntent, request: PodRequest) -> tuple[Step | None, str]:
        """The best step for one waiting pod, applied to the scratch state; or None and why."""
        if intent.placement_rules:
            return None, "it has placement rules gpufrac does not evaluate (affinity, topology spread)"
        s = self.state
        k = request.gpu_count
        ok = self.allowed_rows(intent.node_selector).copy()
        for r in self.targeted:
            ok[r] = False
        usable = s.gpu_exists & s.gpu_healthy
        if request.allowed_models is not None:
            usable &= np.isin(s.gpu_model, np.fromiter(request.allowed_models, dtype=np.int64))
        ok &= (usable.sum(axis=1) >= k) & (s.cpu_alloc_milli >= request.cpu_milli) & (s.mem_alloc_mib >= request.memory_mib)
        has_movable = np.zeros(s.n_nodes, dtype=bool)
        for name, pods in self.on_node.items():
            row = s.node_index.get(name)
            if row is not None and pods:
                has_movable[row] = True
        ok &= has_movable
        if not ok.any():
            return None, "no node it may use has pods that can be moved (controller-owned, no placement rules)"
        # The least share to move off a node for the pod to fit there (its k GPUs with the
        # smallest shortfall), and the free share elsewhere the moved pods need at least that
        # much of: a node failing that bound cannot work (the cheap prune before any search).
        free_all = np.where(s.gpu_exists & s.gpu_healthy & s.node_ready[:, None],
                            MILLI_PER_GPU - s.gpu_used_milli, 0).clip(0)
        short = np.where(usable, np.maximum(request.gpu_milli - free_all, 0), np.iinfo(np.int64).max // 16)
        need = np.sort(short, axis=1)[:, :k].sum(axis=1) if k <= short.shape[1] else np.zeros(s.n_nodes, np.int64)
        ok &= need <= int(free_all.sum()) - free_all.sum(axis=1)
        if not ok.any():
            return None, "the share it needs freed exceeds the free share on the other nodes"
        targets = np.flatnonzero(ok)
        targets = targets[np.lexsort((targets, need[targets]))][:MAX_TARGETS_PER_POD]
        best: tuple[tuple[int, int, int], list[tuple[str, PodRecord]]] | None = None
        why = ("no set of movable pods (of its QoS class or lower, no higher priority, each fitting on "
               "another node) frees a node for it")
        for t in targets.tolist():
            if time.monotonic() > self.deadline:
                break
            if best is not None and best[0][0] == 1 and need[t] >= best[0][1]:
                break  # one move already, and every later node needs at least as much share moved
            victims = self._victims(intent, request, t)
            if not victims:
                continue
            placed = self._place(request, t, victims)
            if placed is None:
                why = "the pods that would free a node for it do not all fit elsewhere together"
                continue
            self._undo(placed)
            rank = (len(victims), sum(r.gpu_milli_held for _, r in victims), t)
            if best is None or rank < best[0]:
                best = (rank, victims)
        if best is None:
            return None, why
        row = best[0][2]
        victims = best[1]
        placed = self._place(request, row, victims)
        assert placed is not None  # the same scratch state as the trial: the same answer
        self.targeted.add(row)
        self._terms = None  # the step changed the arrays: the next step scores on fresh terms
        self._fits_now.clear()
        node = str(s.node_names[row])
        moved = {u for u, _ in victims}
        self.on_node[node] = [(u, r) for u, r in self.on_node[node] if u not in moved]
        moves = []
        for (vuid, rec), dest in zip(victims, placed[1], strict=True):
            for budget in self.budgets_of.get(vuid, ()):
                self.left[budget] -= 1
            moves.append(Move(vuid, rec.intent.key, node, rec.intent.qos.wire_name, rec.intent.priority,
                              rec.gpu_milli_held, dest, rec.intent.controller,
                              tuple(self.budgets_of.get(vuid, ()))))
        return Step(uid, intent.key, node, request.gpu_count, request.gpu_milli, tuple(moves)), ""

    def _victims(self, intent: PodIntent, request: PodRequest, row: int) -> list[tuple[str, PodRecord]]:
        """The fewest movable pods on ``row`` whose removal makes ``request`` fit there."""
        s = self.state
        node = str(s.node_names[row])
        eligible = sorted(
            ((u, r) for u, r in self.on_node.get(node, ())
             if r.intent.qos >= intent.qos and r.intent.priority <= intent.priority
             and all(self.left.get(b, 0) > 0 for b in self.budgets_of.get(u, ()))
             and self._fits_elsewhere(r.intent, row)),
            key=lambda ur: (-ur[1].intent.qos, ur[1].intent.priority, ur[1].gpu_milli_held, ur[0]))
        eligible = eligible[:MAX_CANDIDATES_PER_NODE]
        if not eligible:
            return []
        fits = fits_without(s.rows_copy(np.array([row], dtype=np.int64)), request, self.scorer.qos_policy, eligible)

        def fits_within_budgets(victims: Sequence[tuple[str, PodRecord]]) -> bool:
            per_budget: dict[str, int] = {}
            for u, _ in victims:
                for b in self.budgets_of.get(u, ()):
                    per_budget[b] = per_budget.get(b, 0) + 1
            if any(n > self.left.get(b, 0) for b, n in per_budget.items()):
                return False  # two moves under one budget that allows one
            return fits(victims)

        chosen = set(fewest_victims(eligible, fits_within_budgets, MAX_TRIES, self.deadline))
        return [(u, r) for u, r in eligible if u in chosen]

    def _place(self, request: PodRequest, row: int, victims: Sequence[tuple[str, PodRecord]]
               ) -> tuple[list[tuple[Allocation, int]], list[str]] | None:
        """Apply a step to the scratch state: the victims off ``row``, the waiting pod on it,
        each victim on its best other node (largest first). Returns what was applied (for
        ``_undo``) and each victim's node, in ``victims`` order; None (nothing left applied)
        when a victim fits nowhere else."""
        s = self.state
        applied: list[tuple[Allocation, int]] = []

        def apply(alloc: Allocation, sign: int) -> None:
            s.apply(alloc, sign)
            applied.append((alloc, sign))

        for _, rec in victims:
            for alloc in rec.held:
                apply(alloc, -1)
        ev = self._evaluate(request, np.array([row], dtype=np.int64))
        if not ev.node_fits[0]:
            self._undo((applied, []))
            return None
        node = str(s.node_names[row])
        apply(inbound.allocation(request, node, tuple(int(c) for c in ev.chosen_cols[0]), request.gpu_milli,
                                 tuple(int(m) for m in ev.chosen_mem_mib[0])), 1)
        dest: dict[str, str] = {}
        for uid, rec in sorted(victims, key=lambda ur: (-ur[1].gpu_milli_held, ur[0])):
            vreq = inbound.pod_request(rec.intent, s)
            allowed = self.allowed_rows(rec.intent.node_selector).copy()
            allowed[row] = False
            for r in self.targeted:
                allowed[r] = False
            rows = np.flatnonzero(allowed).astype(np.int64)
            vev = self._evaluate(vreq, rows) if rows.shape[0] else None
            best = -1 if vev is None else vev.best()
            if vev is None or best < 0:
                self._undo((applied, []))
                return None
            to = str(s.node_names[int(vev.rows[best])])
            apply(inbound.allocation(vreq, to, tuple(int(c) for c in vev.chosen_cols[best]), vreq.gpu_milli,
                                     tuple(int(m) for m in vev.chosen_mem_mib[best])), 1)
            dest[uid] = to
        return applied, [dest[u] for u, _ in victims]

    def _fits_elsewhere(self, intent: PodIntent, row: int) -> bool:
        """Whether the pod fits, as the arrays are at the start of this step, on a node its
        selector matches other than ``row`` and the nodes already targeted: a necessary
        condition of its move (a step only takes room elsewhere), kept per pod shape."""
        request = inbound.pod_request(intent, self.state)
        key = (request, intent.node_selector)
        fits = self._fits_now.get(key)
        if fits is None:
            rows = np.arange(self.state.n_nodes, dtype=np.int64)
            fits = fit(self.state, request, rows, self.scorer.qos_policy).node_fits & self.allowed_rows(intent.node_selector)
            self._fits_now[key] = fits
        others = int(fits.sum()) - int(fits[row]) - sum(int(fits[r]) for r in self.targeted)
        return others > 0

    def _evaluate(self, request: PodRequest, rows: np.ndarray) -> Evaluation:
        """``Scorer.evaluate`` with the cluster-wide terms of the scratch state as the current
        step found it (computed once per step: the trials' own changes are a few pods, well
        within what ``scoring.incremental`` lets the terms drift by)."""
        if self._terms is None:
            self._terms = self.scorer.cluster_terms(self.state, self._memo)
        return self.scorer.evaluate(self.state, request, rows, terms=self._terms, memo=self._memo)

    def _undo(self, placed: tuple[list[tuple[Allocation, int]], list[str]]) -> None:
        """Take back what ``_place`` applied, last first."""
        applied = placed[0]
        while applied:
            alloc, sign = applied.pop()
            self.state.apply(alloc, -sign)
