"""The work-conserving floor with one saturation point per GPU model, for pod lists whose pods
accept only some models (``work_conserving_floor_by_model``).

Notes
-----
``work_conserving`` takes one saturation point ``a`` for the whole cluster: a pod asking
``<= theta`` that arrives before ``a`` is placed because some GPU has ``theta`` free. With
models that GPU may be of a model the pod refuses, so that floor can only bound restricted
pods from above, and it stays close to the plain floor (``default-m33``, seed 42: 3.11 %
against 3.11 %). Here each model ``j`` has its own point ``t_j``: the number of GPU pods that
arrive while some GPU of model ``j`` still has ``theta`` milli free. Pods never leave, so free
share only shrinks, and a work-conserving scheduler (one that places every pod some GPU of a
model it accepts can hold, on GPU share) obeys, for a pod of class ``c`` (per-GPU share
``r_c``, GPUs ``k_c``, accepted models ``A_c``) and ``n_c(< t)`` the pods of ``c`` among the
first ``t`` arrivals:

- a pod of one GPU with ``r_c <= theta`` that arrives before ``max_(j in A_c) t_j`` fits on the
  GPU of that model with ``theta`` free, so it is placed: ``placed_c >= n_c(< max_(A_c) t_j)``;
- a pod with ``r_c >= theta`` that arrives at or after ``t_j`` fits on no GPU of ``j`` (each has
  less than ``theta`` free): ``placed_cj <= n_c(< t_j)`` for every model, and so
  ``placed_c <= n_c(< max_(A_c) t_j)``.

On GPU share alone these bounds hold whatever else the scheduler looks at, as long as it
places a pod some GPU can hold (the same assumption as ``work_conserving``; CPU and memory
are left out). Bins come in kinds (model, GPUs of the node) as in ``models``: a pod of ``k`` GPUs takes ``k``
bins of one kind whose nodes have ``k`` or more. With ``G_b`` GPUs of kind ``b``, ``x_bp``
bins of kind ``b`` in pattern ``p`` (``a_pc`` pods of fractional class ``c``), ``w_cb`` whole
pods of class ``c`` on kind ``b``, and ``U``, ``L``, ``V`` the bounds above::

    maximize    sum_(b,p) x_bp sum_c a_pc r_c + sum_(c,b) 1000 k_c w_cb
    subject to  sum_p x_bp + sum_c k_c w_cb <= G_b                        every kind b
                L_c <= placed_c <= U_c                                     every class c
                sum_(b of model j) placed_cb <= V_cj                       r_c >= theta, j in A_c
                x, w >= 0

Every trajectory satisfies these for its own vector ``t``, so the least LP optimum over all
``t`` bounds every one. Two more facts narrow the search. A model is not full before the
pods that may use it could cover each of its GPUs with more than ``1000 - theta``
(``earliest``: the least ``t_j``). And ``T = max_j t_j``, ``work_conserving``'s ``a``, is a
coordinate of its own: every ``t_j <= T``, and a pod that accepts every model is sure before
``T`` (without it, a box's lower bounds for those pods used ``max_j lo_j``, which stays low
while any one model's interval is wide: on ``default-m33`` the search then stalled 0.1
points lower after 4,000 LPs).

The least optimum is found by best-first branch and bound over boxes ``[lo, hi]`` of
``(t, T)``: the box's LP uses ``hi`` in the upper bounds and ``lo`` in the lower ones, which
relaxes every point in it; the box with the lowest bound is split in half where
``(hi - lo)`` times the GPUs concerned is largest. The lowest open bound is a valid floor at
every step, so a search stopped by its budget (``MAX_BOXES`` LPs per threshold) still
returns a floor; every ``_POINT_EVERY`` splits a point is evaluated too (its optimum is at or
above the least one), and the search stops once a point is within ``GAP_PCT`` of the lowest
open bound. ``PerModelFloor.within_pct`` says how close it came. Thresholds as in
``work_conserving``: the largest fractional share and 1000; the larger floor holds.

Models may be grouped (``groups``): ``t_g`` is then when no GPU of any model of ``g`` has
``theta`` free, a pod is sure before ``t_g`` only if it accepts every model of ``g``, and the
upper bounds hold per group. One group of every model is ``work_conserving`` (with kinds);
one group per model is the tightest, and the search over it the longest.

Each LP is solved by column generation as in ``share`` (Gilmore and Gomory, Operations
Research 9(6), 1961), one bounded knapsack per kind (kinds that hold the same classes share
one), in one HiGHS model per threshold: a box changes row bounds, pricing adds columns, and
the solve starts from the last basis. Extra GPUs of a kind, priced above what a GPU can hold,
keep each restricted LP feasible; a box whose optimum needs them holds no trajectory.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from benchmarks import trace
from benchmarks.floor.box_lp import ArrivalClasses, BoxLp
from benchmarks.floor.demand import MILLI_PER_GPU, arrived_gpu_pods

MAX_BOXES = 4000
"""LPs solved per threshold before the search returns its lowest open bound."""

GAP_PCT = 0.01
"""The search stops once a point's LP is within this of the lowest open bound, % of capacity."""

