"""``GpuCache``: the store of every node's GPUs and every pod's allocation, as one ``ClusterState``.

Two inputs change it, and only two: node events (``set_nodes``/``upsert_node``/``remove_node``)
and pod events (``apply_pod_event``, fed by the Kubernetes pod watch in cluster mode and by
the standalone pod-event endpoint otherwise), plus ``bind``, which records the allocation
gpufrac chose. Reads (filter, prioritize) go through ``evaluate`` under the same lock, so a
request never sees a half-applied change.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from extender.cache import accounting
from extender.cache.records import (
    EMPTY_VIEW,
    BindError,
    CandidateEvaluation,
    ClaimedAllocation,
    ClaimHold,
    EventType,
    MetricsView,
    PodRecord,
    is_pending,
    model_mask_of,
    task_key,
)
from extender.cache.tenancy import TenantLedger
from extender.cache.victims import PreemptBudget, victims_on
from extender.tenants import TenantPolicy, Usage
from extender.translate import inbound, outbound
from podspec.pods import PodIntent
from scoring.fit import Reason
from scoring.incremental import DEFAULT_TOLERANCE, IncrementalScorer, Tolerance
from scoring.request import model_mask
from scoring.scorer import Scorer
from scoring.state import Allocation, ClusterState, NodeSpec

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Candidates:
    """A node-name list as resolved against the state (valid until the node set changes)."""

    names: list[str]
    rows: np.ndarray
    unknown: list[str]
    known: list[str]
    pos: dict[str, int] | None = None
    known_array: np.ndarray | None = None

    def names_array(self) -> np.ndarray:
        """``known`` as an object array, built once per candidate list."""
        if self.known_array is None:
            self.known_array = np.asarray(self.known, dtype=object)
        return self.known_array

    def passed(self, fits: np.ndarray) -> list[str]:
        """The known names where ``fits`` (what filter answers in ``NodeNames``)."""
        passed: list[str] = self.names_array()[fits].tolist()
        return passed

    def positions(self, names: Sequence[str]) -> np.ndarray | None:
        """Positions of ``names`` in ``known``; None if any is not there."""
        if self.pos is None:
            self.pos = {n: i for i, n in enumerate(self.known)}
        out = np.fromiter(map(self.pos.get, names, itertools.repeat(-1)), dtype=np.int64, count=len(names))
        return out if (out >= 0).all() else None



@dataclass(slots=True)
class _Memo:
    """The last evaluation: kube-scheduler calls prioritize right after filter, for the same
    pod, on the nodes filter passed (or a subset); node scores do not depend on the set."""

    generation: int
    intent: PodIntent
    candidates: _Candidates
    result: CandidateEvaluation
    passed: list[str] | None = None


def _without_usage(node: NodeSpec) -> NodeSpec:
    """The node with NVML's used memory zeroed (what a heartbeat may change without a rebuild)."""
    return replace(node, gpus=tuple(replace(g, memory_used_mib=0) for g in node.gpus))


def _node_sizes(state: ClusterState) -> list[int]:
    """GPUs per node of every node of ``state`` (the shapes the ``ShapePrior`` resolves against)."""
    return [int(n) for n in state.gpu_exists.sum(axis=1)]


