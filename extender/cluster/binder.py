"""``KubeBinder``: the cluster-mode bind.

Hold the allocation as assumed in the cache (the fit re-checked under the cache lock), then
create the Binding carrying the allocation record as annotations, which the API server
writes onto the pod together with ``spec.nodeName``. If the call fails the assumed
allocation is given back and the error goes to kube-scheduler. With a ``ClaimFence``
(``--fence-namespace``, for more than one replica) the allocation is first claimed on the
node's ledger by compare-and-swap (``extender.fence``), binds to one node sharing one claim
write (group commit, ``extender.cluster.group_commit``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from datetime import UTC, datetime
from typing import Any, NoReturn

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from extender.cache import BindError, ClaimedAllocation, GpuCache, PodRecord, Receipt
from extender.cluster.claim_allocator import ClaimBinding, shaped
from extender.cluster.group_commit import NodeGroup, Queued
from extender.cluster.loop_api import LoopApi
from extender.cluster.objects import CLAIM_READ_BUDGET_S, HTTP_CONFLICT, MAX_ABSENT, WATERMARK_WAIT_S
from extender.cluster.pod_api import binding, bound_there, create_binding, read_pod
from extender.fence import Claim, ClaimFence, ClaimLedger, FenceConflict
from podspec.pods import PodIntent, allocation_annotations

log = logging.getLogger(__name__)

MAX_RECEIVED = 4096
"""Fenced binds held on receipt and not yet in a group commit, at most; past it (after the
holds whose TTL ran out are dropped) a bind takes no receipt hold. An entry is never dropped
while its hold can live: the group commit must find it to choose again against the ledger."""


class KubeBinder:
    """Cluster-mode bind: assume, then one Binding that also writes the allocation record.

    Parameters
    ----------
    api : kubernetes.client.CoreV1Api
    cache : GpuCache
    assume_ttl_s : float
        Passed to ``GpuCache.assume``.
    now : callable returning a timezone-aware datetime, optional
        For the ``gpufrac.io/assigned-at`` timestamp.
    fence : ClaimFence, optional
        Fence every bind with a claim on the node's ledger first (two writes per bind).
        None: one write, safe only while one instance binds.
    api_timeout_s : float, optional
        Limit of each API call a bind makes, seconds (``Settings.bind_api_timeout_s``).
    """

    def __init__(self, api: client.CoreV1Api, cache: GpuCache, assume_ttl_s: float,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC),
                 fence: ClaimFence | None = None, api_timeout_s: float = 4.0) -> None:
        self._api = api
        self._timeout_s = api_timeout_s
        self._cache = cache
        self._ttl = assume_ttl_s
        self._now = now
        self.fence = fence
        self._groups_guard = threading.Lock()
        self._absent: dict[str, float] = {}
        self._groups: dict[str, NodeGroup] = {}
        self._received: dict[str, tuple[str, float]] = {}  # fenced: UID -> (node, monotonic end of its hold)
        # The pod watch's progress (set by ClusterSync): fenced binds wait for a ledger's
        # watermark, and drop claims of pods it shows bound (extender.fence).
        self.pods_rv: Callable[[], int | None] = lambda: None
        self.bound_rv: Callable[[str], int | None] = lambda uid: None
        # --allocate-claims (set by create_app): pods whose ResourceClaims gpufrac allocates.
        self.claims: ClaimBinding | None = None
        # Unfenced binds write their Binding from the event loop with it (set by create_app).
        self.loop_api: LoopApi | None = None

    def _node_lock(self, node: str) -> threading.Lock:
        """The node's lock: unfenced binds hold it around assume; fenced ones go through
        the same node's group commit (``NodeGroup.cond`` wraps this lock)."""
        return self._group(node).lock

    def _ensure_known(self, uid: str, namespace: str, name: str) -> None:
        """Bind may come before the pod watch delivered the pod: read it once
        (``pod_api.read_pod``; its ``BindError``)."""
        if self._cache.pod_intent(uid) is None:
            read_pod(self._api, self._cache, uid, namespace, name, self._timeout_s)

    def bind(self, uid: str, namespace: str, name: str, node: str) -> None:
        """Bind one pod to ``node`` with the GPUs gpufrac chooses there.

        Fenced, every API read (the ledger the first time, claimed pods the pod watch has
        not shown yet) happens before the node lock is taken; under it, only the claim's
        compare-and-swap write.

        Raises
        ------
        BindError
            The pod does not fit any more (another bind took the share), is unknown to the
            API, or the Binding failed; nothing stays held, and nothing was written.
        """
        self._ensure_known(uid, namespace, name)
        intent = self._cache.pod_intent(uid) if self.claims is not None else None
        if intent is not None and intent.resource_claims and self._bind_claims(intent, node):
            return
        # Outside the node lock: the share is held (and claimed); other binds to the node go on.
        record = self._record(self._hold(uid, namespace, name, node))
        try:
            self._create_binding(uid, namespace, name, node, record)
        except ApiException as exc:
            if exc.status == HTTP_CONFLICT and self._bound_there(uid, namespace, name, node):
                return  # a retried bind whose first attempt went through, or another instance's
            self._refused(uid, namespace, name, node, exc)

    def bind_on_loop(self, uid: str, namespace: str, name: str, node: str) -> Coroutine[Any, Any, None] | None:
        """``bind`` as a coroutine for the event loop, where it needs no blocking call: not
        fenced, a pod the cache knows, without ResourceClaims gpufrac allocates, and a
        ``LoopApi`` to write with. None otherwise: the caller runs ``bind`` in a worker.

        The same steps as ``bind``: the GPUs chosen and held under the node lock (held only
        around in-memory work, by every bind), the Binding written (``LoopApi``, no thread),
        a 409 read back in a worker thread (``pod_api.bound_there``, rare). Cancelled (the
        extender stopping) after the hold, it leaves the hold to its TTL and the pod watch, as
        a bind whose API call timed out does.

        Raises
        ------
        BindError
            As ``bind`` (raised when the coroutine is awaited).
        """
        api = self.loop_api
        if api is None or self.fence is not None:
            return None
        intent = self._cache.pod_intent(uid)
        if intent is None or (self.claims is not None and intent.resource_claims):
            return None
        return self._bind_on_loop(api, uid, namespace, name, node)

    async def _bind_on_loop(self, api: LoopApi, uid: str, namespace: str, name: str, node: str) -> None:
        record = self._record(self._hold(uid, namespace, name, node))
        try:
            await api.write_json("POST", *binding(uid, namespace, name, node, record), timeout_s=self._timeout_s)
        except ApiException as exc:
            if exc.status == HTTP_CONFLICT and await asyncio.to_thread(self._bound_there, uid, namespace, name, node):
                return
            self._refused(uid, namespace, name, node, exc)
        except Exception:  # a bug: nothing is held for a Binding of unknown fate (the pod watch counts one written)
            self._cache.forget(uid)
            raise

    def _record(self, rec: PodRecord) -> dict[str, str]:
        """The allocation record of a hold (``podspec.pods.allocation_annotations``)."""
        alloc = rec.allocation
        assert alloc is not None
        return allocation_annotations(rec.gpu_uuids, alloc.gpu_milli, alloc.gpu_memory_mib, self._now())

    def _refused(self, uid: str, namespace: str, name: str, node: str, exc: ApiException) -> NoReturn:
        """The Binding was not written: give the hold back and refuse the bind."""
        self._cache.forget(uid)
        raise BindError(f"gpufrac: binding pod {namespace}/{name} to {node}: {exc.status} {exc.reason}") from None

    def hold_on_receipt(self, uid: str, namespace: str, name: str, node: str) -> None:
        """``bind``'s hold, taken on the caller's thread as the bind arrives (a pod the cache
        knows, no ResourceClaims: no API call), so that filters answered before ``bind`` runs
        in its worker count it. Unfenced, ``bind`` finds it held (``GpuCache.assume``). Fenced,
        it was chosen without the node's ledger: the group commit keeps it only where nothing
        but this instance's own holds moved the node since, else gives it back and chooses
        again against the ledger (``Receipt.AGAIN``). A refusal is left to ``bind`` to answer."""
        intent = self._cache.pod_intent(uid)
        if intent is None or (self.claims is not None and intent.resource_claims):
            return
        if self.fence is not None and len(self._received) >= MAX_RECEIVED:
            now = time.monotonic()
            for u in [u for u, got in list(self._received.items()) if got[1] <= now]:  # TTL over: no hold left
                self._received.pop(u, None)
            if len(self._received) >= MAX_RECEIVED:
                return
        with contextlib.suppress(BindError), self._node_lock(node):
            self._cache.assume(uid, namespace, name, node, ttl_s=self._ttl,
                               receipt=Receipt.NONE if self.fence is None else Receipt.HOLD)
            if self.fence is not None:
                self._received[uid] = (node, time.monotonic() + self._ttl)

    def _held_on_receipt(self, uid: str, node: str) -> bool:
        """Whether ``hold_on_receipt`` held the pod on ``node`` (fenced); forgets that it did."""
        got = self._received.pop(uid, None)
        return got is not None and got[0] == node

    def _hold(self, uid: str, namespace: str, name: str, node: str, shape: PodIntent | None = None) -> PodRecord:
        """Choose the pod's GPUs on ``node`` and hold them (``GpuCache.assume``; ``shape``: what
        its claims ask): fenced, in the node's group commit; else under the node lock.

        Raises
        ------
        BindError
            The pod does not fit, or (fenced) its claim could not be written.
        """
        if self.fence is not None:
            try:
                self._read_claimed_pods(node)
                return self._assume_and_claim(uid, namespace, name, node, shape)
            except Exception:
                if self._held_on_receipt(uid, node):  # refused before its group commit chose again
                    self._cache.forget(uid)
                raise
        with self._node_lock(node):
            # Choose and hold: serialized per node here and by the cache lock inside,
            # so of two binds racing for the last share exactly one gets it.
            return self._cache.assume(uid, namespace, name, node, ttl_s=self._ttl, shape=shape)

    def _bind_claims(self, intent: PodIntent, node: str) -> bool:
        """Bind a pod whose ResourceClaims gpufrac allocates (``extender.cluster.claim_allocator``,
        module notes 3); False when none of them is of gpufrac's driver (a plain bind then).

        Raises
        ------
        BindError
            What the claims ask cannot be allocated there, a claim or the Binding cannot be
            written; what was written is undone, nothing stays held.
        """
        assert self.claims is not None
        placement, writer, book = self.claims.placement, self.claims.writer, self.claims.book
        uid, ns, name = intent.uid, intent.namespace, intent.name
        try:
            plan = placement.plan(intent)
        except ValueError as exc:
            raise BindError(str(exc)) from None
        if plan is None:
            return False
        if plan.node and plan.node != node:
            raise BindError(f"gpufrac: pod {intent.key}: its claims are allocated on node {plan.node}, not {node}")
        rec = self._hold(uid, ns, name, node, shaped(intent, plan))  # fenced as any bind (claim_allocator, 4)
        if len(rec.gpu_uuids) != plan.gpu_count:  # a record already here, not a hold of ours: leave it be
            raise BindError(f"gpufrac: pod {intent.key} is already bound to {node}, or another instance's bind "
                            "of it is in flight there; kube-scheduler retries", "conflict")
        try:
            written = writer.allocate(plan, intent, node, rec.gpu_uuids)
        except BindError:
            self._cache.forget(uid, intent)
            raise
        with self._node_lock(node):  # no bind chooses on this node between the two: the share moves
            if plan.gpu_count:
                self._cache.forget(uid, intent)  # the pod holds no GPU of its own: its claims do
            for obj in written:
                book.apply("MODIFIED", obj)
        try:
            self._create_binding(uid, ns, name, node, {})
        except ApiException as exc:
            if not (exc.status == HTTP_CONFLICT and self._bound_there(uid, ns, name, node)):
                for obj in writer.undo(written, intent, {v.uid for v, _a in plan.asks}):
                    book.apply("MODIFIED", obj)
                self._cache.forget(uid, intent)
                raise BindError(f"gpufrac: binding pod {ns}/{name} to {node}: {exc.status} {exc.reason}") from None
        log.info("allocated claim(s) %s of pod %s on %s: GPUs %s", ", ".join(
            f"{ns}/{v.name}" for v in plan.claims), intent.key, node, ",".join(rec.gpu_uuids) or "-")
        return True

    def _unseen_claims(self, ledger: ClaimLedger) -> list[ClaimedAllocation]:
        """Live foreign claims of pods neither the cache knows nor a read found absent."""
        now = time.monotonic()
        return [c for c in self._claimed(ledger)
                if self._cache.pod_intent(c.uid) is None and self._absent.get(c.uid, 0.0) <= now]

    def _read_claimed_pods(self, node: str) -> None:
        """Before the node lock: read ``node``'s ledger if never seen, and the pods its live
        claims name that the cache has not seen (newest first, for at most
        ``CLAIM_READ_BUDGET_S``). A pod that is gone or recreated holds nothing, and is not
        read again while its claim lives.

        Raises
        ------
        BindError
            The ledger cannot be read, or the budget ran out with pods left to read (the
            next try goes on where this one stopped).
        """
        fence = self.fence
        assert fence is not None
        try:
            with self._group(node).reading:  # one first read of the ledger, however many binds arrive
                ledger = fence.view(node)
        except ApiException as exc:
            raise BindError(f"gpufrac: reading the claim ledger of {node}: {exc.status} {exc.reason}") from None
        except (OSError, urllib3.exceptions.HTTPError) as exc:  # no answer (the client raises these as they are)
            raise BindError(f"gpufrac: reading the claim ledger of {node}: {type(exc).__name__}") from None
        deadline = time.monotonic() + WATERMARK_WAIT_S
        while not self._reached(ledger):  # the watch moves on in its own thread
            if time.monotonic() > deadline:
                raise BindError(f"gpufrac: the pod watch is behind the claim ledger of {node} (revision "
                                f"{self.pods_rv()} < {ledger.watermark}); kube-scheduler retries the pod")
            time.sleep(0.002)
            ledger = fence.view(node)
        unseen = self._unseen_claims(ledger)
        deadline = time.monotonic() + CLAIM_READ_BUDGET_S
        for i, c in enumerate(reversed(unseen)):
            if time.monotonic() > deadline:
                raise BindError(f"gpufrac: the claim ledger of {node} names {len(unseen) - i} pods not read yet "
                                f"(read {i} in {CLAIM_READ_BUDGET_S:.0f} s); kube-scheduler retries the pod")
            try:
                self._ensure_known(c.uid, c.namespace, c.name)
            except BindError:
                # Deleted or recreated: counted as nothing (ClaimCount.UNKNOWN).
                if len(self._absent) >= MAX_ABSENT:
                    self._absent = {u: t for u, t in list(self._absent.items()) if t > time.monotonic()}
                self._absent[c.uid] = time.monotonic() + c.ttl_s
        if self.claims is not None:  # claim pods bound there: wait a moment for the claim watch
            deadline = time.monotonic() + WATERMARK_WAIT_S
            while self.claims.behind(ledger, fence) and time.monotonic() <= deadline:
                time.sleep(0.002)

    def _reached(self, ledger: ClaimLedger) -> bool:
        """True when this instance's pod watch has applied every pod event up to the
        ledger's watermark, so the claims dropped below it are counted by the pods."""
        if ledger.watermark == 0:
            return True
        rv = self.pods_rv()
        return rv is not None and rv >= ledger.watermark

    def _shown_bound(self, claim: Claim) -> int | None:
        """The pod-event revision the pod watch showed ``claim`` bound at; None while not (it stays)."""
        rv = self.bound_rv(claim.uid)
        if rv is None or not self._cache.shows_bound(claim.uid, claim.node, claim.gpu_uuids):
            return None
        return rv

    def _live_claims(self, node: str) -> tuple[ClaimLedger, list[ClaimedAllocation]]:
        """Under the node lock, no API call: ``node``'s ledger as last seen, and its live
        claims by other instances, for ``GpuCache.assume`` to count under its lock.

        Raises
        ------
        BindError
            A live claim names a pod that was neither read nor found absent (its claim
            arrived after ``_read_claimed_pods``): counting nothing for it could
            over-commit, so the bind is refused and retried.
        """
        fence = self.fence
        assert fence is not None
        ledger = fence.view(node)  # kept since _read_claimed_pods: no API read
        if not self._reached(ledger):
            raise BindError(f"gpufrac: the claim ledger of {node} moved past this instance's pod watch; "
                            "kube-scheduler retries the pod")
        if unseen := self._unseen_claims(ledger):
            c = unseen[-1]
            raise BindError(f"gpufrac: the claim ledger of {node} names pod {c.namespace}/{c.name}, "
                            "not seen yet; kube-scheduler retries the pod")
        if self.claims is not None and (behind := self.claims.behind(ledger, fence)):
            raise BindError(f"gpufrac: pod {behind} is bound on {node} with ResourceClaims this instance's "
                            "claim watch has not shown allocated yet; kube-scheduler retries the pod")
        return ledger, self._claimed(ledger)

    def _claimed(self, ledger: ClaimLedger) -> list[ClaimedAllocation]:
        """The live claims of ``ledger`` by other instances (ours are held by our own assume)."""
        fence = self.fence
        assert fence is not None
        return [c.counted(left) for c, left in fence.live(ledger)
                if c.owner != fence.identity and (self.claims is None or self.claims.held(c.uid, c.gpu_uuids) is not True)]

    def fold(self, ledger: ClaimLedger) -> None:
        """Count other instances' live claims of ``ledger`` in the cache now (the claims
        watch), so that filter and prioritize see them before any bind re-counts them."""
        for c in self._claimed(ledger):
            self._cache.count_claim(c)

    def _assume_and_claim(self, uid: str, namespace: str, name: str, node: str,
                          shape: PodIntent | None = None) -> PodRecord:
        """Fenced: choose and hold the pod's GPUs, and commit its claim, in the node's group
        commit (``extender.cluster.group_commit``; ``BindError`` as ``NodeGroup.join``)."""
        group = self._group(node)
        return group.join(Queued(uid, namespace, name, shape), lambda batch: self._commit_group(node, group, batch))

    def _commit_group(self, node: str, group: NodeGroup, batch: list[Queued]) -> None:
        """Assume ``batch`` against one view of ``node``'s ledger and write their claims;
        called with ``group.cond`` held, released around the write only."""
        fence = self.fence
        assert fence is not None
        try:
            seen, claims = self._live_claims(node)
        except BindError as exc:
            for q in batch:
                q.error = exc
            return
        for q in batch:
            # Held on receipt without the ledger: kept or chosen again (Receipt.AGAIN).
            again = Receipt.AGAIN if self._held_on_receipt(q.uid, node) else Receipt.NONE
            try:
                q.record = self._cache.assume(q.uid, q.namespace, q.name, node, ttl_s=self._ttl, claims=claims,
                                              shape=q.shape, receipt=again)
            except BindError as exc:
                q.error = exc
        assumed = [q for q in batch if q.error is None]
        if not assumed:
            return
        ours = []
        for q in assumed:
            rec = q.record
            assert rec is not None and rec.allocation is not None
            if rec.gpu_uuids:  # a pod holding no GPU (its claims allocated already) fences nothing
                ours.append(fence.claim_of(q.uid, q.namespace, q.name, node, rec.gpu_uuids,
                                           rec.allocation.gpu_milli, rec.allocation.gpu_memory_mib))
        if not ours:
            return
        failed: BindError | None = None
        try:
            with group.released():
                fence.commit_all(seen, ours, bound_rv=self._shown_bound)
        except FenceConflict as exc:
            failed = BindError(f"gpufrac: {exc}: another gpufrac instance bound there first; "
                               "kube-scheduler retries the pod", "conflict")
        except ApiException as exc:
            failed = BindError(f"gpufrac: writing the claim ledger of {node}: {exc.status} {exc.reason}")
        if failed is not None:
            for q in assumed:
                self._cache.forget(q.uid)
                q.error = failed

    def _group(self, node: str) -> NodeGroup:
        """The node's lock and commit group, only for a node the cache knows (bind bodies are untrusted)."""
        with self._groups_guard:
            group = self._groups.get(node)
        if group is None and node not in self._cache.gpu_rooms([node]):
            raise BindError(f"gpufrac: node {node!r} not in gpufrac's cache")
        with self._groups_guard:
            return self._groups.setdefault(node, NodeGroup())

    def _create_binding(self, uid: str, namespace: str, name: str, node: str,
                        annotations: Mapping[str, str]) -> None:
        create_binding(self._api, uid, namespace, name, node, annotations, self._timeout_s)

    def _bound_there(self, uid: str, namespace: str, name: str, node: str) -> bool:
        return bound_there(self._api, self._cache, uid, namespace, name, node, self._timeout_s)
