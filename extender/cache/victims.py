"""Preemption's victim search: on one node, the fewest lowest-class pods whose removal makes
a pod fit (the ``preempt`` verb, through ``GpuCache.preempt``), within a budget.

``preempt`` walks the candidate nodes, taking the cache lock per node, never across the
whole search; each node's search (``victims_on``) runs on a one-row copy of the state
(``ClusterState.rows_copy``): the live arrays are never changed.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from extender.cache.ledger import Ledger
from extender.cache.records import PodRecord
from extender.translate import inbound
from podspec.pods import PodIntent
from scoring.fit import cluster_terms, fit
from scoring.request import PodRequest, QoSPolicy
from scoring.specs import Allocation
from scoring.state import ClusterState

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PreemptBudget:
    """Bounds of one ``preempt`` call's victim search.

    Attributes
    ----------
    max_victims : int
        Candidates considered per node (the lowest classes and priorities first); a pod
        never needs more victims than a GPU has replica slots, times its GPUs.
    max_tries : int
        Fit checks per node: exact search by set size while it lasts, then a greedy set.
    time_s : float
        Wall time for the whole call; nodes not reached by then are left out (kube-scheduler
        then considers only the nodes answered).
    """

    max_victims: int = 128
    max_tries: int = 512
    time_s: float = 1.0


def preempt(lock: AbstractContextManager[Any], ledger: Ledger, intent: PodIntent, nodes: Iterable[str],
            budget: PreemptBudget) -> dict[str, list[str]]:
    """Victims that would make ``intent`` fit, per candidate node (``GpuCache.preempt``).

    On each node, the smallest set of pods with a lower priority (kube-scheduler's rule) and
    a lower QoS class (gpufrac's) that makes the pod fit; the lowest classes, then
    priorities, first (``victims_on``). Nodes where it fits already or no set works are left
    out: the result maps node name -> victim pod UIDs.

    ``lock`` (the cache's) is taken for the one pass that finds the pods on the candidate
    nodes and then per node, so filter, bind and the watches go on between nodes; after
    ``budget.time_s`` the nodes answered so far are returned.
    """
    deadline = time.monotonic() + budget.time_s
    nodes = list(nodes)
    with lock:
        if ledger.tenancy.admission(intent, inbound.admission_memory_mib(intent)) is not None:
            return {}
        on_node: dict[str, list[str]] = {n: [] for n in nodes}
        for uid, rec in ledger.pods.items():
            if rec.allocation is not None and rec.allocation.node in on_node:
                on_node[rec.allocation.node].append(uid)
    out: dict[str, list[str]] = {}
    for node in nodes:
        if time.monotonic() > deadline:
            log.info("preempt for %s: time budget spent; answering %d node(s)", intent.key, len(out))
            break
        with lock:
            state = ledger.state
            victims = victims_on(state, ledger.scorer.qos_policy, intent, inbound.pod_request(intent, state), node,
                                 [(uid, ledger.pods.get(uid)) for uid in on_node[node]], budget, deadline)
        if victims:
            out[node] = victims
    return out


def fewest_victims(eligible: list[tuple[str, PodRecord]],
                    fits_without: Callable[[Sequence[tuple[str, PodRecord]]], bool],
                    max_tries: int, deadline: float) -> list[str]:
    """The first (in ``eligible`` order) smallest victim set that makes the pod fit.

    Exact while ``max_tries`` fit checks last (every set of size 1, then 2...), then the
    greedy set: the shortest working prefix of ``eligible``, less any member not needed
    (while the deadline allows). Empty when even all of ``eligible`` does not make it fit.
    """
    if not eligible or not fits_without(eligible):
        return []
    tries = 0
    for size in range(1, len(eligible)):
        for combo in itertools.combinations(eligible, size):
            tries += 1
            if tries > max_tries or time.monotonic() > deadline:
                return _greedy_victims(eligible, fits_without, deadline)
            if fits_without(combo):
                return [uid for uid, _ in combo]
    return [uid for uid, _ in eligible]


def _greedy_victims(eligible: list[tuple[str, PodRecord]],
                    fits_without: Callable[[Sequence[tuple[str, PodRecord]]], bool],
                    deadline: float) -> list[str]:
    """Shortest prefix of ``eligible`` that works (by bisection: fitting only grows with
    the prefix), then drop any member not needed while time is left."""
    lo, hi = 1, len(eligible)
    while lo < hi:
        mid = (lo + hi) // 2
        if fits_without(eligible[:mid]):
            hi = mid
        else:
            lo = mid + 1
    chosen = list(eligible[:hi])
    for member in reversed(list(chosen)):
        if time.monotonic() > deadline:
            break
        rest = [v for v in chosen if v is not member]
        if rest and fits_without(rest):
            chosen = rest
    return [uid for uid, _ in chosen]


def victims_on(state: ClusterState, policy: QoSPolicy, intent: PodIntent, request: PodRequest,
               node: str, records: Sequence[tuple[str, PodRecord | None]], budget: PreemptBudget,
               deadline: float) -> list[str]:
    """The victims on one node (``GpuCache.preempt`` calls it under its lock).

    Parameters
    ----------
    state : ClusterState
        Read only: the search runs on a one-row copy.
    policy : QoSPolicy
        The scorer's QoS rules.
    intent, request : PodIntent, PodRequest
        The preemptor, and its request against ``state``.
    node : str
    records : sequence of (uid, PodRecord or None)
        The pods that were on the node when the call began, as the cache holds them now
        (those still there are candidates).
    budget : PreemptBudget
    deadline : float
        ``time.monotonic()`` after which the search stops.

    Returns
    -------
    list of str
        Victim UIDs; empty when the pod fits already or no set works.
    """
    row = state.node_index.get(node)
    if row is None:
        return []
    scratch = state.rows_copy(np.array([row], dtype=np.int64))
    rows = np.zeros(1, dtype=np.int64)
    if fit(scratch, request, rows, policy).node_fits[0]:
        return []
    eligible = sorted(
        ((uid, rec) for uid, rec in records
         if rec is not None and rec.allocation is not None and rec.allocation.node == node
         and rec.intent.priority < intent.priority and rec.intent.qos > intent.qos),
        key=lambda ur: _victim_order(ur[1]))
    eligible = eligible[:budget.max_victims]
    return fewest_victims(eligible, fits_without(scratch, request, policy, eligible), budget.max_tries, deadline)


def fits_without(scratch: ClusterState, request: PodRequest, policy: QoSPolicy,
                 candidates: Sequence[tuple[str, PodRecord]]) -> Callable[[Sequence[tuple[str, PodRecord]]], bool]:
    """The check ``fewest_victims`` calls, on a one-row copy of the state (``ClusterState.rows_copy``):
    whether ``request`` fits its one node once the given pods' allocations are taken off (they
    are put back before it returns).

    ``candidates`` are the pods it may be asked about: their allocations are renamed to the
    copy's node once, and the cluster terms computed once (feasibility does not read them),
    not on every check.
    """
    one = np.zeros(1, dtype=np.int64)
    here = {uid: [replace(a, node=scratch.node_names[0]) for a in rec.held] for uid, rec in candidates}
    terms = cluster_terms(scratch)

    def check(victims: Sequence[tuple[str, PodRecord]]) -> bool:
        done: list[Allocation] = []
        try:
            for uid, _ in victims:
                for alloc in here[uid]:
                    scratch.apply(alloc, -1)
                    done.append(alloc)
            return bool(fit(scratch, request, one, policy, terms).node_fits[0])
        finally:
            for alloc in done:
                scratch.apply(alloc, 1)

    return check


def _victim_order(rec: PodRecord) -> tuple[int, int, int, int]:
    """Sort key of a candidate victim: lowest class first, then lowest priority, then by GPU
    (its first GPU column), then the largest share."""
    cols = rec.allocation.gpu_cols if rec.allocation is not None else ()
    return (-rec.intent.qos, rec.intent.priority, min(cols, default=-1), -rec.gpu_milli_held)
