"""``Ledger``: the cluster arrays and the pod records, and the events that change them.

kube-scheduler's cache, without its lock (``GpuCache`` holds the one lock around every
call): node events (``set_nodes``, ``upsert_nodes``, ``remove_node``) rebuild or patch the
``ClusterState``; pod events (``apply_pod_event``, ``set_pods``, ``remove_pod``) account
bound pods and remember pending ones; ``apply_allocation`` is the one writer of an
allocation into the arrays and the tenant usage. Assume, forget and expiry
(``extender.cache.assume``) and claims (the same module) write through ``store`` and
``apply_allocation`` too. Every change bumps
``generation``, which is what an evaluation's memo (``extender.cache.evaluation``) keys on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from itertools import islice

from extender.cache import accounting
from extender.cache.records import EventType, PodRecord, is_pending, task_key
from extender.cache.tenancy import TenantLedger
from extender.translate import inbound
from podspec.claims import CLAIM_RECORD_PREFIX
from podspec.pods import PodIntent
from scoring.scorer import Scorer
from scoring.specs import Allocation, NodeSpec
from scoring.state import ClusterState

log = logging.getLogger(__name__)


def _without_usage(node: NodeSpec) -> NodeSpec:
    """The node with NVML's used memory zeroed (what a heartbeat may change without a rebuild)."""
    return replace(node, gpus=tuple(replace(g, memory_used_mib=0) for g in node.gpus))


def node_sizes(state: ClusterState) -> list[int]:
    """GPUs per node of every node of ``state`` (the shapes the ``ShapePrior`` resolves against)."""
    return [int(n) for n in state.gpu_exists.sum(axis=1)]


