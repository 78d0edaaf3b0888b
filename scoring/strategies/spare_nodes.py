"""Spare nodes: keep as many ``k``-GPU slots free as the ``k``-GPU pods still to come need.

Notes
-----
A pod of ``k`` GPUs needs ``k`` free GPUs on one node; the per-GPU terms (``gap_price``)
value each free GPU alone and cannot see that the last empty 8-GPU node is worth more than 8
empty GPUs spread over 2-GPU nodes. On the model-constrained openb variants
(``benchmarks/constrain.py``) that cost the most: at 100 % arrived on ``default-m20`` seed 48,
34 pods of 8 GPUs had failed while 84 GPUs of 2-GPU T4 nodes stood empty, because pods that
could have used the T4s had broken the 8-GPU nodes first.

With the learned workload's share of GPU demand from ``k``-GPU pods ``phi_k`` (``n_t`` pods of
type ``t``, ``k_t`` GPUs of share ``r_t``; every type counted, not only the most frequent
ones FGD and ``gap_price`` see: 8-GPU pods are rare as types and large as demand), the cluster's free GPU share ``F`` (milli, healthy
GPUs), ``c_i`` the wholly free GPUs of node ``i`` and ``E_k = sum_i floor(c_i / k)`` the
``k``-GPU pods the free GPUs can still take (slots)::

    phi_k  = sum_{t: k_t = k} n_t k_t r_t / sum_t n_t k_t r_t
    mu_k   = phi_k * F / (1000 k)                 (k-GPU pods to come while the free share fills)
    P_k    = P(Poisson(mu_k) >= E_k)               (every slot will be needed)

``P_k`` is this strategy's cluster-wide term (``cluster_term``, ``spare_need``), computed once
per evaluation from the whole cluster,
with the normal approximation ``1/2 erfc((E_k - 1/2 - mu_k) / sqrt(2 mu_k))``. A placement
that leaves a node with ``c'`` wholly free GPUs out of ``c`` costs, in the units of
``gap_price``::

    cost  = sum_k (floor(c / k) - floor(c' / k)) 1000 k P_k   (milli-GPU of k-GPU pods expected to fail)
    score = 1/2 - cost / 2000                                 (clipped to [0, 1])

so a placement that closes no slot scores 1/2. Slots, not nodes: counting the nodes with at
least ``k`` free GPUs made a second 4-GPU pod on a half-used 8-GPU node cost a whole spare
node while the same pod on an empty node cost nothing for ``k = 4`` (8 -> 4 free keeps it
spare), so 4-GPU pods spread one per node (cold-start benchmark, 60 pods of 4 GPUs on 500
empty nodes: 59 nodes touched, an 8-GPU pod fits on 441; with slots 30 and 470, as bestfit).
On openb the two counts give the same median (seeds 42-51: 3.778 % against 3.777 %).

This is the reservation view of online bin packing with
items of several sizes (keep capacity for the large items in proportion to their expected
arrivals; e.g. the "Harmonic" family's separate bins per size class, Lee and Lee, JACM 32(3),
1985); the Poisson tail is ours. Pods restricted to some models are not told apart here: a
node counts as spare for ``k`` whatever model it has.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from scoring.fit import FitContext
from scoring.memo import Memo
from scoring.reduce import clip
from scoring.request import MILLI_PER_GPU
from scoring.row_totals import RowTotals
from scoring.state import ClusterState

NAME = "spare_nodes"

TERM = "spare_need"
"""This strategy's cluster-wide term (``cluster_term``): ``(k, P_k)`` per multi-GPU pod size."""

TERM_TOLERANCE = 0.01
"""The shipped drift allowed before every kept row is scored anew (``scoring.incremental``):
0.01 of any ``P_k`` (``benchmarks/README.md``)."""

SpareNeed = tuple[tuple[int, float], ...]
"""``(k, P_k)``, ascending ``k``."""

gpu_score = None
"""A node property: the GPUs are chosen by the other terms."""