_POINT_EVERY = 10
"""Splits between two point evaluations (each an upper end for the least point value)."""



@dataclass(frozen=True, slots=True)
class PerModelFloor:
    """``work_conserving_floor_by_model``'s answer.

    Attributes
    ----------
    unallocated_pct : float
        Unallocated GPU share at the 100 % point no work-conserving placement that respects
        models goes below, % of capacity.
    within_pct : float
        How far above ``unallocated_pct`` the least LP optimum over ``t`` may be: 0 when the
        search reached one point, at most ``gap_pct`` when a point came that close, more if
        it stopped at ``max_boxes`` (percentage points).
    saturated_at : dict of str to int
        Group (models joined by ``|``) -> the ``t_g`` of the lowest box (its ``lo``).
    theta_milli : int
        The threshold of the larger floor.
    boxes : int
        LPs solved over both thresholds, one column generation each.
    """

    unallocated_pct: float
    within_pct: float
    saturated_at: dict[str, int]
    theta_milli: int
    boxes: int


def work_conserving_floor_by_model(arrived: Sequence[trace.TracePod], gpus: Mapping[tuple[str, int], int],
                                   groups: Sequence[frozenset[str]] | None = None,
                                   max_boxes: int = MAX_BOXES, gap_pct: float = GAP_PCT) -> PerModelFloor:
    """The floor of the module notes: work-conserving schedulers that respect GPU models.

    Parameters
    ----------
    arrived : sequence of TracePod
        GPU pods in arrival order up to the 100 % point (``arrived_gpu_pods``); a pod's
        ``gpu_spec`` (``|``-separated models, empty for any) names the models it accepts.
    gpus : mapping of (str, int) to int
        GPUs of each kind, (model, GPUs of the node) (``bundled_gpu_kinds()``), >= 0.
    groups : sequence of frozenset of str, optional
        A partition of the models, each with one saturation point (``t_g``: some GPU of a
        model of ``g`` has ``theta`` free). One per model if None; coarser groups give a
        weaker floor in fewer boxes (a pod is sure to be placed before ``t_g`` only if it
        accepts every model of ``g``).
    max_boxes : int
        LPs per threshold before the search stops with its lowest open bound.
    gap_pct : float
        The search stops once the least LP optimum over ``t`` is known within this.

    Returns
    -------
    PerModelFloor

    Raises
    ------
    RuntimeError
        If the LP solver fails, column generation does not converge, or no box is feasible
        (cannot happen for a real arrival sequence: every greedy placement is a point).
    ValueError
        If ``groups`` is not a partition of the models of ``gpus``.
    ModuleNotFoundError
        Without highspy (the ``bench`` extra).
    """
    kinds = sorted(gpus)
    models = sorted({m for m, _ in kinds})
    parts = sorted((sorted(g) for g in groups), key=lambda g: g[0]) if groups is not None else [[m] for m in models]
    if sorted(m for g in parts for m in g) != models:
        raise ValueError(f"groups {parts} are not a partition of the models {models}")
    group_of_kind = np.array([next(i for i, g in enumerate(parts) if m in g) for m, _ in kinds], dtype=np.int64)
    classes = ArrivalClasses(arrived, kinds, group_of_kind)
    group_gpus = np.bincount(group_of_kind, weights=[gpus[b] for b in kinds], minlength=len(parts)).astype(np.int64)
    n = len(arrived)
    capacity = MILLI_PER_GPU * sum(gpus.values())
    frac = classes.share[classes.share < MILLI_PER_GPU]
    best: _Search | None = None
    best_theta, boxes = MILLI_PER_GPU, 0
    for theta in sorted({int(frac.max()) if frac.size else MILLI_PER_GPU, MILLI_PER_GPU}):
        lp = BoxLp(classes, np.array([gpus[b] for b in kinds], dtype=np.int64), group_of_kind, theta)

        def bound(lo: NDArray[np.int64], hi: NDArray[np.int64], theta: int = theta, lp: BoxLp = lp) -> float:
            return lp.unallocated_pct(*classes.bounds(lo, hi, theta), capacity)

        # A threshold whose floor cannot exceed the one found already is left as soon as a
        # point shows it (its least point value is at or below that floor).
        earliest = classes.earliest(group_gpus, theta)
        found = _search(bound, np.append(earliest, earliest.max()), np.full(len(parts) + 1, n, dtype=np.int64),
                        np.append(group_gpus, group_gpus.sum()), max_boxes, gap_pct,
                        -math.inf if best is None else best.bound)
        boxes += found.boxes
        if best is None or found.bound > best.bound:
            best = found
            best_theta = theta
    assert best is not None
    return PerModelFloor(best.bound, best.point - best.bound,
                         {"|".join(g): int(t) for g, t in zip(parts, best.lo, strict=True)}, best_theta, boxes)