class Ledger:
    """The node specs, the arrays built from them, the pod records and the tenant usage.

    Not thread-safe: ``GpuCache`` calls it under its lock.

    Attributes
    ----------
    state : ClusterState
        The arrays (``n_nodes x max_gpus``), rebuilt on a node-set change.
    pods : dict of str to PodRecord
        Every pod seen, by UID.
    tenancy : TenantLedger
        Per-namespace usage and labels, admission.
    scorer : Scorer
        The scorer whose prior shapes the workload and whose QoS policy accounting reads.
    generation : int
        Bumped by every change an evaluation could see.
    """

    def __init__(self, scorer: Scorer) -> None:
        self.scorer = scorer
        self.tenancy = TenantLedger()
        self.nodes: dict[str, NodeSpec] = {}
        self.state = ClusterState.from_nodes([])
        self.state.workload.set_learning(scorer.learning)
        self.pods: dict[str, PodRecord] = {}
        # UIDs of the records that are over-commits, in the order they became one (``put``
        # keeps it): the few that ``recount_overcommits`` reads again, without a walk over
        # every pod.
        self.overcommitted: dict[str, None] = {}
        # The task key each pending GPU pod is counted under in the workload, so that taking
        # it out (a bind, a delete) converts nothing again: a bind resolves model names once.
        self.pending_keys: dict[str, tuple[int, int, int, int, int, int]] = {}
        self.generation = 0
        # Fenced holds on receipt (``extender.cache.assume``, notes): per row, the last stretch
        # of row versions (first, last) over which every change was this instance's own
        # assume or forget; per held pod, (rebuilds, row, row version before its hold).
        # ``rebuilds`` counts new arrays, whose row versions start again.
        self.own_runs: dict[int, tuple[int, int]] = {}
        self.receipt_marks: dict[str, tuple[int, int, int]] = {}
        self.rebuilds = 0

    def set_scorer(self, scorer: Scorer) -> None:
        """A new scorer (config reload): its prior reshapes the workload."""
        self.scorer = scorer
        self.state.workload.set_prior(scorer.prior, node_sizes(self.state))
        self.state.workload.set_learning(scorer.learning)
        self.own_runs = {}  # a new QoS policy may refuse what a hold on receipt took: choose again
        self.generation += 1

    # -- allocations ---------------------------------------------------------------------

    def apply_allocation(self, intent: PodIntent, alloc: Allocation, sign: int = 1) -> None:
        """The one writer of allocations: the state arrays and the per-namespace usage."""
        self.state.apply(alloc, sign)
        self.tenancy.apply(intent.namespace, alloc, sign)

    def apply_record(self, rec: PodRecord, sign: int = 1) -> None:
        """``apply_allocation`` each allocation of the record (an over-commit may hold several)."""
        for alloc in rec.held:
            self.apply_allocation(rec.intent, alloc, sign)

    def account(self, intent: PodIntent) -> PodRecord:
        """Count a bound pod we did not just bind, from its allocation record
        (``accounting.account``: as recorded when gpufrac could have made it, else an over-commit)."""
        rec = accounting.account(self.state, self.scorer.qos_policy, self.tenancy, intent)
        self.apply_record(rec)
        return rec

    def release(self, rec: PodRecord, recount: bool = True) -> None:
        """Free what a record holds; the node's other over-commits then take up what they
        really use (``recount``), whether the freed record was an over-commit itself or not:
        an over-commit holds what was free when it was read, and freeing that frees room as
        much as freeing a trusted record does. Without it the cache kept counting less than
        a restart would read back, and placed gpufrac's own pods on GPUs a record already
        filled (tests/extender/cache/test_invariants.py). The caller that re-holds the same record
        in full at once (a claim confirming an over-commit) passes ``recount=False``."""
        self.apply_record(rec, sign=-1)
        if recount and rec.allocation is not None:
            self.recount_overcommits(rec.allocation.node, skip=rec.intent.uid)

    def recount_overcommits(self, node: str, skip: str = "") -> None:
        """Count the node's over-commits anew after something there was freed.

        An over-commit is counted only up to what was free when it was read; the pod really
        holds more. When share or memory on its node is freed (``release``: a deletion, a
        failed bind, a pod found bound elsewhere), it is read again, so it takes up what it
        really uses before anyone else can be placed there.
        """
        for uid in list(self.overcommitted):
            if uid == skip:  # the record being released (still stored by some callers)
                continue
            other = self.pods[uid]
            if other.allocation is not None and other.allocation.node == node:
                self.apply_record(other, sign=-1)
                # A claim held as assumed stays assumed: it still expires unless confirmed.
                self.put(uid, replace(self.account(other.intent), assumed_until=other.assumed_until))

    # -- records -------------------------------------------------------------------------

    def store(self, uid: str, rec: PodRecord | None) -> None:
        """Set (or with None, drop) a pod's record; keep pending GPU pods in the workload.

        FGD's target workload (``ClusterState.workload``) is the demand: the GPU pods held
        (``ClusterState.apply`` counts them) and the GPU pods waiting to be placed (counted
        here), so a pod that fits nowhere still shapes what fragmentation means.
        """
        old = self.pods.get(uid)
        old_key = self.pending_keys.pop(uid, None)
        if old_key is not None:
            self.state.workload.add(old_key, -1, pending=True)
        if rec is None:
            self.pods.pop(uid, None)
            self.overcommitted.pop(uid, None)
            return
        key = None
        if old is None and rec.intent.gpu_count and not rec.intent.finished:
            key = task_key(rec.intent, self.state)
            self.state.workload.arrive(key)
        if is_pending(rec):
            key = old_key if old_key is not None and old is not None and old.intent == rec.intent else (
                key or task_key(rec.intent, self.state))
            self.state.workload.add(key, 1, pending=True)
            self.pending_keys[uid] = key
        self.put(uid, rec)

    def put(self, uid: str, rec: PodRecord) -> None:
        """The one write of a pod's record (``store`` adds the workload bookkeeping)."""
        self.pods[uid] = rec
        if rec.overcommit_reason:
            self.overcommitted.setdefault(uid)
        else:
            self.overcommitted.pop(uid, None)

    # -- node events ---------------------------------------------------------------------

    def set_nodes(self, nodes: Sequence[NodeSpec]) -> None:
        """Replace the node set; allocations on nodes that are gone are dropped."""
        old = self.nodes
        self.nodes = {n.name: n for n in nodes}
        try:
            self.rebuild()
        except Exception:
            self.nodes = old  # nothing half-applied: the arrays were never replaced
            raise

    def upsert_nodes(self, nodes: Iterable[NodeSpec]) -> None:
        """Add or replace nodes; the arrays are rebuilt once, and only on a change.

        A node whose spec is unchanged (an inventory heartbeat with nothing new) costs a
        comparison, and one whose GPUs changed only in NVML's used memory is patched in
        place. On an error nothing is half-applied: the specs are put back.
        """
        replaced: dict[str, NodeSpec | None] = {}
        try:
            changed = False
            for node in nodes:
                old = self.nodes.get(node.name)
                if old == node:
                    continue
                replaced.setdefault(node.name, old)
                self.nodes[node.name] = node
                if old is not None and not changed and _without_usage(old) == _without_usage(node):
                    # Only NVML's used memory moved (every agent heartbeat on a busy GPU):
                    # patch that column in place instead of rebuilding every array.
                    self.state.set_nvml_used_mib(self.state.node_index[node.name], [
                        g.memory_used_mib for g in sorted(node.gpus, key=lambda g: g.index)])
                    self.generation += 1
                    continue
                changed = True
            if changed:
                self.rebuild()
        except Exception:
            for name, spec in replaced.items():
                if spec is None:
                    self.nodes.pop(name, None)
                else:
                    self.nodes[name] = spec
            raise

    def remove_node(self, name: str) -> None:
        """Forget a node and the allocations on it."""
        if self.nodes.pop(name, None) is not None:
            self.rebuild()

    def rebuild(self) -> None:
        """Build the arrays from the node specs and count every record against them again."""
        state = ClusterState.from_nodes(sorted(self.nodes.values(), key=lambda n: n.name))
        state.workload.set_prior(self.scorer.prior, node_sizes(state))
        old_models = self.state.models
        state.workload.carry_history(self.state.workload, lambda m: state.model_mask_from(m, old_models))
        state.workload.set_learning(self.scorer.learning)
        self.state = state
        self.rebuilds += 1
        self.own_runs = {}
        self.tenancy.clear_usage()
        for uid, rec in list(self.pods.items()):
            alloc = rec.allocation
            if alloc is None:
                if rec.intent.node_name in state.node_index:
                    self.put(uid, self.account(rec.intent))  # its node arrived after it
                continue
            if alloc.node not in state.node_index:
                log.info("node gone, dropping allocation", extra={"pod": rec.intent.key})
                self.put(uid, replace(rec, allocation=None, gpu_uuids=(), extra=(), overcommit_reason=""))
                continue
            if rec.overcommit_reason:
                self.put(uid, self.account(rec.intent))  # counted anew against the new arrays
                continue
            if rec.gpu_uuids:
                # Columns may move when a node's GPU list changes: re-resolve by UUID.
                cols = accounting.cols_for_uuids(state, alloc.node, rec.gpu_uuids)
                if cols is None:
                    self.put(uid, replace(rec, allocation=None, gpu_uuids=(), extra=(), overcommit_reason=""))
                    continue
                alloc = replace(alloc, gpu_cols=cols)
            # Model ids are positions in this state's model list: re-resolve the mask too.
            alloc = replace(alloc, model_mask=inbound.model_mask_of(rec.intent, state))
            self.put(uid, replace(rec, allocation=alloc))
            self.apply_allocation(rec.intent, alloc)
        self.pending_keys = {uid: task_key(rec.intent, state) for uid, rec in self.pods.items() if is_pending(rec)}
        for key in self.pending_keys.values():
            state.workload.add(key, 1, pending=True)
        self.generation += 1

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
        old = self.pods.get(intent.uid)
        if event == "DELETED" or intent.finished:
            return self.remove_pod(intent.uid)
        if old is not None and old.allocation is not None:
            if old.allocation.node == intent.node_name and intent.assigned_gpus == old.gpu_uuids:
                # Bound where we hold its allocation: confirmed (an assumed one stops expiring).
                self.store(intent.uid, replace(old, intent=intent, assumed_until=None))
                return False
            if not intent.node_name:
                # Our bind is in flight (the watch shows an older, unbound version).
                self.store(intent.uid, replace(old, intent=replace(intent, assigned_gpus=old.gpu_uuids)))
                return False
            # Bound elsewhere than we hold it, or there on other GPUs (another instance's
            # Binding of the same pod landed first): the API is the truth.
            self.release(old)
        rec = PodRecord(intent)
        if intent.node_name and intent.node_name in self.state.node_index:
            rec = self.account(intent)
            self.generation += 1
        elif old is not None and old.allocation is not None:
            self.generation += 1  # released above
        self.store(intent.uid, rec)
        return False

    def set_pods(self, intents: Iterable[PodIntent],
                 on_error: Callable[[PodIntent, Exception], None] | None = None) -> None:
        """A full pod list (start-up, or a new list after the watch expired).

        Pods missing from the list are forgotten, except those with a bind in flight
        (assumed): the list may predate their Binding; and the records of ResourceClaims
        (``podspec.claims.CLAIM_RECORD_PREFIX``), which the claim watch keeps. Every listed pod is applied as
        ``ADDED``, oldest ``creationTimestamp`` first (the learned workload counts the pods it
        has not seen as arrivals in that order; those without one last, by UID). ``on_error``: a pod whose update raises is reported there and skipped
        (cluster mode quarantines it) instead of stopping the list.
        """
        intents = sorted(intents, key=lambda i: (not i.created_at, i.created_at, i.uid))
        listed = {i.uid for i in intents}
        for uid, rec in list(self.pods.items()):
            if uid not in listed and rec.assumed_until is None and not uid.startswith(CLAIM_RECORD_PREFIX):
                self.remove_pod(uid)
        for intent in intents:
            try:
                self.apply_pod_event("ADDED", intent)
            except Exception as exc:  # one pod must never stop the others' sync
                if on_error is None:
                    raise
                log.exception("pod %s: cache update failed", intent.key)
                on_error(intent, exc)

    def set_namespaces(self, labels: dict[str, dict[str, str]]) -> None:
        """Every namespace's labels (a full list, from the namespace watch)."""
        self.tenancy.set_labels(labels)
        self.generation += 1

    def upsert_namespace(self, name: str, labels: dict[str, str] | None) -> None:
        """One namespace's labels changed (None: it was deleted)."""
        self.tenancy.upsert_labels(name, labels)
        self.generation += 1

    def pending(self, limit: int) -> list[PodIntent]:
        """Up to ``limit`` pods that ask for GPUs and are not bound, oldest event first."""
        return list(islice((rec.intent for rec in self.pods.values() if is_pending(rec)), limit))

    def shows_bound(self, uid: str, node: str, gpu_uuids: Sequence[str]) -> bool:
        """True when the pod watch has shown the pod bound to ``node`` on exactly
        ``gpu_uuids`` and it is counted in full (confirmed, not assumed, not an over-commit)."""
        rec = self.pods.get(uid)
        return (rec is not None and rec.allocation is not None and rec.assumed_until is None
                and not rec.overcommit_reason and rec.allocation.node == node and rec.gpu_uuids == tuple(gpu_uuids))

    def remove_pod(self, uid: str) -> bool:
        """Forget a pod (deleted) and free what it held; unknown UIDs are ignored.

        Returns
        -------
        bool
            True if GPU share was freed (pods waiting for a GPU may fit now).
        """
        rec = self.pods.get(uid)
        self.store(uid, None)
        if rec is not None and rec.allocation is not None:
            self.release(rec)
            self.generation += 1
            if rec.allocation.gpu_cols:
                self.state.workload.depart()
            return bool(rec.allocation.gpu_cols)
        return False
