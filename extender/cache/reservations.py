"""Starvation protection: a node held for a GPU pod that has waited too long (issue 41).

Packing fills each hole a leaving pod opens with whichever pod comes next, so a pod that needs
much room at once (several whole GPUs) can wait behind a stream of small pods until that much
room frees on one node by chance. Once a pending GPU pod has waited ``reserve_after_s`` (by
gpufrac's own clock, from when its cache first saw it pending: pod timestamps are not trusted)
and waits for fragmentation, not capacity (the GPUs it may use have at least its request free
in sum), ``reserve`` (housekeeping) holds one node for it: a node on which it would fit were the node
empty (its ``nodeSelector`` matches the node's labels; GPU count and models, health,
allocatable CPU and memory), the one with the least GPU
share to drain on the GPUs it would use; ties go to the lowest row (deterministic). While the
reservation stands, ``evaluate`` takes the node out of every other pod's candidates (filter
names it in ``FailedNodes``), so the pods on it drain it as they end and nothing refills it;
the waiting pod is placed by its next retry, on that node or any other that fits it. Oldest
waiting pod first, at most ``max_reserved_nodes`` at once; a reservation ends when its pod is
bound or deleted, or after ``reservation_ttl_s`` (the pod may not fit even an empty node in
kube-scheduler's eyes: taints, affinity).

What it costs: the reserved node's free room is idle while it drains. So no node is held while
the pods that have waited ``reserve_after_s`` ask, in sum, for more GPU share than is free
(``StarvationPolicy.capacity_gate``): they wait for capacity, not fragmentation, and under
sustained overload a hold would only idle room. ``benchmarks churn`` measures both sides
(docs/decisions/0020-starvation-protection.md; on by default since
docs/decisions/0024-starvation-protection-on.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from extender.cache.evaluation import Evaluator
from extender.cache.ledger import Ledger
from extender.cache.moves import Labels, allowed_nodes
from extender.cache.records import CandidateEvaluation, PodRecord, is_pending
from extender.translate import inbound
from podspec.pods import PodIntent
from scoring.fit import fragmented_on

CANDIDATES_PER_PASS = 16
"""Waiting pods one housekeeping pass considers for a hold, oldest first."""


@dataclass(frozen=True, slots=True)
class StarvationPolicy:
    """When and how much to reserve (module notes); the admin config's ``starvation`` section.

    Parameters
    ----------
    reserve_after_s : float
        Wait, seconds, after which a pending GPU pod gets a node reserved; 0 turns it off.
    max_reserved_nodes : int
        Reservations held at once, >= 1.
    reservation_ttl_s : float
        Longest a reservation holds, seconds, > 0.
    capacity_gate : bool
        No new hold while the GPU pods pending past ``reserve_after_s`` ask, in sum, for more
        GPU share than is free on the ready, healthy GPUs (``waiting_for_capacity``): then the
        starving pods as a whole wait for capacity, not fragmentation, and a node drained for
        one of them would idle while the others still wait. Under sustained overload (thousands
        waiting for hours) this turns holds off; at moderate load, where a few large pods
        starve beside free room in pieces, it leaves them be.
    """

    reserve_after_s: float = 0.0
    max_reserved_nodes: int = 1
    reservation_ttl_s: float = 3600.0
    capacity_gate: bool = True

    @property
    def enabled(self) -> bool:
        """Whether any pod is ever reserved for."""
        return self.reserve_after_s > 0


NO_RESERVATIONS = StarvationPolicy()
DEFAULT_STARVATION = StarvationPolicy(reserve_after_s=600.0, max_reserved_nodes=2)
"""The default (issue 51): a hold after 600 s, two at a time, behind the capacity gate
(docs/decisions/0024-starvation-protection-on.md)."""


@dataclass(frozen=True, slots=True)
class Reservation:
    """A node held for one pending pod since ``since_s`` (the policy's clock).

    ``ttl_s`` None: a starvation hold, ending as the policy says; else a hold made by acting
    on the defragmentation plan (``hold``), which ends after ``ttl_s`` whatever the policy.
    """

    uid: str
    pod: str
    node: str
    since_s: float
    ttl_s: float | None = None

    @property
    def reason(self) -> str:
        """What filter says of the node to every other pod."""
        if self.ttl_s is None:
            return f"gpufrac: node reserved for pod {self.pod}, which has waited longest for room"
        return f"gpufrac: node being freed for pod {self.pod} (defragmentation)"


def waiting_for_capacity(ledger: Ledger, pending: Iterable[PodRecord]) -> bool:
    """Whether the pending GPU pods ask, in sum, for more share than the cluster has free.

    Parameters
    ----------
    ledger : Ledger
        Read only.
    pending : iterable of PodRecord
        Pending pods (any kind; CPU-only ones ask for no share).

    Returns
    -------
    bool
        ``sum(gpu_count * gpu_milli)`` over those pods (milli-GPU) exceeds
        ``gpu_free_milli`` summed over the healthy GPUs of ready nodes. Models and node
        selectors are not read: a coarse test of the queue as a whole, stopping at the first
        pod past the free share (O(pending) at worst).
    """
    state = ledger.state
    free_milli = int(np.where(state.gpu_healthy & state.node_ready[:, None], state.gpu_free_milli, 0).sum())
    asked_milli = 0
    for rec in pending:
        asked_milli += rec.intent.gpu_count * rec.intent.gpu_milli
        if asked_milli > free_milli:
            return True
    return False


class Reservations:
    """The reservations in force and when each pending pod was first seen. The cache lock guards it."""

    def __init__(self, policy: StarvationPolicy = NO_RESERVATIONS) -> None:
        self.policy = policy
        self.by_node: dict[str, Reservation] = {}
        self._seen_s: dict[str, float] = {}

    def release(self, uid: str) -> None:
        """The pod was bound or deleted: its reservation (if any) ends."""
        self._seen_s.pop(uid, None)
        for node, r in list(self.by_node.items()):
            if r.uid == uid:
                del self.by_node[node]

    def hold(self, ledger: Ledger, uid: str, node: str, ttl_s: float, now_s: float) -> Reservation | None:
        """Hold ``node`` for pending pod ``uid`` for ``ttl_s`` seconds while the
        defragmentation plan's moves free it; replaces any hold of that node. None when the
        pod is no longer pending or the node is unknown."""
        rec = ledger.pods.get(uid)
        if rec is None or not is_pending(rec) or node not in ledger.state.node_index:
            return None
        self.by_node[node] = Reservation(uid, rec.intent.key, node, now_s, ttl_s)
        ledger.generation += 1
        return self.by_node[node]

    def drop_holds(self, uid: str) -> None:
        """End the defragmentation holds made for ``uid`` (not a starvation hold)."""
        for node, r in list(self.by_node.items()):
            if r.uid == uid and r.ttl_s is not None:
                del self.by_node[node]

    def evaluate(self, evaluator: Evaluator, ledger: Ledger, intent: PodIntent,
                 names: Sequence[str]) -> CandidateEvaluation:
        """``Evaluator.evaluate`` on ``names`` less the nodes reserved for other pods; those are
        in ``CandidateEvaluation.reserved``, each with the reason filter gives. Where no
        candidate fits a GPU pod, ``CandidateEvaluation.pieces`` says on how many its request
        is free in pieces (a pass over the cluster, only then)."""
        held = {n: r for n, r in self.by_node.items() if r.uid != intent.uid}
        reserved = {n: held[n].reason for n in names if n in held} if held else {}
        if not reserved:  # the usual case
            ce = evaluator.evaluate(ledger, intent, names)
        else:
            ce = dataclasses.replace(evaluator.evaluate(ledger, intent, [n for n in names if n not in held]),
                                     reserved=reserved)
        ev = ce.evaluation
        if intent.gpu_count and ce.rejection is None and ev.rows.shape[0] and not ev.node_fits.any():
            nodes = np.zeros(ledger.state.n_nodes, dtype=bool)
            nodes[ev.rows] = True
            pieces = fragmented_on(ledger.state, ev.request, nodes)
            if pieces:
                ce = dataclasses.replace(ce, pieces=pieces)
        return ce

    def reserve(self, ledger: Ledger, now_s: float,
                node_labels: Labels | None = None) -> tuple[list[Reservation], list[Reservation]]:
        """One housekeeping pass: end stale reservations, make new ones.

        Parameters
        ----------
        ledger : Ledger
        now_s : float
            The policy's clock, seconds.
        node_labels : mapping of str to tuple of (str, str), optional
            Each node's labels (``NodeReader.labels``): a pod's ``nodeSelector`` must match
            the node held for it. None: no node's labels are known, so a pod with a
            ``nodeSelector`` gets no node held (none can be shown to match).

        Returns
        -------
        made, ended : list of Reservation
        """
        if not self.policy.enabled and not self.by_node:
            self._seen_s.clear()  # off: nothing to keep, and no pass over the pods (waits count from enabling)
            return [], []
        pending = {uid: rec for uid, rec in ledger.pods.items() if is_pending(rec)}
        for uid in [u for u in self._seen_s if u not in pending]:
            del self._seen_s[uid]
        ended = [r for r in self.by_node.values() if r.uid not in pending
                 or (r.ttl_s is None and (not self.policy.enabled or now_s - r.since_s >= self.policy.reservation_ttl_s))
                 or (r.ttl_s is not None and now_s - r.since_s >= r.ttl_s)]
        for r in ended:
            del self.by_node[r.node]
        for uid in pending:
            self._seen_s.setdefault(uid, now_s)
        starvation_holds = sum(r.ttl_s is None for r in self.by_node.values())
        if not self.policy.enabled or starvation_holds >= self.policy.max_reserved_nodes:
            return [], ended
        starving = [(s, uid) for uid, s in self._seen_s.items() if now_s - s >= self.policy.reserve_after_s]
        if not starving:
            return [], ended
        if self.policy.capacity_gate and waiting_for_capacity(ledger, (pending[uid] for _s, uid in starving)):
            return [], ended
        holders = {r.uid for r in self.by_node.values()}
        waited = sorted((s, uid) for s, uid in starving if uid not in holders)
        made: list[Reservation] = []
        # Bounded work under the cache lock: the oldest CANDIDATES_PER_PASS waiting pods only
        # (under overload thousands wait, nearly all for capacity).
        for _since, uid in waited[:CANDIDATES_PER_PASS]:
            if starvation_holds >= self.policy.max_reserved_nodes:
                break
            target = self._node_for(ledger, uid, self.by_node, node_labels or {})
            if target is not None:
                intent = pending[uid].intent
                made.append(Reservation(uid, f"{intent.namespace}/{intent.name}", target, now_s))
                self.by_node[target] = made[-1]
                starvation_holds += 1
        ledger.generation += bool(made)
        return made, ended

    @staticmethod
    def _node_for(ledger: Ledger, uid: str, taken: Iterable[str], node_labels: Labels) -> str | None:
        """The node to hold for the pod (module notes), or None when it does not wait for
        fragmentation (``scoring.fit.fragmented_on``: it fits somewhere now, or less share
        is free in sum on the GPUs it may use, on ready nodes its ``nodeSelector`` matches,
        than it asks) or fits no such node even empty."""
        state = ledger.state
        intent = ledger.pods[uid].intent
        request = inbound.pod_request(intent, state)
        selected = allowed_nodes(state, node_labels, intent.node_selector)
        if not fragmented_on(state, request, selected):
            return None
        k = request.gpu_count
        usable = state.gpu_exists & state.gpu_healthy
        if request.allowed_models is not None:
            usable &= np.isin(state.gpu_model, np.fromiter(request.allowed_models, dtype=np.int64))
        used = np.where(usable, state.gpu_used_milli, np.iinfo(np.int64).max // 16)
        drain = np.sort(used, axis=1)[:, :k].sum(axis=1) if k <= used.shape[1] else np.full(state.n_nodes, -1)
        ok = ((usable.sum(axis=1) >= k) & state.node_ready & selected & (state.cpu_alloc_milli >= request.cpu_milli)
              & (state.mem_alloc_mib >= request.memory_mib) & (drain >= 0))
        for name in taken:
            row = state.node_index.get(name)
            if row is not None:
                ok[row] = False
        if not ok.any():
            return None
        best = int(np.flatnonzero(ok)[np.argmin(drain[ok])])
        return str(state.node_names[best])
