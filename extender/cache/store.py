"""``GpuCache``: the one lock around the ledger, the evaluator and the read views.

kube-scheduler's split, in gpufrac's terms: a mutating cache (``extender.cache.ledger``:
node, pod and namespace events; ``extender.cache.assume``: assume, forget, expire, claims)
and evaluations that read one consistent view of it (``extender.cache.evaluation``), each
under the lock, so no request sees a half-applied change. Preemption takes the lock per node
(``victims``); ``summary`` and ``metrics_view`` never wait for it (``views``). It only routes and locks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from extender.cache import assume as assume_
from extender.cache import victims, views
from extender.cache.defrag import DefragPolicy
from extender.cache.evaluation import Evaluator
from extender.cache.ledger import Ledger
from extender.cache.moves import Labels
from extender.cache.records import (
    EMPTY_VIEW,
    CandidateEvaluation,
    ClaimCount,
    ClaimedAllocation,
    EventType,
    MetricsView,
    PodRecord,
    Receipt,
)
from extender.cache.reservations import Reservation, Reservations, StarvationPolicy
from extender.cache.victims import PreemptBudget
from extender.cache.views import GpuRoom
from extender.tenants import TenantPolicy, Usage
from podspec.pods import PodIntent
from scoring import ClusterState, NodeSpec, Scorer
from scoring.drift import DEFAULT_TOLERANCE, Tolerance


class GpuCache:
    """Thread-safe owner of the cluster arrays and pod allocations."""

    def __init__(self, scorer: Scorer, tolerance: Tolerance = DEFAULT_TOLERANCE) -> None:
        self._lock = threading.RLock()
        self._ledger = Ledger(scorer)
        self._evaluator = Evaluator(scorer, tolerance)
        self._last_view = EMPTY_VIEW
        self._reservations = Reservations()
        self.defrag_policy = DefragPolicy()  # admin config defragmentation: (extender.cluster.defragmenter)
        self.count_waiting = True  # pods waiting for fragmentation in metrics_view; cluster mode's plan counts them

    # -- configuration -------------------------------------------------------------------

    def set_policy(self, scorer: Scorer, tenants: TenantPolicy, tolerance: Tolerance | None = None,
                   starvation: StarvationPolicy | None = None, defrag: DefragPolicy | None = None) -> None:
        """Swap the scorer, the tolerance, the tenant rules, starvation protection and the
        defragmentation policy together (config reload), atomically; ``None``: unchanged.
        Every kept score is dropped; ``tolerance``: the drift of the cluster-wide terms allowed
        before every node is scored anew (``scoring.incremental``)."""
        with self._lock:
            self._ledger.set_scorer(scorer)
            self._evaluator = Evaluator(scorer, tolerance if tolerance is not None else self._evaluator.tolerance)
            self._ledger.tenancy.tenant_policy = tenants
            if starvation is not None:
                self._reservations.policy = starvation
            if defrag is not None:
                self.defrag_policy = defrag

    def usage(self, namespaces: Iterable[str] | None = None) -> Usage:
        """GPU share and memory held by the pods of ``namespaces`` (None: every namespace)."""
        with self._lock:
            return self._ledger.tenancy.usage(namespaces)

    def set_namespaces(self, labels: dict[str, dict[str, str]]) -> None:
        """Every namespace's labels (a full list, from the namespace watch)."""
        with self._lock:
            self._ledger.set_namespaces(labels)

    def upsert_namespace(self, name: str, labels: dict[str, str] | None) -> None:
        """One namespace's labels changed (None: it was deleted)."""
        with self._lock:
            self._ledger.upsert_namespace(name, labels)

    # -- node and pod events (``Ledger``) -------------------------------------------------

    def set_nodes(self, nodes: Sequence[NodeSpec]) -> None:
        """Replace the node set; allocations on nodes that are gone are dropped."""
        with self._lock:
            self._ledger.set_nodes(nodes)

    def upsert_nodes(self, nodes: Iterable[NodeSpec]) -> None:
        """Add or replace several nodes; a rebuild only on a change (``Ledger.upsert_nodes``)."""
        with self._lock:
            self._ledger.upsert_nodes(nodes)

    def remove_node(self, name: str) -> None:
        """Forget a node and the allocations on it."""
        with self._lock:
            self._ledger.remove_node(name)

    def apply_pod_event(self, event: EventType, intent: PodIntent) -> bool:
        """A pod event (``Ledger.apply_pod_event``); True if it freed GPU share."""
        with self._lock:
            return self._ledger.apply_pod_event(event, intent)

    def set_pods(self, intents: Iterable[PodIntent],
                 on_error: Callable[[PodIntent, Exception], None] | None = None) -> None:
        """A full pod list (``Ledger.set_pods``)."""
        with self._lock:
            self._ledger.set_pods(intents, on_error)

    def remove_pod(self, uid: str) -> bool:
        """Forget a pod and free what it held; True if GPU share was freed."""
        with self._lock:
            return self._ledger.remove_pod(uid)

    def pending_gpu_pods(self, limit: int) -> list[PodIntent]:
        """Up to ``limit`` pods that ask for GPUs and are not bound, oldest event first."""
        with self._lock:
            return self._ledger.pending(limit)

    def pod_intent(self, uid: str) -> PodIntent | None:
        """The pod as the cache last read it (None: no event seen, or deleted)."""
        with self._lock:
            rec = self._ledger.pods.get(uid)
            return None if rec is None else rec.intent

    def shows_bound(self, uid: str, node: str, gpu_uuids: Sequence[str]) -> bool:
        """True when the pod watch has shown the pod bound to ``node`` on exactly
        ``gpu_uuids`` and it is counted in full (confirmed, not assumed, not an over-commit):
        a claim of that allocation is then redundant for this cache (``extender.fence``)."""
        with self._lock:
            return self._ledger.shows_bound(uid, node, gpu_uuids)

    # -- scheduling ----------------------------------------------------------------------

    def evaluate(self, intent: PodIntent, names: Sequence[str]) -> CandidateEvaluation:
        """Score ``intent`` on the named nodes (no change to the allocations); filter then
        prioritize with no change between reuse one evaluation (``Evaluator``)."""
        with self._lock:
            return self._reservations.evaluate(self._evaluator, self._ledger, intent, names)

    def reserve_for_waiting(self, now_s: float | None = None,
                            node_labels: Labels | None = None) -> tuple[list[Reservation], list[Reservation]]:
        """Housekeeping of starvation protection: the reservations made and ended.
        ``now_s``: the policy's clock, ``time.monotonic()`` by default; ``node_labels``: each
        node's labels, which a pod's ``nodeSelector`` must match (``Reservations.reserve``)."""
        with self._lock:
            return self._reservations.reserve(self._ledger, time.monotonic() if now_s is None else now_s, node_labels)

    def defrag_snapshot(self) -> tuple[ClusterState, list[tuple[str, PodRecord]], Scorer]:
        """What ``extender.cache.defrag.plan_defrag`` reads, copied at one instant (the plan then
        runs outside the lock): the arrays, every pod record (oldest event first), the scorer."""
        with self._lock:
            return self._ledger.state.copy(), list(self._ledger.pods.items()), self._ledger.scorer

    def hold_for(self, uid: str, node: str, ttl_s: float, now_s: float | None = None) -> Reservation | None:
        """Hold ``node`` for pending pod ``uid`` while its moves free it (defragmentation);
        None when the pod is no longer pending or the node is unknown."""
        with self._lock:
            return self._reservations.hold(self._ledger, uid, node, ttl_s, time.monotonic() if now_s is None else now_s)

    def drop_hold(self, uid: str) -> None:
        """End the defragmentation hold for ``uid`` (its moves were refused)."""
        with self._lock:
            self._reservations.drop_holds(uid)

    def reservations(self) -> list[Reservation]:
        """The reservations in force."""
        with self._lock:
            return list(self._reservations.by_node.values())

    def bind(self, uid: str, namespace: str, name: str, node: str) -> PodRecord:
        """``assume`` recorded as confirmed (standalone mode); raises ``BindError`` as it."""
        return self.assume(uid, namespace, name, node, ttl_s=None)

    def assume(self, uid: str, namespace: str, name: str, node: str, ttl_s: float | None,
               claims: Iterable[ClaimedAllocation] = (), shape: PodIntent | None = None, receipt: Receipt = Receipt.NONE) -> PodRecord:
        """Choose the GPUs on ``node``, re-check the fit and hold the allocation, atomically
        under the lock: of two binds racing for the last share of a GPU exactly one gets it.
        Parameters, return value and ``BindError``: ``extender.cache.assume.assume``."""
        with self._lock:
            rec = assume_.assume(self._ledger, self._evaluator, uid, namespace, name, node, ttl_s, claims, shape, receipt)
            self._reservations.release(uid)
            return rec

    def count_claim(self, claim: ClaimedAllocation) -> ClaimCount:
        """Count an allocation another gpufrac instance claimed (``extender.fence``), in full
        and assumed for ``claim.ttl_s`` seconds (``extender.cache.assume.count_claim``)."""
        with self._lock:
            return assume_.count_claim(self._ledger, claim)

    def preempt(self, intent: PodIntent, nodes: Iterable[str],
                budget: PreemptBudget | None = None) -> dict[str, list[str]]:
        """Victims that would make a pod fit, per candidate node (the ``preempt`` verb): node
        name -> victim pod UIDs, only where preemption works (``extender.cache.victims.preempt``;
        bounded by ``budget``, the lock taken per node)."""
        return victims.preempt(self._lock, self._ledger, intent, nodes, budget or PreemptBudget())

    def forget(self, uid: str, intent: PodIntent | None = None) -> bool:
        """Give back an assumed allocation (a bind that failed; ``intent``: ``assume_.forget``);
        False if there was none (confirmed by the watch, expired, or the pod is gone)."""
        with self._lock:
            return assume_.forget(self._ledger, uid, intent)

    def expire_assumed(self, now: float | None = None) -> list[str]:
        """Free assumed allocations whose deadline passed; return their pods' ``ns/name``.

        A bind whose pod never showed up bound (the Binding was lost, gpufrac crashed between
        its two API calls, the pod was deleted unseen) must not hold its GPUs forever.
        """
        with self._lock:
            return assume_.expire(self._ledger, time.monotonic() if now is None else now)

    # -- reads (``views``) ------------------------------------------------------------------

    def allocations(self) -> list[dict[str, Any]]:
        """Every bound pod's allocation (``views.allocations``)."""
        with self._lock:
            return views.allocations(self._ledger)

    def summary(self) -> dict[str, int]:
        """Totals for metrics and readiness, read without the lock: one change behind at
        most, never torn (the state object and the pod list are each taken once); with the
        nodes held by starvation protection (``reserved_nodes``)."""
        return {**views.summary(self._ledger.state, list(self._ledger.pods.values())),
                "reserved_nodes": len(self._reservations.by_node)}

    def metrics_view(self) -> MetricsView:
        """Per-GPU allocation and per-tenant usage for ``/metrics``, never waiting on a verb:
        copied under the lock when it is free at once, else the view copied last."""
        if not self._lock.acquire(blocking=False):
            return self._last_view
        try:
            self._last_view = views.metrics_view(self._ledger, self.count_waiting)
            return self._last_view
        finally:
            self._lock.release()

    def gpu_rooms(self, nodes: Iterable[str]) -> dict[str, list[GpuRoom]]:
        """What is free of each GPU of the known ``nodes`` (``views.gpu_rooms``)."""
        with self._lock:
            return views.gpu_rooms(self._ledger.state, nodes)

    def state_copy(self) -> ClusterState:
        """A deep copy of the arrays (for tests and inspection)."""
        with self._lock:
            return self._ledger.state.copy()
