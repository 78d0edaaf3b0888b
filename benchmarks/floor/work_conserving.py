"""The work-conserving floor: the same LP for schedulers that place every pod some GPU can
hold, by branch and bound over the saturation point (the package notes).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from benchmarks import trace
from benchmarks.floor.demand import MILLI_PER_GPU, ArrivedGpuDemand, arrived_gpu_pods
from benchmarks.floor.share import column_generation


@dataclass(frozen=True, slots=True)
class WorkConservingFloor:
    """``work_conserving_floor``'s answer.

    Attributes
    ----------
    unallocated_pct : float
        Unallocated GPU share at the 100 % point no work-conserving placement goes below, %
        of capacity.
    saturated_at : int
        The ``a`` that attains it: GPU pods (in arrival order) that arrive while some GPU
        still has ``theta_milli`` free.
    saturated_arrived_pct : float
        GPU share those ``a`` pods ask for, % of capacity.
    theta_milli : int
        The threshold of the larger floor.
    intervals : int
        Intervals of ``a`` bounded (every threshold), each one column generation.
    """

    unallocated_pct: float
    saturated_at: int
    saturated_arrived_pct: float
    theta_milli: int
    intervals: int


class _SaturationBounds:
    """The bounds of the module notes for one arrival sequence, for any ``a`` and ``theta``.

    Attributes
    ----------
    sizes : ndarray of shape (s,), int64
        Fractional shares of the arrived pods, ascending, milli-GPU.
    ks : list of int
        GPUs per whole pod, ascending (``w``: its length).
    frac_before : ndarray of shape (N + 1, s), int64
        Pods of each size among the first ``j`` arrivals, ``j = 0..N``.
    whole_before : ndarray of shape (N + 1, w), int64
        Whole pods of each ``k`` among the first ``j`` arrivals.
    frac_any_before, whole_any_before : ndarray, int64
        The same for the pods that accept any GPU model (no ``gpu_spec``): only they are
        sure to be placed while some GPU has ``theta`` free (that GPU may be of a model a
        restricted pod refuses). Equal to the two above for a list without ``gpu_spec``.
    """

    def __init__(self, arrived: Sequence[trace.TracePod]) -> None:
        self.sizes = np.array(sorted({p.gpu_milli for p in arrived if p.gpu_milli < MILLI_PER_GPU}), dtype=np.int64)
        self.ks = sorted({p.num_gpu for p in arrived if p.gpu_milli >= MILLI_PER_GPU})
        size_of = {int(r): i for i, r in enumerate(self.sizes)}
        frac = np.zeros((len(arrived) + 1, self.sizes.shape[0]), dtype=np.int64)
        whole = np.zeros((len(arrived) + 1, len(self.ks)), dtype=np.int64)
        frac_any, whole_any = frac.copy(), whole.copy()
        for j, p in enumerate(arrived):
            frac[j + 1], whole[j + 1] = frac[j], whole[j]
            frac_any[j + 1], whole_any[j + 1] = frac_any[j], whole_any[j]
            counts = (frac, frac_any) if not p.gpu_spec else (frac,)
            wholes = (whole, whole_any) if not p.gpu_spec else (whole,)
            if p.gpu_milli < MILLI_PER_GPU:
                for c in counts:
                    c[j + 1, size_of[p.gpu_milli]] += 1
            else:
                for w in wholes:
                    w[j + 1, self.ks.index(p.num_gpu)] += 1
        self.frac_before, self.whole_before = frac, whole
        self.frac_any_before, self.whole_any_before = frac_any, whole_any

    def __call__(self, lo: int, hi: int, theta: int) -> tuple[ArrivedGpuDemand, ArrivedGpuDemand]:
        """For every ``a`` in ``[lo, hi]`` at threshold ``theta``: what may be placed (every
        size and ``k`` of the sequence, possibly 0), and what must be (``pattern_lp``'s
        ``demand`` and ``required``)."""
        total = self.frac_before[-1]
        upper = np.where(self.sizes >= theta, self.frac_before[hi], total)
        lower = np.where(self.sizes <= theta, self.frac_any_before[lo], 0)
        sizes = self.sizes.tolist()
        allowed = ArrivedGpuDemand(dict(zip(sizes, upper.tolist(), strict=True)),
                                   dict(zip(self.ks, self.whole_before[hi].tolist(), strict=True)))
        required = ArrivedGpuDemand(dict(zip(sizes, lower.tolist(), strict=True)),
                                    {1: int(self.whole_any_before[lo, self.ks.index(1)])}
                                    if theta >= MILLI_PER_GPU and 1 in self.ks else {})
        return allowed, required


def work_conserving_floor(arrived: Sequence[trace.TracePod], n_gpus: int) -> WorkConservingFloor:
    """The floor of the module notes for schedulers that place every pod some GPU can hold.

    Parameters
    ----------
    arrived : sequence of TracePod
        GPU pods in arrival order up to the 100 % point (``arrived_gpu_pods``); GPU share only.
        Pods with a ``gpu_spec`` are bounded from above only (a model-constrained list: the
        LP ignores models, a relaxation, so the floor stays valid, and weaker).
    n_gpus : int
        GPUs in the cluster, >= 1.

    Returns
    -------
    WorkConservingFloor

    Raises
    ------
    RuntimeError
        If the LP solver fails, column generation does not converge, or no ``a`` is feasible
        (cannot happen for a real arrival sequence: every greedy placement is one).
    ModuleNotFoundError
        Without scipy (the ``bench`` extra).
    """
    bounds = _SaturationBounds(arrived)
    columns = [np.eye(bounds.sizes.shape[0], dtype=np.int64)[s] for s in range(bounds.sizes.shape[0])]
    capacity = MILLI_PER_GPU * n_gpus
    thresholds = sorted({int(bounds.sizes.max()) if bounds.sizes.size else MILLI_PER_GPU, MILLI_PER_GPU})
    best: tuple[float, int, int] | None = None
    intervals = 0
    for theta in thresholds:
        def unallocated(lo: int, hi: int, theta: int = theta) -> float:
            nonlocal intervals
            intervals += 1
            allowed, required = bounds(lo, hi, theta)
            got, extra = column_generation(allowed, n_gpus, 10_000, required, columns)
            return math.inf if extra > 1e-6 else 100.0 * (capacity - got) / capacity

        heap = [(unallocated(0, len(arrived)), 0, len(arrived))]
        while True:
            bound, lo, hi = heapq.heappop(heap)
            if lo == hi:
                break
            mid = (lo + hi) // 2
            for a, b in ((lo, mid), (mid + 1, hi)):
                heapq.heappush(heap, (unallocated(a, b), a, b))
        if math.isinf(bound):
            raise RuntimeError("no saturation point is feasible")
        if best is None or bound > best[0]:
            best = (bound, lo, theta)
    assert best is not None
    pct, a, theta = best
    asked = sum(p.gpu_request_milli for p in arrived[:a])
    return WorkConservingFloor(pct, a, 100.0 * asked / capacity, theta, intervals)


def work_conserving_floor_pct(pods: Sequence[trace.TracePod], seed: int, n_gpus: int) -> float:
    """``work_conserving_floor`` for one openb pod list and seed.

    Parameters
    ----------
    pods : sequence of TracePod
    seed : int
        Arrival-order seed, as in ``python -m benchmarks replay``.
    n_gpus : int
        GPUs in the cluster (``bundled_gpu_count()``).

    Returns
    -------
    float
        % of capacity. For a model-constrained list, the relaxation of
        ``work_conserving_floor``: valid, weaker than a per-model saturation vector would give.
    """
    capacity = MILLI_PER_GPU * n_gpus
    seq = trace.arrival_sequence(list(pods), seed, capacity)
    return work_conserving_floor(arrived_gpu_pods(seq, capacity), n_gpus).unallocated_pct