def node_score(ctx: FitContext, chosen: NDArray[np.bool_]) -> NDArray[np.float64]:
    """``1/2 - cost / 2000`` per node (module notes).

    Parameters
    ----------
    ctx : FitContext
    chosen : ndarray of shape (m, max_gpus), bool
        GPUs the pod takes on each node.

    Returns
    -------
    ndarray of shape (m,), float64
        In [0, 1]; 1/2 where the node stays spare for every size, or none is asked for.
    """
    m = chosen.shape[0]
    need = ctx.terms.get(TERM, ())
    if not isinstance(need, tuple) or not need:
        return np.full(m, 0.5)
    healthy = ctx.gpu_exists if ctx.gpu_healthy is None else ctx.gpu_exists & ctx.gpu_healthy
    whole = healthy & (ctx.free_milli >= MILLI_PER_GPU)
    before = whole.sum(axis=1)
    after = before - (whole & chosen).sum(axis=1)
    cost = np.zeros(m)
    for k, p in need:
        cost += (before // k - after // k) * (MILLI_PER_GPU * k * p)
    score: NDArray[np.float64] = clip(0.5 - cost / 2000.0, 0.0, 1.0)
    return score


def spare_need(share_by_gpus: dict[int, int], free_share_milli: float,
               nodes_by_whole_free: Sequence[int]) -> SpareNeed:
    """``(k, P_k)`` for every ``k >= 2`` of the workload (module notes).

    Parameters
    ----------
    share_by_gpus : dict of int to int
        ``WorkloadModel.share_by_gpu_count()``: GPU share of the learned demand by GPUs per
        pod, milli-GPU.
    free_share_milli : float
        ``F``: free share of the healthy GPUs, milli-GPU, >= 0.
    nodes_by_whole_free : sequence of int
        Element ``c``: the nodes with ``c`` wholly free healthy GPUs (``np.bincount`` of the
        per-node counts), >= 0.

    Returns
    -------
    tuple of (int, float)
        Ascending ``k``; ``P_k`` in [0, 1]. Empty without multi-GPU demand.
    """
    total = float(sum(share_by_gpus.values()))
    by_free = [(c, int(n)) for c, n in enumerate(nodes_by_whole_free) if n]
    out = []
    for k in sorted(share_by_gpus):
        if k < 2:
            continue
        mu = share_by_gpus[k] / total * free_share_milli / (MILLI_PER_GPU * k)
        spare = sum(n * (c // k) for c, n in by_free)  # E_k = sum_i floor(c_i / k)
        p = 0.0 if mu <= 0 else 0.5 * math.erfc((spare - 0.5 - mu) / math.sqrt(2.0 * mu))
        out.append((int(k), min(max(p, 0.0), 1.0)))
    return tuple(out)


@dataclass(slots=True)
class _Last:
    """The last ``spare_need`` computed: for which state, at which version and shares."""

    state: weakref.ref[ClusterState] | None = None
    key: tuple[object, ...] = ()
    need: SpareNeed = ()
    sums: RowTotals = field(default_factory=RowTotals)
    """Free share of the healthy GPUs, and the nodes by wholly free GPUs (``_node_free``)."""


def _node_free(state: ClusterState, rows: NDArray[np.int64] | slice) -> NDArray[np.int64]:
    """Per node of ``rows`` (m, 2 + max_gpus): the free share (milli) of its healthy GPUs,
    then one-hot its number of wholly free healthy GPUs (0..max_gpus)."""
    healthy_free = np.where(state.gpu_healthy[rows], clip(state.gpu_free_milli[rows], 0, MILLI_PER_GPU), 0)
    whole = (healthy_free >= MILLI_PER_GPU).sum(axis=1)
    out = np.zeros((healthy_free.shape[0], 2 + state.gpu_healthy.shape[1]), dtype=np.int64)
    out[:, 0] = healthy_free.sum(axis=1)
    out[np.arange(out.shape[0]), 1 + whole] = 1
    return out


def _node_free_row(state: ClusterState, row: int) -> list[int]:
    """``_node_free`` of one node, as integers."""
    healthy_free = [min(max(f, 0), MILLI_PER_GPU) if ok else 0
                    for f, ok in zip(state.gpu_free_milli[row].tolist(), state.gpu_healthy[row].tolist(), strict=True)]
    out = [sum(healthy_free)] + [0] * (1 + len(healthy_free))
    out[1 + sum(f >= MILLI_PER_GPU for f in healthy_free)] = 1
    return out


def cluster_term(state: ClusterState, memo: Memo) -> SpareNeed:
    """``spare_need`` of the state's workload and free GPUs; kept in ``memo`` while the
    state's version and the workload's shares stay (filter and prioritize of one pod). The
    sums over nodes are kept too and read again only for the nodes whose row moved
    (``scoring.row_totals``): a bind changes one node of thousands."""
    shares = state.workload.share_by_gpu_count()
    key = (state.version, tuple(sorted(shares.items())))
    last = memo.slot(NAME, _Last)
    if last.state is not None and last.state() is state and last.key == key:
        return last.need
    sums = last.sums.of(state, _node_free, _node_free_row)
    last.need = spare_need(shares, float(sums[0]), sums[1:])
    last.state, last.key = weakref.ref(state), key
    return last.need


def term_drift(frozen: object, now: object) -> float:
    """The largest change of a ``P_k`` (a size missing from one counts as 0 there)."""
    pa = dict(frozen) if isinstance(frozen, tuple) else {}
    pb = dict(now) if isinstance(now, tuple) else {}
    return max((abs(pa.get(k, 0.0) - pb.get(k, 0.0)) for k in pa.keys() | pb.keys()), default=0.0)