class GpuCache:
    """Thread-safe owner of the cluster arrays and pod allocations."""

    def __init__(self, scorer: Scorer, tolerance: Tolerance = DEFAULT_TOLERANCE) -> None:
        self._lock = threading.RLock()
        self._scorer = scorer
        # The one evaluator of every verb: per pod shape, each node's result kept until its
        # row (or the cluster-wide terms, past ``tolerance``) moves.
        self._incremental = IncrementalScorer(scorer, tolerance)
        self._tenancy = TenantLedger()
        self._nodes: dict[str, NodeSpec] = {}
        self._state = ClusterState.from_nodes([])
        self._pods: dict[str, PodRecord] = {}
        # UIDs of the records that are over-commits, in the order they became one (``_put``
        # keeps it): the few that ``_recount_overcommits`` reads again, without a walk over
        # every pod.
        self._overcommitted: dict[str, None] = {}
        # Memo of the last evaluation: kube-scheduler calls prioritize right after filter with
        # a subset of the same candidates, and node scores do not depend on the candidate set.
        # Any change to the state or the scorer bumps ``_generation`` and invalidates it.
        self._generation = 0
        self._memo: _Memo | None = None
        # kube-scheduler sends the same node list call after call: remember its rows.
        self._candidates: _Candidates | None = None
        self._last_view = EMPTY_VIEW

    # -- configuration -------------------------------------------------------------------

    def set_scorer(self, scorer: Scorer, tolerance: Tolerance | None = None) -> None:
        """Swap the scorer (config reload); later requests use it. Every kept score is dropped.

        ``tolerance``: the drift of the cluster-wide terms allowed before every node is
        scored anew (``scoring.incremental``); unchanged when None.
        """
        with self._lock:
            self._scorer = scorer
            self._state.workload.set_prior(scorer.prior, _node_sizes(self._state))
            self._incremental = IncrementalScorer(
                scorer, tolerance if tolerance is not None else self._incremental.tolerance)
            self._generation += 1

    def set_policy(self, scorer: Scorer, tenants: TenantPolicy, tolerance: Tolerance | None = None) -> None:
        """Swap the scorer, the tolerance and the tenant rules together (config reload), atomically."""
        with self._lock:
            self.set_scorer(scorer, tolerance)
            self._tenancy.policy = tenants

    def usage(self, namespaces: Iterable[str] | None = None) -> Usage:
        """GPU share and memory held by the pods of ``namespaces`` (None: every namespace)."""
        with self._lock:
            return self._tenancy.usage(namespaces)

    def set_namespaces(self, labels: dict[str, dict[str, str]]) -> None:
        """Every namespace's labels (a full list, from the namespace watch)."""
        with self._lock:
            self._tenancy.set_labels(labels)
            self._generation += 1

    def upsert_namespace(self, name: str, labels: dict[str, str] | None) -> None:
        """One namespace's labels changed (None: it was deleted)."""
        with self._lock:
            self._tenancy.upsert_labels(name, labels)
            self._generation += 1

    def _hold(self, intent: PodIntent, alloc: Allocation, sign: int = 1) -> None:
        """The one writer of allocations: the state arrays and the per-namespace usage."""
        self._state.apply(alloc, sign)
        self._tenancy.hold(intent.namespace, alloc, sign)

    def _hold_record(self, rec: PodRecord, sign: int = 1) -> None:
        for alloc in rec.held:
            self._hold(rec.intent, alloc, sign)

    # -- node events ---------------------------------------------------------------------

    def set_nodes(self, nodes: Sequence[NodeSpec]) -> None:
        """Replace the node set; allocations on nodes that are gone are dropped."""
        with self._lock:
            old = self._nodes
            self._nodes = {n.name: n for n in nodes}
            try:
                self._rebuild()
            except Exception:
                self._nodes = old  # nothing half-applied: the arrays were never replaced
                raise

    def upsert_node(self, node: NodeSpec) -> None:
        """Add a node or replace its spec (inventory or allocatable changed)."""
        self.upsert_nodes([node])

    def upsert_nodes(self, nodes: Iterable[NodeSpec]) -> None:
        """Add or replace several nodes; the arrays are rebuilt once, and only on a change.

        A node whose spec is unchanged (an inventory heartbeat with nothing new) costs a
        comparison, and one whose GPUs changed only in NVML's used memory is patched in
        place, so the node watch and the staleness check may call this freely.
        """
        with self._lock:
            replaced: dict[str, NodeSpec | None] = {}
            try:
                self._upsert_nodes(nodes, replaced)
            except Exception:
                # Nothing half-applied: the arrays were never replaced; put back the specs.
                for name, old in replaced.items():
                    if old is None:
                        self._nodes.pop(name, None)
                    else:
                        self._nodes[name] = old
                raise

    def _upsert_nodes(self, nodes: Iterable[NodeSpec], replaced: dict[str, NodeSpec | None]) -> None:
        """Write ``nodes`` into ``_nodes`` (their previous specs into ``replaced``), then
        patch or rebuild the arrays."""
        changed = False
        for node in nodes:
            old = self._nodes.get(node.name)
            if old == node:
                continue
            replaced.setdefault(node.name, old)
            self._nodes[node.name] = node
            if old is not None and not changed and _without_usage(old) == _without_usage(node):
                # Only NVML's used memory moved (every agent heartbeat on a busy GPU):
                # patch that column in place instead of rebuilding every array.
                self._state.set_nvml_used_mib(self._state.node_index[node.name], [
                    g.memory_used_mib for g in sorted(node.gpus, key=lambda g: g.index)])
                self._generation += 1
                continue
            changed = True
        if changed:
            self._rebuild()

    def remove_node(self, name: str) -> None:
        """Forget a node and the allocations on it."""
        with self._lock:
            if self._nodes.pop(name, None) is not None:
                self._rebuild()

    def _rebuild(self) -> None:
        state = ClusterState.from_nodes(sorted(self._nodes.values(), key=lambda n: n.name))
        state.workload.set_prior(self._scorer.prior, _node_sizes(state))
        self._candidates = None
        self._state = state
        self._tenancy.clear_usage()
        for uid, rec in list(self._pods.items()):
            alloc = rec.allocation
            if alloc is None:
                if rec.intent.node_name in state.node_index:
                    self._put(uid, self._account(rec.intent))  # its node arrived after it
                continue
            if alloc.node not in state.node_index:
                log.info("node gone, dropping allocation", extra={"pod": rec.intent.key})
                self._put(uid, replace(rec, allocation=None, gpu_uuids=(), extra=(), overcommit_reason=""))
                continue
            if rec.overcommit_reason:
                self._put(uid, self._account(rec.intent))  # counted anew against the new arrays
                continue
            if rec.gpu_uuids:
                # Columns may move when a node's GPU list changes: re-resolve by UUID.
                cols = accounting.cols_for_uuids(state, alloc.node, rec.gpu_uuids)
                if cols is None:
                    self._put(uid, replace(rec, allocation=None, gpu_uuids=(), extra=(), overcommit_reason=""))
                    continue
                alloc = replace(alloc, gpu_cols=cols)
            # Model ids are positions in this state's model list: re-resolve the mask too.
            alloc = replace(alloc, model_mask=model_mask_of(rec.intent, state))
            self._put(uid, replace(rec, allocation=alloc))
            self._hold(rec.intent, alloc)
        for rec in self._pods.values():
            if is_pending(rec):
                state.workload.add(task_key(rec.intent, state), 1)
        self._generation += 1

    def _store(self, uid: str, rec: PodRecord | None) -> None:
        """Set (or with None, drop) a pod's record; keep pending GPU pods in the workload.

        FGD's target workload (``ClusterState.workload``) is the demand: the GPU pods held
        (``ClusterState.apply`` counts them) and the GPU pods waiting to be placed (counted
        here), so a pod that fits nowhere still shapes what fragmentation means.
        """
        old = self._pods.get(uid)
        if old is not None and is_pending(old):
            self._state.workload.add(task_key(old.intent, self._state), -1)
        if rec is None:
            self._pods.pop(uid, None)
            self._overcommitted.pop(uid, None)
            return
        if is_pending(rec):
            self._state.workload.add(task_key(rec.intent, self._state), 1)
        self._put(uid, rec)

    def _put(self, uid: str, rec: PodRecord) -> None:
        """The one write of a pod's record (``_store`` adds the workload bookkeeping)."""
        self._pods[uid] = rec
        if rec.overcommit_reason:
            self._overcommitted.setdefault(uid)
        else:
            self._overcommitted.pop(uid, None)

    # -- pod events ----------------------------------------------------------------------

    def apply_pod_event(self, event: EventType, intent: PodIntent) -> bool:
        """The one path by which the cache learns of pods it did not bind itself.

        ``DELETED`` or a finished pod frees what it held. A bound pod (``node_name`` set)
        not yet accounted for is accounted for: its GPUs from ``gpufrac.io/assigned-gpus``,
        its CPU and memory always. A pending pod is remembered so that ``bind`` can place it.
        Replaying the same event twice changes nothing.

        Returns
        -------
        bool
            True if the event freed GPU share (the pod was deleted or finished).
        """
        with self._lock:
            old = self._pods.get(intent.uid)
            if event == "DELETED" or intent.finished:
                return self.remove_pod(intent.uid)
            if old is not None and old.allocation is not None:
                if old.allocation.node == intent.node_name and intent.assigned_gpus == old.gpu_uuids:
                    # Bound where we hold its allocation: confirmed (an assumed one stops expiring).
                    self._store(intent.uid, replace(old, intent=intent, assumed_until=None))
                    return False
                if not intent.node_name:
                    # Our bind is in flight (the watch shows an older, unbound version).
                    self._store(intent.uid, replace(old, intent=replace(
                        intent, assigned_gpus=old.gpu_uuids)))
                    return False
                # Bound elsewhere than we hold it, or there on other GPUs (another instance's
                # Binding of the same pod landed first): the API is the truth.
                self._release(old)
            rec = PodRecord(intent)
            if intent.node_name and intent.node_name in self._state.node_index:
                rec = self._account(intent)
                self._generation += 1
            elif old is not None and old.allocation is not None:
                self._generation += 1  # released above
            self._store(intent.uid, rec)
            return False

    def set_pods(self, intents: Iterable[PodIntent],
                 on_error: Callable[[PodIntent, Exception], None] | None = None) -> None:
        """A full pod list (start-up, or a new list after the watch expired).

        Pods missing from the list are forgotten, except those with a bind in flight
        (assumed): the list may predate their Binding. Every listed pod is applied as
        ``ADDED``, so a bound pod's allocation is rebuilt from its ``gpufrac.io/assigned-*``
        annotations. ``on_error``: a pod whose update raises is reported there and skipped
        (cluster mode quarantines it) instead of stopping the list.
        """
        with self._lock:
            intents = list(intents)
            listed = {i.uid for i in intents}
            for uid, rec in list(self._pods.items()):
                if uid not in listed and rec.assumed_until is None:
                    self.remove_pod(uid)
            for intent in intents:
                try:
                    self.apply_pod_event("ADDED", intent)
                except Exception as exc:  # one pod must never stop the others' sync
                    if on_error is None:
                        raise
                    log.exception("pod %s: cache update failed", intent.key)
                    on_error(intent, exc)

    def remove_pod(self, uid: str) -> bool:
        """Forget a pod (deleted) and free what it held; unknown UIDs are ignored.

        Returns
        -------
        bool
            True if GPU share was freed (pods waiting for a GPU may fit now).
        """
        with self._lock:
            rec = self._pods.get(uid)
            self._store(uid, None)
            if rec is not None and rec.allocation is not None:
                self._release(rec)
                self._generation += 1
                return bool(rec.allocation.gpu_cols)
            return False

    def _recount_overcommits(self, node: str, skip: str = "") -> None:
        """Count the node's over-commits anew after something there was freed.

        An over-commit is counted only up to what was free when it was read; the pod really
        holds more. When share or memory on its node is freed (``_release``: a deletion, a
        failed bind, a pod found bound elsewhere), it is read again, so it takes up what it
        really uses before anyone else can be placed there.
        """
        for uid in list(self._overcommitted):
            if uid == skip:  # the record being released (still stored by some callers)
                continue
            other = self._pods[uid]
            if other.allocation is not None and other.allocation.node == node:
                self._hold_record(other, sign=-1)
                # A claim held as assumed stays assumed: it still expires unless confirmed.
                self._put(uid, replace(self._account(other.intent), assumed_until=other.assumed_until))

    def pending_gpu_pods(self, limit: int) -> list[PodIntent]:
        """Up to ``limit`` pods that ask for GPUs and are not bound, oldest event first."""
        with self._lock:
            out = []
            for rec in self._pods.values():
                i = rec.intent
                if is_pending(rec):
                    out.append(i)
                    if len(out) >= limit:
                        break
            return out

    def knows_pod(self, uid: str) -> bool:
        """True if a pod event for ``uid`` has been applied (and the pod not deleted)."""
        with self._lock:
            return uid in self._pods

    def shows_bound(self, uid: str, node: str, gpu_uuids: Sequence[str]) -> bool:
        """True when the pod watch has shown the pod bound to ``node`` on exactly
        ``gpu_uuids`` and it is counted in full (confirmed, not assumed, not an over-commit):
        a claim of that allocation is then redundant for this cache (``extender.fence``)."""
        with self._lock:
            rec = self._pods.get(uid)
            return (rec is not None and rec.allocation is not None and rec.assumed_until is None
                    and not rec.overcommit_reason and rec.allocation.node == node
                    and rec.gpu_uuids == tuple(gpu_uuids))

    def _account(self, intent: PodIntent) -> PodRecord:
        """Count a bound pod we did not just bind, from its allocation record
        (``accounting.account``: as recorded when gpufrac could have made it, else an over-commit)."""
        rec = accounting.account(self._state, self._scorer.policy, self._tenancy, intent)
        self._hold_record(rec)
        return rec

    def _release(self, rec: PodRecord, recount: bool = True) -> None:
        """Free what a record holds; the node's other over-commits then take up what they
        really use (``recount``), whether the freed record was an over-commit itself or not:
        an over-commit holds what was free when it was read, and freeing that frees room as
        much as freeing a trusted record does. Without it the cache kept counting less than
        a restart would read back, and placed gpufrac's own pods on GPUs a record already
        filled (tests/extender/test_invariants.py). The caller that re-holds the same record
        in full at once (a claim confirming an over-commit) passes ``recount=False``."""
        self._hold_record(rec, sign=-1)
        if recount and rec.allocation is not None:
            self._recount_overcommits(rec.allocation.node, skip=rec.intent.uid)

    # -- scheduling ----------------------------------------------------------------------

    def evaluate(self, intent: PodIntent, names: Sequence[str]) -> CandidateEvaluation:
        """Score ``intent`` on the named nodes (no change to the allocations).

        Repeated calls for the same pod with no state change in between (filter, then
        prioritize on a subset) reuse the previous evaluation.
        """
        with self._lock:
            memo = self._memo
            if memo is not None and memo.generation == self._generation and memo.intent == intent:
                ev = memo.result.evaluation
                if memo.passed is None:
                    memo.passed = memo.candidates.passed(ev.node_fits)
                if names == memo.passed:  # what kube-scheduler sends: the nodes filter passed
                    positions: np.ndarray | None = np.flatnonzero(ev.node_fits)
                else:
                    positions = memo.candidates.positions(names)
                    if positions is not None and inbound.has_repeats(positions, len(memo.candidates.known)):
                        positions = None
                if positions is not None:
                    return CandidateEvaluation(list(names), [], ev.take(positions), memo.result.rejection)
            state = self._state
            cand = self._candidates
            if cand is None or cand.names != names:
                sent = list(names)
                rows, unknown = inbound.rows_for_names(state, names)
                if inbound.has_repeats(rows, state.n_nodes) or len(set(unknown)) != len(unknown):
                    names = list(dict.fromkeys(names))  # a node must not get two answers
                    rows, unknown = inbound.rows_for_names(state, names)
                known = list(names) if not unknown else [state.node_names[r] for r in rows.tolist()]
                cand = self._candidates = _Candidates(sent, rows, unknown, known)
            request = inbound.pod_request(intent, state)
            ev = self._incremental.evaluate(state, request, cand.rows)
            # The memory a proportional request takes depends on the GPU: the quota check
            # here counts an explicit gpufrac.io/memory only, bind checks the exact amount.
            rejected = self._tenancy.admission(intent, intent.gpu_count * (intent.gpu_memory_mib or 0))
            result = CandidateEvaluation(cand.known, cand.unknown, ev, rejected, cand.names_array())
            self._memo = _Memo(self._generation, intent, cand, result)
            return result

    def bind(self, uid: str, namespace: str, name: str, node: str) -> PodRecord:
        """Choose the GPUs for a pending pod on ``node`` and record the allocation (standalone).

        Raises
        ------
        BindError
            If the pod or node is unknown, the pod is bound elsewhere, or it no longer fits.
        """
        return self.assume(uid, namespace, name, node, hold_s=None)

    def assume(self, uid: str, namespace: str, name: str, node: str,
               hold_s: float | None, claims: Iterable[ClaimedAllocation] = ()) -> PodRecord:
        """Choose the GPUs on ``node``, re-check the fit and hold the allocation, atomically.

        Everything happens under the cache lock, so of two binds racing for the last share
        of a GPU exactly one gets it; the other sees it taken and fails the fit check.

        Parameters
        ----------
        uid, namespace, name : str
            The pod (``ExtenderBindingArgs``).
        node : str
        hold_s : float or None
            Cluster mode: seconds the allocation stays assumed before ``expire_assumed``
            frees it, unless the pod watch confirms the pod bound to ``node`` first. None:
            recorded as confirmed (standalone mode).
        claims : iterable of ClaimedAllocation
            Fenced binds: other instances' live claims on ``node`` (its ledger as last
            seen), counted first under the same lock (``hold_claim``), so that nothing frees
            one of them between counting it and choosing the GPUs.

        Returns
        -------
        PodRecord
            The pod with its allocation and GPU UUIDs.

        Raises
        ------
        BindError
            If the pod or node is unknown, the pod is bound elsewhere, it no longer fits, or
            a claim cannot be counted (``ClaimHold.BUSY``).
        """
        with self._lock:
            for c in claims:
                if self._hold_claim(c) is ClaimHold.BUSY:
                    # The same pod, bound by us elsewhere (or to other GPUs) while the other
                    # instance claimed it here: until one of the two binds settles we
                    # cannot tell what this node holds.
                    raise BindError(f"gpufrac: pod {c.namespace}/{c.name} is claimed on {c.node} by {c.owner} "
                                    "while a bind of it by this instance is in flight; kube-scheduler retries", "conflict")
            rec = self._pods.get(uid)
            if rec is None:
                raise BindError(f"gpufrac: pod {namespace}/{name} (uid {uid}) unknown: no pod event seen")
            if (rec.intent.namespace, rec.intent.name) != (namespace, name):
                raise BindError(f"gpufrac: uid {uid} is pod {rec.intent.key}, not {namespace}/{name}")
            if rec.allocation is not None:
                if rec.allocation.node == node:
                    return rec
                if rec.assumed_until is None:
                    raise BindError(f"gpufrac: pod {namespace}/{name} already bound to {rec.allocation.node}")
                # Held but never confirmed elsewhere: another instance's claim whose Binding
                # has not shown up (kube-scheduler would not bind a pod it saw bound). The
                # API decides: a second Binding of one pod is refused there.
                self._release(rec)
                rec = PodRecord(replace(rec.intent, node_name="", assigned_gpus=()))
                self._store(uid, rec)
                self._generation += 1
            state = self._state
            if node not in state.node_index:
                raise BindError(f"gpufrac: node {node!r} not in gpufrac's cache")
            row = state.node_index[node]
            request = inbound.pod_request(rec.intent, state)
            ev = self._incremental.evaluate(state, request, np.array([row], dtype=np.int64))
            if not ev.node_fits[0]:
                msg = outbound.reason_message(Reason(int(ev.reason[0])), request, rec.intent)
                raise BindError(f"{msg} (at bind, on {node})", "no_fit")
            cols = tuple(int(c) for c in ev.chosen_cols[0])
            mem = tuple(int(m) for m in ev.chosen_mem_mib[0])
            rejected = self._tenancy.admission(rec.intent, sum(mem))
            if rejected is not None:
                raise BindError(f"{rejected} (at bind)", "quota")
            alloc = Allocation(node, cols, request.gpu_milli if cols else 0, mem, request.qos,
                               request.cpu_milli, request.memory_mib, model_mask(request.allowed_models),
                               gpu_memory_request_mib=request.gpu_memory_mib or 0)
            uuids = tuple(state.gpu_uuid[row][c] for c in cols)
            self._hold(rec.intent, alloc)
            self._generation += 1
            until = None if hold_s is None else time.monotonic() + hold_s
            bound = PodRecord(replace(rec.intent, node_name=node, assigned_gpus=uuids), alloc, uuids, until)
            self._store(uid, bound)
            return bound

    def hold_claim(self, claim: ClaimedAllocation) -> ClaimHold:
        """Count an allocation another gpufrac instance claimed (``extender.fence``).

        The pod's record is held as if the pod were bound with that allocation, in full
        (a claim is gpufrac's own record, not an annotation to read back with
        ``accounting.account``'s clamp), as assumed for ``claim.hold_s`` seconds: the pod
        watch confirms it, or it expires (the other instance's Binding never landed). A
        record the pod watch read back as an over-commit is counted in full too.

        Returns
        -------
        ClaimHold
            ``HELD``: counted now, or already with these GPUs. ``VOID``: nothing to count
            (the pod is bound elsewhere per the pod watch, or the node is not in the cache).
            ``UNKNOWN``: no event of the pod seen. ``BUSY``: this cache holds the pod
            elsewhere, or on other GPUs, for a bind still in flight: the claim cannot be
            counted until that bind is settled.
        """
        with self._lock:
            return self._hold_claim(claim)

    def _hold_claim(self, claim: ClaimedAllocation) -> ClaimHold:
        rec = self._pods.get(claim.uid)
        if rec is None:
            return ClaimHold.UNKNOWN
        if rec.allocation is not None:
            if rec.allocation.node != claim.node or rec.gpu_uuids != claim.gpu_uuids:
                return ClaimHold.VOID if rec.assumed_until is None else ClaimHold.BUSY
            if not rec.overcommit_reason:
                return ClaimHold.HELD
        if claim.node not in self._state.node_index:
            return ClaimHold.VOID
        cols = accounting.cols_for_uuids(self._state, claim.node, claim.gpu_uuids)
        if cols is None or len(cols) != len(claim.gpu_memory_mib) or len(set(cols)) != len(cols):
            return ClaimHold.VOID
        if rec.allocation is not None:
            # Read back as an over-commit (counted only up to what looked free) while the
            # claim says it was committed in full: count it in full, confirmed or not as
            # it was.
            self._release(rec, recount=False)
            deadline = rec.assumed_until
        else:
            deadline = time.monotonic() + max(claim.hold_s, 0.0)
        intent = replace(rec.intent, node_name=claim.node, assigned_gpus=claim.gpu_uuids,
                         assigned_gpu_milli=claim.gpu_milli, assigned_memory_mib=claim.gpu_memory_mib)
        # In full, as the claimant holds it (its assume built the same Allocation): a claim
        # is gpufrac's own record, written by compare-and-swap in gpufrac's namespace, not a
        # pod annotation anyone could forge, and counting it short is what over-commits.
        request = inbound.pod_request(intent, self._state)
        alloc = Allocation(claim.node, cols, claim.gpu_milli if cols else 0, claim.gpu_memory_mib, request.qos,
                           request.cpu_milli, request.memory_mib, model_mask(request.allowed_models),
                           gpu_memory_request_mib=request.gpu_memory_mib or 0)
        self._hold(intent, alloc)
        self._generation += 1
        self._store(claim.uid, PodRecord(intent, alloc, claim.gpu_uuids, deadline))
        return ClaimHold.HELD

    def preempt(self, intent: PodIntent, nodes: Iterable[str],
                budget: PreemptBudget | None = None) -> dict[str, list[str]]:
        """Victims that would make a pod fit, per candidate node (the ``preempt`` verb).

        On each node, the victims are taken among the pods there with a lower priority than
        the preemptor (kube-scheduler's rule) and a lower QoS class (gpufrac's: never a pod
        of an equal or higher class). The smallest set that makes the pod fit is chosen;
        among sets of that size, the one with the lowest classes (then lowest priorities,
        then grouped by GPU, then largest shares) first: grouping by GPU puts the pods that
        together free one GPU next to each other, which the bounded search relies on. A node where the pod fits already, or where no set
        works, is left out: kube-scheduler rejects an empty victim list.

        The search is bounded (``PreemptBudget``): at most ``max_victims`` candidates per
        node (the first in the order above), ``max_tries`` fit checks per node, and
        ``time_s`` for the whole call, after which the nodes answered so far are returned.
        The cache lock is taken per node, never across the whole search, so filter, bind
        and the watches go on between nodes. Each what-if runs on a copy of the node's row
        (``ClusterState.rows_copy``): the live arrays are never changed.

        Parameters
        ----------
        intent : PodIntent
            The preemptor.
        nodes : iterable of str
            Candidate node names (``NodeNameToMetaVictims`` keys).
        budget : PreemptBudget, optional

        Returns
        -------
        dict of str to list of str
            Node name -> victim pod UIDs, only for nodes where preemption works.
        """
        budget = budget or PreemptBudget()
        deadline = time.monotonic() + budget.time_s
        nodes = list(nodes)
        with self._lock:
            if self._tenancy.admission(intent, intent.gpu_count * (intent.gpu_memory_mib or 0)) is not None:
                return {}
            # The pods on the candidate nodes, found in one pass (read again per node below).
            on_node: dict[str, list[str]] = {n: [] for n in nodes}
            for uid, rec in self._pods.items():
                if rec.allocation is not None and rec.allocation.node in on_node:
                    on_node[rec.allocation.node].append(uid)
        out: dict[str, list[str]] = {}
        for node in nodes:
            if time.monotonic() > deadline:
                log.info("preempt for %s: time budget spent; answering %d node(s)", intent.key, len(out))
                break
            with self._lock:
                victims = victims_on(self._state, self._scorer.policy, intent,
                                     inbound.pod_request(intent, self._state), node,
                                     [(uid, self._pods.get(uid)) for uid in on_node[node]], budget, deadline)
            if victims:
                out[node] = victims
        return out

    def forget(self, uid: str) -> bool:
        """Give back an assumed allocation (a bind that failed); the pod is pending again.

        Returns
        -------
        bool
            True if an assumed allocation was freed; False if there was none (already
            confirmed by the watch, expired, or the pod is gone).
        """
        with self._lock:
            rec = self._pods.get(uid)
            if rec is None or rec.allocation is None or rec.assumed_until is None:
                return False
            self._release(rec)
            intent = replace(rec.intent, node_name="", assigned_gpus=())
            self._store(uid, PodRecord(intent))
            self._generation += 1
            return True

    def expire_assumed(self, now: float | None = None) -> list[str]:
        """Free assumed allocations whose deadline passed; return their pods' ``ns/name``.

        A bind whose pod never showed up bound (the Binding was lost, gpufrac crashed between
        its two API calls, the pod was deleted unseen) must not hold its GPUs forever.
        """
        now = time.monotonic() if now is None else now
        with self._lock:
            expired = [uid for uid, r in self._pods.items()
                       if r.assumed_until is not None and r.assumed_until <= now]
            keys = [self._pods[uid].intent.key for uid in expired]
            for uid in expired:
                self.forget(uid)
            return keys

    # -- reads ---------------------------------------------------------------------------

    def allocations(self) -> list[dict[str, Any]]:
        """Every bound pod's allocation, for ``/allocations`` and the replay's placements.

        ``gpu_milli`` is the share the pod's record gives it; ``held_milli`` and
        ``gpu_memory_mib`` what the cache counts per GPU (less than recorded only for an
        over-commit, whose reason is in ``overcommit``; empty otherwise).
        """
        with self._lock:
            state = self._state
            out: list[dict[str, Any]] = []
            for rec in self._pods.values():
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

    def summary(self) -> dict[str, int]:
        """Totals for metrics and readiness: nodes, GPUs, allocated milli, pods, over-commits.

        Read without the cache lock, so ``/readyz`` and ``/metrics`` answer at once while a
        verb holds it: the totals may be one change behind, never torn (the state object and
        the pod list are each taken once, atomically).
        """
        s = self._state
        records = list(self._pods.values())
        return {
            "nodes": s.n_nodes,
            "gpus": int(s.gpu_exists.sum()),
            "gpu_allocated_milli": int(s.gpu_used_milli.sum()),
            "pods": len(records),
            "pods_bound": sum(1 for r in records if r.allocation is not None),
            "pods_overcommitted": sum(1 for r in records if r.overcommit_reason),
        }

    def metrics_view(self) -> MetricsView:
        """Per-GPU allocation and per-tenant usage for ``/metrics``, never waiting on a verb.

        Copied under the cache lock when it is free at once; while a verb holds it, the view
        copied last (one scrape old at most, never torn).
        """
        if not self._lock.acquire(blocking=False):
            return self._last_view
        try:
            s = self._state
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
                       for name, (t, u) in sorted(self._tenancy.by_tenant().items())]
            self._last_view = MetricsView(gpus, tenants)
            return self._last_view
        finally:
            self._lock.release()

    def state_copy(self) -> ClusterState:
        """A deep copy of the arrays (for tests and inspection)."""
        with self._lock:
            return self._state.copy()
