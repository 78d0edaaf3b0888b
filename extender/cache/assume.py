"""Assume, forget, expire, and other instances' claims: the allocations gpufrac makes.

kube-scheduler's ``AssumePod``/``ForgetPod`` for the GPUs: ``assume`` chooses the GPUs on
the node kube-scheduler picked, re-checks the fit and holds the allocation before the
Binding is written; ``forget`` gives it back when the bind fails; ``expire`` frees those the
pod watch never confirmed. ``count_claim`` counts an allocation another gpufrac instance
claimed (``extender.fence``). Functions of the ``Ledger`` (and the ``Evaluator`` for the
fit); the caller holds the cache lock.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace

from extender.cache import accounting
from extender.cache.evaluation import Evaluator
from extender.cache.ledger import Ledger
from extender.cache.records import BindError, ClaimCount, ClaimedAllocation, PodRecord
from extender.translate import inbound, outbound
from podspec.pods import PodIntent
from scoring.fit import Reason


def assume(ledger: Ledger, evaluator: Evaluator, uid: str, namespace: str, name: str, node: str,
           ttl_s: float | None, claims: Iterable[ClaimedAllocation] = (), shape: PodIntent | None = None) -> PodRecord:
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
    ledger.apply_allocation(rec.intent, alloc)
    ledger.generation += 1
    until = None if ttl_s is None else time.monotonic() + ttl_s
    bound = PodRecord(replace(rec.intent, node_name=node, assigned_gpus=uuids), alloc, uuids, until)
    ledger.store(uid, bound)
    return bound


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
    rec = ledger.pods.get(uid)
    if rec is None or rec.allocation is None or rec.assumed_until is None:
        return False
    ledger.release(rec)
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