@dataclass(frozen=True, slots=True)
class _Search:
    bound: float
    """The lowest open box's bound: no point of ``t`` is below it."""
    point: float
    """The lowest value of a point evaluated: the least one over ``t`` is at or below it."""
    lo: NDArray[np.int64]
    boxes: int


def _search(bound: Callable[[NDArray[np.int64], NDArray[np.int64]], float], lo: NDArray[np.int64],
            hi: NDArray[np.int64], weight: NDArray[np.int64], max_boxes: int, gap_pct: float,
            enough: float) -> _Search:
    """Best-first branch and bound over boxes ``[lo, hi]`` (module notes), splitting the box
    with the lowest bound in half where ``(hi - lo) * weight`` is largest. Every
    ``_POINT_EVERY`` splits the split box's middle point is evaluated too. Stops when the
    lowest box is one point, is within ``gap_pct`` of the lowest point, when a point is at or
    below ``enough``, or after ``max_boxes`` bounds."""
    heap = [(bound(lo, hi), 0, lo, hi)]
    point, tie, boxes, splits = math.inf, -1, 1, 0
    while boxes < max_boxes:
        value, _, lo, hi = heap[0]
        if math.isinf(value) or np.array_equal(lo, hi) or point - value <= gap_pct or point <= enough:
            break
        heapq.heappop(heap)
        splits += 1
        if splits % _POINT_EVERY == 0:
            mid = (lo + hi) // 2
            mid[-1] = mid[:-1].max()
            point = min(point, bound(mid, mid))
            boxes += 1
        j = int(np.argmax((hi - lo) * weight))
        cut = (int(lo[j]) + int(hi[j])) // 2
        for a, b in ((int(lo[j]), cut), (cut + 1, int(hi[j]))):
            lo2, hi2 = lo.copy(), hi.copy()
            lo2[j], hi2[j] = a, b
            # The last coordinate is the others' maximum: no group above it, one group reaching it.
            hi2[:-1] = np.minimum(hi2[:-1], hi2[-1])
            lo2[-1] = max(int(lo2[-1]), int(lo2[:-1].max()))
            empty = bool((lo2 > hi2).any()) or int(hi2[:-1].max()) < int(lo2[-1])
            heapq.heappush(heap, (math.inf if empty else bound(lo2, hi2), tie, lo2, hi2))
            tie -= 1  # among equal bounds, the newest box first: depth, not breadth
            boxes += 0 if empty else 1
    value, _, lo, hi = heap[0]
    if math.isinf(value):
        raise RuntimeError("no saturation vector is feasible")
    return _Search(value, value if np.array_equal(lo, hi) else point, lo[:-1], boxes)


def work_conserving_floor_by_model_pct(pods: Sequence[trace.TracePod], seed: int,
                                       gpus: Mapping[tuple[str, int], int]) -> PerModelFloor:
    """``work_conserving_floor_by_model`` for one openb pod list and seed, one group per model.

    Parameters
    ----------
    pods : sequence of TracePod
        An openb pod list, possibly model-constrained (``benchmarks.constrain``).
    seed : int
        Arrival-order seed, as in ``python -m benchmarks replay``.
    gpus : mapping of (str, int) to int
        GPUs per kind (``bundled_gpu_kinds()``).

    Returns
    -------
    PerModelFloor
    """
    capacity = MILLI_PER_GPU * sum(gpus.values())
    seq = trace.arrival_sequence(list(pods), seed, capacity)
    return work_conserving_floor_by_model(arrived_gpu_pods(seq, capacity), gpus)
