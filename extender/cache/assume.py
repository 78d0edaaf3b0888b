"""Assume, forget, expire, and other instances' claims: the allocations gpufrac makes.

kube-scheduler's ``AssumePod``/``ForgetPod`` for the GPUs: ``assume`` chooses the GPUs on
the node kube-scheduler picked, re-checks the fit and holds the allocation before the
Binding is written; ``forget`` gives it back when the bind fails; ``expire`` frees those the
pod watch never confirmed. ``count_claim`` counts an allocation another gpufrac instance
claimed (``extender.fence``). Functions of the ``Ledger`` (and the ``Evaluator`` for the
fit); the caller holds the cache lock.

A fenced bind is held on receipt, before the node's claim ledger is read, and its group
commit chooses again against the ledger (``Receipt``). Choosing again is what keeps a pod
another instance bound, or a claim counted since, from sharing the hold's GPUs; it is not
needed when nothing of the kind touched the node: every change to the node's row since the
hold (the group's claims counted first) was an assume of this instance, which chose
counting the hold, or a forget, which frees. Anything else (a pod event, a claim counted, an
inventory change, new arrays) breaks that run of the row's versions (``Ledger.own_runs``),
and the hold is given back and the pod chosen again, as before. The kept hold is the choice
the ledger's write is conditioned on, as a chosen-again one would be; its tenant's quota is
checked again without it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace

from extender.cache import accounting
from extender.cache.evaluation import Evaluator
from extender.cache.ledger import Ledger
from extender.cache.records import BindError, ClaimCount, ClaimedAllocation, PodRecord, Receipt
from extender.translate import inbound, outbound
from podspec.pods import PodIntent
from scoring.fit import Reason

MAX_RECEIPT_MARKS = 4096
"""Holds on receipt whose row version the ledger remembers, at most (the oldest is dropped:
a mark lost costs a choice made again, never a wrong count)."""


def assume(ledger: Ledger, evaluator: Evaluator, uid: str, namespace: str, name: str, node: str,
           ttl_s: float | None, claims: Iterable[ClaimedAllocation] = (), shape: PodIntent | None = None,
           receipt: Receipt = Receipt.NONE) -> PodRecord:
    """Choose the GPUs on ``node``, re-check the fit and hold the allocation (``GpuCache.assume``).

    Parameters
    ----------
    ledger, evaluator : Ledger, Evaluator
        The cache's, under its lock.
    uid, namespace, name : str
        The pod (``ExtenderBindingArgs``); ``node``: kube-scheduler's choice.
    ttl_s : float or None
        Cluster mode: seconds the allocation stays assumed before ``expire`` frees it, unless
        the pod watch confirms it first. None: confirmed (standalone).
    claims : iterable of ClaimedAllocation
        Fenced binds: other instances' live claims on ``node``, counted first under the same
        lock (``count_claim``), so nothing frees one between counting and choosing.
    shape : PodIntent, optional
        The pod as placed, when it asks more than its own object says: what its
        ResourceClaims ask (``extender.cluster.claim_allocator``); the held record carries it.
    receipt : Receipt
        A fenced hold on receipt (``HOLD``), or its group commit's choice (``AGAIN``): the
        module notes.

    Returns
    -------
    PodRecord
        The pod with its allocation and GPU UUIDs.

    Raises
    ------
    BindError
        If the pod or node is unknown, the pod is bound elsewhere, it no longer fits, its
        tenant's quota refuses the exact memory, or a claim cannot be counted.
    """
    for c in claims:
        if count_claim(ledger, c) is ClaimCount.BUSY:
            if receipt is Receipt.AGAIN:
                forget(ledger, uid)  # the hold on receipt goes with the refusal
            # The same pod, bound by us elsewhere (or to other GPUs) while the other
            # instance claimed it here: until one of the two binds settles we cannot tell
            # what this node holds.
            raise BindError(f"gpufrac: pod {c.namespace}/{c.name} is claimed on {c.node} by {c.owner} "
                            "while a bind of it by this instance is in flight; kube-scheduler retries", "conflict")
    rec = ledger.pods.get(uid)
    if rec is None:
        raise BindError(f"gpufrac: pod {namespace}/{name} (uid {uid}) unknown: no pod event seen")
    if shape is not None and rec.allocation is None:
        rec = replace(rec, intent=replace(shape, uid=uid))
    if (rec.intent.namespace, rec.intent.name) != (namespace, name):
        raise BindError(f"gpufrac: uid {uid} is pod {rec.intent.key}, not {namespace}/{name}")
    if receipt is Receipt.AGAIN:
        mark = ledger.receipt_marks.pop(uid, None)
        if rec.allocation is not None and rec.assumed_until is not None and rec.allocation.node == node:
            if mark is not None and _kept(ledger, rec, mark):
                return rec
            forget(ledger, uid)
            rec = ledger.pods[uid]
    if rec.allocation is not None:
        if rec.allocation.node == node:
            return rec
        if rec.assumed_until is None:
            raise BindError(f"gpufrac: pod {namespace}/{name} already bound to {rec.allocation.node}")
        # Held but never confirmed elsewhere: another instance's claim whose Binding has not
        # shown up (kube-scheduler would not bind a pod it saw bound). The API decides: a
        # second Binding of one pod is refused there.
        ledger.release(rec)
        rec = PodRecord(replace(rec.intent, node_name="", assigned_gpus=()))
        ledger.store(uid, rec)
        ledger.generation += 1
    state = ledger.state
    if node not in state.node_index:
        raise BindError(f"gpufrac: node {node!r} not in gpufrac's cache")
    row = state.node_index[node]
    request = inbound.pod_request(rec.intent, state)
    ev = evaluator.on_node(state, request, row, ledger.generation)
    if not ev.node_fits[0]:
        msg = outbound.reason_message(Reason(int(ev.reason[0])), request, rec.intent)
        raise BindError(f"{msg} (at bind, on {node})", "no_fit")
    cols = tuple(int(c) for c in ev.chosen_cols[0])
    mem = tuple(int(m) for m in ev.chosen_mem_mib[0])
    rejection = ledger.tenancy.admission(rec.intent, sum(mem))
    if rejection is not None:
        raise BindError(f"{rejection} (at bind)", "quota")
    alloc = inbound.allocation(request, node, cols, request.gpu_milli, mem)
    uuids = tuple(state.gpu_uuid[row][c] for c in cols)
    before = int(state.row_version[row])
    ledger.apply_allocation(rec.intent, alloc)
    _own(ledger, row, before)
    if receipt is Receipt.HOLD:
        marks = ledger.receipt_marks
        if len(marks) >= MAX_RECEIPT_MARKS:
            marks.pop(next(iter(marks)))
        marks[uid] = (ledger.rebuilds, row, before)
    ledger.generation += 1
    until = None if ttl_s is None else time.monotonic() + ttl_s
    bound = PodRecord(replace(rec.intent, node_name=node, assigned_gpus=uuids), alloc, uuids, until)
    ledger.store(uid, bound)
    return bound


def _own(ledger: Ledger, row: int, before: int) -> None:
    """Note that ``row`` went from version ``before`` to its current one by this instance's
    own change (an assume's choice, a forget): the run of own changes goes on when nothing
    else moved the row since its last one, else a new run starts at ``before``."""
    run = ledger.own_runs.get(row)
    first = run[0] if run is not None and run[1] == before else before
    ledger.own_runs[row] = (first, int(ledger.state.row_version[row]))


def _kept(ledger: Ledger, rec: PodRecord, mark: tuple[int, int, int]) -> bool:
    """Whether a hold on receipt stands as the group commit's choice (module notes): the
    same arrays, every change to its row since the hold this instance's own, the record a
    full (not over-committed) hold, and its tenant admitting it without its own share."""
    rebuilds, row, before = mark
    run = ledger.own_runs.get(row)
    alloc = rec.allocation
    if (alloc is None or rebuilds != ledger.rebuilds or run is None or rec.overcommit_reason
            or not run[0] <= before < run[1] or run[1] != int(ledger.state.row_version[row])
            or ledger.state.node_index.get(alloc.node) != row):
        return False
    tenancy = ledger.tenancy
    tenancy.apply(rec.intent.namespace, alloc, -1)
    try:
        return tenancy.admission(rec.intent, sum(alloc.gpu_memory_mib)) is None
    finally:
        tenancy.apply(rec.intent.namespace, alloc, 1)


def count_claim(ledger: Ledger, claim: ClaimedAllocation) -> ClaimCount:
    """Count an allocation another gpufrac instance claimed (``GpuCache.count_claim``).

    Returns ``COUNTED`` (counted now, or already with these GPUs), ``VOID`` (nothing to count:
    bound elsewhere per the pod watch, or the node unknown), ``UNKNOWN`` (no event of the pod
    seen) or ``BUSY`` (held here elsewhere, or on other GPUs, for a bind in flight).
    """
    rec = ledger.pods.get(claim.uid)
    if rec is None:
        return ClaimCount.UNKNOWN
    if rec.allocation is not None:
        if rec.allocation.node != claim.node or rec.gpu_uuids != claim.gpu_uuids:
            return ClaimCount.VOID if rec.assumed_until is None else ClaimCount.BUSY
        if not rec.overcommit_reason:
            return ClaimCount.COUNTED
    state = ledger.state
    if claim.node not in state.node_index:
        return ClaimCount.VOID
    cols = accounting.cols_for_uuids(state, claim.node, claim.gpu_uuids)
    if cols is None or len(cols) != len(claim.gpu_memory_mib) or len(set(cols)) != len(cols):
        return ClaimCount.VOID
    if rec.allocation is not None:
        # Read back as an over-commit (counted only up to what looked free) while the claim
        # says it was committed in full: count it in full, confirmed or not as it was.
        ledger.release(rec, recount=False)
        deadline = rec.assumed_until
    else:
        deadline = time.monotonic() + max(claim.ttl_s, 0.0)
    intent = replace(rec.intent, node_name=claim.node, assigned_gpus=claim.gpu_uuids,
                     assigned_gpu_milli=claim.gpu_milli, assigned_memory_mib=claim.gpu_memory_mib)
    # In full, as the claimant holds it (its assume built the same Allocation): a claim is
    # gpufrac's own record, written by compare-and-swap in gpufrac's namespace, not a pod
    # annotation anyone could forge, and counting it short is what over-commits.
    alloc = inbound.allocation(inbound.pod_request(intent, state), claim.node, cols, claim.gpu_milli,
                               claim.gpu_memory_mib)
    ledger.apply_allocation(intent, alloc)
    ledger.generation += 1
    ledger.store(claim.uid, PodRecord(intent, alloc, claim.gpu_uuids, deadline))
    return ClaimCount.COUNTED


def forget(ledger: Ledger, uid: str, intent: PodIntent | None = None) -> bool:
    """Give back an assumed allocation (``GpuCache.forget``); True if one was freed. ``intent``:
    the pod's record is that pending pod after (the pod's own, when ``assume`` held a shape)."""
    ledger.receipt_marks.pop(uid, None)
    rec = ledger.pods.get(uid)
    if rec is None or rec.allocation is None or rec.assumed_until is None:
        return False
    row = ledger.state.node_index.get(rec.allocation.node)
    before = -1 if row is None else int(ledger.state.row_version[row])
    ledger.release(rec)
    if row is not None:
        _own(ledger, row, before)
    ledger.store(uid, PodRecord(replace(intent or rec.intent, node_name="", assigned_gpus=())))
    ledger.generation += 1
    return True


def expire(ledger: Ledger, now: float) -> list[str]:
    """Free the assumed allocations whose deadline is at or before ``now`` (monotonic
    seconds); their pods' ``ns/name``."""
    expired = [uid for uid, r in ledger.pods.items() if r.assumed_until is not None and r.assumed_until <= now]
    keys = [ledger.pods[uid].intent.key for uid in expired]
    for uid in expired:
        forget(ledger, uid)
    return keys
