"""A lower bound on unallocated GPU share at the 100 % point, from a cutting-stock LP.

Any placement of the pods that have arrived when the GPU demand reaches 100 % of capacity
leaves at least this much capacity unallocated, whatever the policy, online or offline.

Notes
-----
The relaxation drops everything but the GPU share: GPUs are independent bins of 1000 milli
(no nodes, CPU, host memory, GPU memory or models), a ``k``-GPU whole pod takes ``k`` whole
bins, and the bound may choose which pods fail. With fractional sizes ``r_s`` (``n_s`` pods
each), ``W_k`` whole pods of ``k`` GPUs, ``G`` GPUs, and ``a_ps`` pods of size ``s`` in bin
pattern ``p`` (``sum_s a_ps r_s <= 1000``)::

    maximize    sum_p x_p sum_s a_ps r_s + sum_k 1000 k w_k
    subject to  sum_p x_p + sum_k k w_k <= G
                sum_p a_ps x_p <= n_s            for every size s
                0 <= w_k <= W_k,  x_p >= 0

and ``unallocated >= capacity - optimum``.

With GPU models (a pod list that carries ``gpu_spec``, e.g. ``benchmarks.constrain``), the
bins come in kinds: model ``j`` has ``G_j`` GPUs, pods are grouped into classes by share (or
GPUs, for whole pods) and the models they accept, a pattern of model ``j`` holds only classes
that accept ``j``, and a whole pod takes ``k`` bins of one model it accepts::

    maximize    sum_j sum_p x_jp sum_c a_pc r_c + sum_(k,A) sum_(j in A) 1000 k w_kAj
    subject to  sum_p x_jp + sum_(k,A: j in A) k w_kAj <= G_j     for every model j
                sum_j sum_p a_pc x_jp <= n_c                       for every fractional class c
                sum_(j in A) w_kAj <= W_kA                         for every whole class (k, A)
                x, w >= 0

Pricing then runs one knapsack per model over the classes it may hold. Every GPU of a
pod list without ``gpu_spec`` is of one kind, which is the first LP.

**The work-conserving floor** (``work_conserving_floor``) is the same LP for schedulers that
place every pod some GPU can hold: they may not choose which pods fail. Pods never leave, so
free share only shrinks. Take a threshold ``theta`` and let ``a`` be the number of GPU pods
that arrive while some GPU still has ``theta`` milli free. Then, GPU share alone:

- a pod of one GPU asking ``<= theta`` that arrives before ``a`` fits on that GPU, so it is
  placed: ``n_s(<a)`` bounds pods of size ``s`` from below;
- a pod asking ``>= theta`` per GPU that arrives at or after ``a`` fits nowhere, so it fails:
  ``n_s(<a)`` and ``W_k(<a)`` bound them from above.

Every trajectory of such a scheduler satisfies these bounds for its own ``a``, so the
smallest LP optimum over ``a = 0..N`` bounds every one of them. It is found by branch and
bound over intervals of ``a``: for ``a`` in ``[lo, hi]`` the bounds of ``lo`` (below) and
``hi`` (above) relax every point, and the interval with the lowest bound is split until it is
one point. An interval whose lower bounds need more than ``G`` GPUs is infeasible. Thresholds
are the largest fractional share (a whole pod needs ``>= theta`` too) and 1000 (a whole pod
of one GPU is then bounded below); the larger of the two floors holds. On openb default the
gap from the first floor is the 810-milli pods: the first floor lets about 240 of them fail
and packs the rest, a scheduler that places them when they fit cannot.

This is the Gilmore-Gomory cutting-stock LP
(Gilmore and Gomory, "A Linear Programming Approach to the Cutting-Stock Problem",
Operations Research 9(6), 1961), solved by column generation: the pricing problem is a
bounded knapsack over the sizes with values ``r_s - y_s`` (``y_s`` the duals of the size
rows), solved exactly by dynamic programming over the capacity in steps of the sizes'
greatest common divisor. The LP optimum is an upper bound on the integer optimum, so the
result stays a valid floor. openb pods of one GPU ask for 50 to 990 milli in steps of 10.
"""

from __future__ import annotations

import argparse
import heapq
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from benchmarks import compare, constrain, trace
from benchmarks.replay import parse_seeds
from extender.clusterfile import load_cluster_file

MILLI_PER_GPU = 1000


Accepts = frozenset[str]
"""GPU models a class of pods accepts (by name)."""


@dataclass(frozen=True, slots=True)
class ArrivedGpuDemand:
    """The GPU pods of one arrival sequence up to the 100 % point, any model accepted.

    Attributes
    ----------
    fractional : dict of int to int
        Pods of one GPU below 1000 milli: share (milli) -> number of pods.
    whole : dict of int to int
        Whole-GPU pods: GPUs per pod -> number of pods.
    """

    fractional: dict[int, int]
    whole: dict[int, int]

    @property
    def milli(self) -> int:
        """Total GPU share asked for."""
        return (sum(r * n for r, n in self.fractional.items())
                + sum(MILLI_PER_GPU * k * n for k, n in self.whole.items()))


@dataclass(frozen=True, slots=True)
class ModelGpuDemand:
    """The GPU pods of one arrival sequence up to the 100 % point, by the models they accept.

    Attributes
    ----------
    fractional : dict of (int, frozenset of str) to int
        Pods of one GPU below 1000 milli: (share milli, accepted models) -> number of pods.
    whole : dict of (int, frozenset of str) to int
        Whole-GPU pods: (GPUs per pod, accepted models) -> number of pods.
    """

    fractional: dict[tuple[int, Accepts], int]
    whole: dict[tuple[int, Accepts], int]

    def any_model(self, models: Sequence[str]) -> ArrivedGpuDemand | None:
        """The same demand without models, if every class accepts every one of ``models``."""
        every = frozenset(models)
        if any(a != every for _, a in (*self.fractional, *self.whole)):
            return None
        frac: Counter[int] = Counter()
        whole: Counter[int] = Counter()
        for (r, _), n in self.fractional.items():
            frac[r] += n
        for (k, _), n in self.whole.items():
            whole[k] += n
        return ArrivedGpuDemand(dict(frac), dict(whole))


def arrived_demand(seq: Sequence[trace.TracePod], capacity_milli: int) -> ArrivedGpuDemand:
    """GPU pods in arrival order up to and including the one that brings the demand to
    ``capacity_milli`` (the replay's 100 % mark is taken right after that pod); models ignored."""
    frac: Counter[int] = Counter()
    whole: Counter[int] = Counter()
    for p in arrived_gpu_pods(seq, capacity_milli):
        if p.gpu_milli < MILLI_PER_GPU:
            frac[p.gpu_milli] += 1
        else:
            whole[p.num_gpu] += 1
    return ArrivedGpuDemand(dict(frac), dict(whole))


def arrived_model_demand(seq: Sequence[trace.TracePod], capacity_milli: int,
                         kinds: Mapping[str, tuple[str, int]]) -> ModelGpuDemand:
    """``arrived_demand`` by the GPU kinds each pod may use.

    Parameters
    ----------
    seq : sequence of TracePod
    capacity_milli : int
    kinds : mapping of str to (str, int)
        Bin name -> (GPU model, GPUs of the node). A pod may use a kind whose model its
        ``gpu_spec`` (``|``-separated) names, any model without one, and whose nodes hold
        its ``num_gpu`` (a pod of ``k`` GPUs runs on one node).
    """
    frac: Counter[tuple[int, Accepts]] = Counter()
    whole: Counter[tuple[int, Accepts]] = Counter()
    for p in arrived_gpu_pods(seq, capacity_milli):
        spec = set(p.gpu_spec.split("|")) if p.gpu_spec else None
        accepts = frozenset(b for b, (m, n) in kinds.items() if (spec is None or m in spec) and n >= p.num_gpu)
        if p.gpu_milli < MILLI_PER_GPU:
            frac[(p.gpu_milli, accepts)] += 1
        else:
            whole[(p.num_gpu, accepts)] += 1
    return ModelGpuDemand(dict(frac), dict(whole))


def arrived_gpu_pods(seq: Sequence[trace.TracePod], capacity_milli: int) -> list[trace.TracePod]:
    """The GPU pods of ``seq``, in order, up to and including the one that brings the GPU share
    asked to ``capacity_milli`` (milli-GPU)."""
    out = []
    arrived = 0
    for p in seq:
        if not p.num_gpu:
            continue
        out.append(p)
        arrived += p.gpu_request_milli
        if arrived >= capacity_milli:
            break
    return out


def _linprog() -> Any:
    """scipy's ``linprog`` (HiGHS): only this benchmark needs it, so it is imported here."""
    try:
        from scipy.optimize import linprog
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError('the floor needs scipy: pip install -e ".[floor]"') from e
    return linprog


def _best_pattern(sizes: NDArray[np.int64], values: NDArray[np.float64], limit: NDArray[np.int64],
                  step: int) -> tuple[float, NDArray[np.int64]]:
    """Bounded knapsack: the most valuable multiset of ``sizes`` within one GPU.

    ``limit[s]`` copies of size ``s`` at most; sizes are multiples of ``step``. Copies are
    split into powers of two so the 0/1 dynamic programme stays exact. Returns the value and
    the counts per size.
    """
    cap = MILLI_PER_GPU // step
    items: list[tuple[int, float, int, int]] = []  # (units, value, size index, copies)
    for s in np.flatnonzero(values > 0):
        left, chunk = int(min(limit[s], MILLI_PER_GPU // sizes[s])), 1
        while left > 0:
            n = min(chunk, left)
            items.append((int(sizes[s]) // step * n, float(values[s]) * n, int(s), n))
            left -= n
            chunk *= 2
    best = np.zeros(cap + 1)
    took = np.zeros((len(items), cap + 1), dtype=bool)
    for i, (u, v, _, _) in enumerate(items):
        cand = np.full(cap + 1, -np.inf)
        cand[u:] = best[:cap + 1 - u] + v
        took[i] = cand > best
        best = np.maximum(best, cand)
    counts = np.zeros(sizes.shape[0], dtype=np.int64)
    c = int(np.argmax(best))
    for i in range(len(items) - 1, -1, -1):
        if took[i, c]:
            u, _, size, copies = items[i]
            counts[size] += copies
            c -= u
    return float(best.max()), counts


def max_allocated_milli(demand: ArrivedGpuDemand, n_gpus: int, max_rounds: int = 10_000) -> float:
    """Optimum of the cutting-stock LP: the most GPU share any placement can allocate.

    Parameters
    ----------
    demand : ArrivedGpuDemand
    n_gpus : int
        GPUs in the cluster (bins of 1000 milli), >= 0.
    max_rounds : int
        Column-generation rounds before giving up.

    Returns
    -------
    float
        Upper bound on allocated GPU share, milli-GPU.

    Raises
    ------
    RuntimeError
        If the LP solver fails or column generation does not converge in ``max_rounds``.
    ModuleNotFoundError
        Without scipy (the ``floor`` extra).
    """
    if not demand.fractional and not demand.whole:
        return 0.0
    return _column_generation(demand, n_gpus, max_rounds)[0]


def _column_generation(demand: ArrivedGpuDemand, n_gpus: int, max_rounds: int,
                       required: ArrivedGpuDemand | None = None,
                       columns: list[NDArray[np.int64]] | None = None) -> tuple[float, float]:
    """``pattern_lp`` over the columns that pricing finds: the optimum and the GPUs beyond
    ``n_gpus`` that ``required`` needed (0 without it). ``columns`` (patterns over
    ``sorted(demand.fractional)``) is the pool to start from and grow; one pod per bin
    if None."""
    sizes = np.array(sorted(demand.fractional), dtype=np.int64)
    avail = np.array([demand.fractional[int(r)] for r in sizes], dtype=np.int64)
    step = math.gcd(MILLI_PER_GPU, *sizes.tolist()) if sizes.size else MILLI_PER_GPU
    if columns is None:
        columns = [np.eye(sizes.shape[0], dtype=np.int64)[s] for s in range(sizes.shape[0])]
    for _ in range(max_rounds):
        optimum, duals, extra = pattern_lp(np.array(columns, dtype=np.int64).reshape(len(columns), sizes.shape[0]),
                                           demand, n_gpus, required)
        if sizes.size == 0:
            return optimum, extra
        value, counts = _best_pattern(sizes, sizes - duals[1:], avail, step)
        if value - duals[0] <= 1e-6:
            return optimum, extra
        columns.append(counts)
    raise RuntimeError(f"column generation did not converge in {max_rounds} rounds")


def pattern_lp(patterns: NDArray[np.int64], demand: ArrivedGpuDemand, n_gpus: int,
               required: ArrivedGpuDemand | None = None) -> tuple[float, NDArray[np.float64], float]:
    """The LP of the module notes restricted to the given bin patterns.

    Parameters
    ----------
    patterns : ndarray of shape (p, s), int64
        Pods of each fractional size (``sorted(demand.fractional)``, ascending) per pattern;
        each row fits one GPU.
    demand : ArrivedGpuDemand
        The most pods of each size (and whole pods of each ``k``) that may be placed.
    n_gpus : int
        GPUs in the cluster, >= 0.
    required : ArrivedGpuDemand, optional
        The fewest that must be placed (the work-conserving floor); its sizes and ``k`` are
        among ``demand``'s. Where they need more than ``n_gpus`` GPUs, the LP buys the rest
        at ``_EXTRA_GPU_COST`` each, above what a GPU can hold, so it does only then.

    Returns
    -------
    optimum : float
        Most GPU share allocatable with these patterns, milli-GPU (less the extra GPUs' cost).
    duals : ndarray of shape (1 + s,), float64
        The value of one more GPU (>= 0), then of one more pod of each size allowed (>= 0
        without ``required``; net of the lower bound's with it).
    extra_gpus : float
        GPUs beyond ``n_gpus`` that ``required`` needed; 0 without it.

    Raises
    ------
    RuntimeError
        If the LP solver fails.
    ModuleNotFoundError
        Without scipy (the ``floor`` extra).
    """
    linprog = _linprog()

    sizes = np.array(sorted(demand.fractional), dtype=float)
    ks = sorted(demand.whole)
    a = patterns.astype(float)
    gain = -np.concatenate([a @ sizes, [MILLI_PER_GPU * k for k in ks]])
    gpus_row = np.concatenate([np.ones(a.shape[0]), np.array(ks, dtype=float)])
    size_rows = np.hstack([a.T, np.zeros((sizes.shape[0], len(ks)))])
    rows, limits = [gpus_row, size_rows], [[n_gpus], [demand.fractional[int(r)] for r in sizes]]
    whole_least = [0] * len(ks)
    if required is not None:
        # One more column, the extra GPUs (in the GPU row at -1), and a row per size for -placed <= -required.
        gain = np.append(gain, _EXTRA_GPU_COST)
        rows = [np.append(gpus_row, -1.0), np.hstack([size_rows, np.zeros((sizes.shape[0], 1))]),
                -np.hstack([size_rows, np.zeros((sizes.shape[0], 1))])]
        limits.append([-required.fractional.get(int(r), 0) for r in sizes])
        whole_least = [required.whole.get(k, 0) for k in ks]
    res = linprog(gain, A_ub=np.vstack(rows), b_ub=np.concatenate(limits),
                  bounds=([(0, None)] * a.shape[0] + [(lo, demand.whole[k]) for lo, k in zip(whole_least, ks, strict=True)]
                          + ([(0, None)] if required is not None else [])),
                  method="highs")
    if res.status != 0 or res.fun is None:
        raise RuntimeError(f"LP solver failed: {res.message}")
    duals = -res.ineqlin.marginals
    if required is None:
        return float(-res.fun), duals, 0.0
    s_n = sizes.shape[0]
    return float(-res.fun), duals[:1 + s_n] - np.concatenate([[0.0], duals[1 + s_n:]]), float(np.asarray(res.x)[-1])


_EXTRA_GPU_COST = 10.0 * MILLI_PER_GPU
"""What ``pattern_lp`` pays for one GPU beyond ``n_gpus`` to meet ``required``: above the most
one GPU can hold (1000), so extra GPUs are bought only where the lower bounds need them."""


def max_allocated_milli_by_model(demand: ModelGpuDemand, gpus: Mapping[str, int],
                                 max_rounds: int = 10_000) -> float:
    """Optimum of the cutting-stock LP with a bin kind per GPU model (module notes).

    Parameters
    ----------
    demand : ModelGpuDemand
    gpus : mapping of str to int
        GPUs of each model, >= 0.
    max_rounds : int
        Column-generation rounds before giving up.

    Returns
    -------
    float
        Upper bound on allocated GPU share, milli-GPU.

    Raises
    ------
    RuntimeError
        If the LP solver fails or column generation does not converge in ``max_rounds``.
    ModuleNotFoundError
        Without scipy.
    """
    models = sorted(gpus)
    classes = sorted(demand.fractional, key=lambda c: (c[0], sorted(c[1])))
    sizes = np.array([r for r, _ in classes], dtype=np.int64)
    avail = np.array([demand.fractional[c] for c in classes], dtype=np.int64)
    step = math.gcd(MILLI_PER_GPU, *sizes.tolist()) if sizes.size else MILLI_PER_GPU
    # Start from one pod per bin of each model a class accepts; every later column is priced.
    columns = [(j, np.eye(len(classes), dtype=np.int64)[c]) for c, (_, a) in enumerate(classes)
               for j, m in enumerate(models) if m in a]
    for _ in range(max_rounds):
        optimum, duals = model_pattern_lp(columns, demand, gpus)
        added = False
        for j, m in enumerate(models):
            on = np.array([m in a for _, a in classes], dtype=bool)
            if not on.any():
                continue
            value, counts = _best_pattern(sizes, np.where(on, sizes - duals[len(models):len(models) + len(classes)],
                                                          0.0), np.where(on, avail, 0), step)
            if value - duals[j] > 1e-6:
                columns.append((j, counts))
                added = True
        if not added:
            return optimum
    raise RuntimeError(f"column generation did not converge in {max_rounds} rounds")


def model_pattern_lp(columns: Sequence[tuple[int, NDArray[np.int64]]], demand: ModelGpuDemand,
                     gpus: Mapping[str, int]) -> tuple[float, NDArray[np.float64]]:
    """The model LP of the module notes restricted to the given bin patterns, solved by HiGHS.

    Parameters
    ----------
    columns : sequence of (int, ndarray of shape (c,), int64)
        Patterns: a model's position in ``sorted(gpus)`` and the pods of each fractional
        class (sorted by share, then models) the bin holds.
    demand : ModelGpuDemand
    gpus : mapping of str to int

    Returns
    -------
    optimum : float
        Milli-GPU.
    duals : ndarray of shape (j + c + w,), float64
        >= 0: the value of one more GPU of each model, of one more pod of each fractional
        class, of one more pod of each whole class (sorted by GPUs, then models).

    Raises
    ------
    RuntimeError
        If the LP solver fails.
    ModuleNotFoundError
        Without scipy.
    """
    linprog = _linprog()

    models = sorted(gpus)
    classes = sorted(demand.fractional, key=lambda c: (c[0], sorted(c[1])))
    wholes = sorted(demand.whole, key=lambda c: (c[0], sorted(c[1])))
    sizes = np.array([r for r, _ in classes], dtype=float)
    n_rows = len(models) + len(classes) + len(wholes)
    cols, gain = [], []
    for j, counts in columns:
        a = np.zeros(n_rows)
        a[j] = 1.0
        a[len(models):len(models) + len(classes)] = counts
        cols.append(a)
        gain.append(float(counts @ sizes) if len(classes) else 0.0)
    for w, (k, accepts) in enumerate(wholes):
        for j, m in enumerate(models):
            if m in accepts:
                a = np.zeros(n_rows)
                a[j] = float(k)
                a[len(models) + len(classes) + w] = 1.0
                cols.append(a)
                gain.append(float(MILLI_PER_GPU * k))
    rhs = np.concatenate([[float(gpus[m]) for m in models], [float(demand.fractional[c]) for c in classes],
                          [float(demand.whole[c]) for c in wholes]])
    if not cols:
        return 0.0, np.zeros(n_rows)
    res = linprog(-np.array(gain), A_ub=np.array(cols).T, b_ub=rhs, bounds=(0, None), method="highs")
    if res.status != 0 or res.fun is None:
        raise RuntimeError(f"LP solver failed: {res.message}")
    return float(-res.fun), -res.ineqlin.marginals


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
    """

    def __init__(self, arrived: Sequence[trace.TracePod]) -> None:
        self.sizes = np.array(sorted({p.gpu_milli for p in arrived if p.gpu_milli < MILLI_PER_GPU}), dtype=np.int64)
        self.ks = sorted({p.num_gpu for p in arrived if p.gpu_milli >= MILLI_PER_GPU})
        size_of = {int(r): i for i, r in enumerate(self.sizes)}
        frac = np.zeros((len(arrived) + 1, self.sizes.shape[0]), dtype=np.int64)
        whole = np.zeros((len(arrived) + 1, len(self.ks)), dtype=np.int64)
        for j, p in enumerate(arrived):
            frac[j + 1], whole[j + 1] = frac[j], whole[j]
            if p.gpu_milli < MILLI_PER_GPU:
                frac[j + 1, size_of[p.gpu_milli]] += 1
            else:
                whole[j + 1, self.ks.index(p.num_gpu)] += 1
        self.frac_before, self.whole_before = frac, whole

    def __call__(self, lo: int, hi: int, theta: int) -> tuple[ArrivedGpuDemand, ArrivedGpuDemand]:
        """For every ``a`` in ``[lo, hi]`` at threshold ``theta``: what may be placed (every
        size and ``k`` of the sequence, possibly 0), and what must be (``pattern_lp``'s
        ``demand`` and ``required``)."""
        total = self.frac_before[-1]
        upper = np.where(self.sizes >= theta, self.frac_before[hi], total)
        lower = np.where(self.sizes <= theta, self.frac_before[lo], 0)
        sizes = self.sizes.tolist()
        allowed = ArrivedGpuDemand(dict(zip(sizes, upper.tolist(), strict=True)),
                                   dict(zip(self.ks, self.whole_before[hi].tolist(), strict=True)))
        required = ArrivedGpuDemand(dict(zip(sizes, lower.tolist(), strict=True)),
                                    {1: int(self.whole_before[lo, self.ks.index(1)])}
                                    if theta >= MILLI_PER_GPU and 1 in self.ks else {})
        return allowed, required


def work_conserving_floor(arrived: Sequence[trace.TracePod], n_gpus: int) -> WorkConservingFloor:
    """The floor of the module notes for schedulers that place every pod some GPU can hold.

    Parameters
    ----------
    arrived : sequence of TracePod
        GPU pods in arrival order up to the 100 % point (``arrived_gpu_pods``); GPU share only, no
        models.
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
        Without scipy (the ``floor`` extra).
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
            got, extra = _column_generation(allowed, n_gpus, 10_000, required, columns)
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


def work_conserving_floor_pct(pods: Sequence[trace.TracePod], seed: int, n_gpus: int) -> float | None:
    """``work_conserving_floor`` for one openb pod list and seed; None for a model-constrained list.

    Parameters
    ----------
    pods : sequence of TracePod
    seed : int
        Arrival-order seed, as in ``python -m benchmarks replay``.
    n_gpus : int
        GPUs in the cluster (``bundled_gpu_count()``).

    Returns
    -------
    float or None
        % of capacity. None where some pod has a ``gpu_spec``: "some GPU has ``theta`` free"
        would have to be per model, which this bound does not do.
    """
    if any(p.gpu_spec for p in pods if p.num_gpu):
        return None
    capacity = MILLI_PER_GPU * n_gpus
    seq = trace.arrival_sequence(list(pods), seed, capacity)
    return work_conserving_floor(arrived_gpu_pods(seq, capacity), n_gpus).unallocated_pct


def unallocated_floor_pct(pods: Sequence[trace.TracePod], seed: int,
                          gpus: int | Mapping[tuple[str, int], int]) -> float:
    """The floor for one openb pod list and seed.

    Parameters
    ----------
    pods : sequence of TracePod
        An openb pod list (``trace.load_pods``), possibly model-constrained
        (``benchmarks.constrain``).
    seed : int
        Arrival-order seed, as in ``python -m benchmarks replay``.
    gpus : int or mapping of (str, int) to int
        GPUs in the cluster (``bundled_gpu_count()``: GPU share only), or GPUs per kind,
        (model, GPUs of the node) (``bundled_gpu_kinds()``), to respect the pods'
        ``gpu_spec`` and that a pod of ``k`` GPUs needs a node of ``k`` or more.

    Returns
    -------
    float
        Unallocated GPU share at the 100 % point no placement can go below, % of capacity.
    """
    n_gpus = sum(gpus.values()) if isinstance(gpus, Mapping) else gpus
    capacity = MILLI_PER_GPU * n_gpus
    seq = trace.arrival_sequence(list(pods), seed, capacity)
    if not isinstance(gpus, Mapping):
        best = max_allocated_milli(arrived_demand(seq, capacity), n_gpus)
    else:
        names = {f"{m}/{n}": (m, n) for m, n in gpus}
        model_demand = arrived_model_demand(seq, capacity, names)
        plain = model_demand.any_model(sorted(names))
        best = (max_allocated_milli(plain, n_gpus) if plain is not None
                else max_allocated_milli_by_model(model_demand, {b: gpus[k] for b, k in names.items()}))
    return 100.0 * (capacity - best) / capacity


def bundled_gpu_count() -> int:
    """GPUs of the bundled openb node list (6,212)."""
    return sum(len(s.gpus) for s in load_cluster_file(trace.DEFAULT_NODES, replicas_per_gpu=1))


def bundled_gpu_kinds() -> dict[tuple[str, int], int]:
    """GPUs of each kind, (model, GPUs of the node), in the bundled openb node list."""
    return dict(Counter((g.model, len(s.gpus)) for s in load_cluster_file(trace.DEFAULT_NODES, replicas_per_gpu=1)
                        for g in s.gpus))


def table(floors: Mapping[str, Sequence[float]], seeds: Sequence[int],
          work_conserving: Mapping[str, Sequence[float | None]] | None = None) -> str:
    """Markdown: median (min-max) floor per variant, the work-conserving floor where it applies,
    next to the published FGD."""
    def spread(vals: Sequence[float]) -> str:
        return f"{float(np.median(vals)):.2f} ({min(vals):.2f}-{max(vals):.2f})"

    lines = [f"Lower bound on unallocated GPU % at 100 % arrived (cutting-stock LP: GPU share, models, GPUs per node), "
             f"seeds {seeds[0]}..{seeds[-1]}. Work-conserving: for schedulers that place every pod some GPU "
             f"can hold (GPU share only; none for model-constrained lists).", "",
             "| variant | floor, median (min-max) | work-conserving floor | published FGD |", "|---|---|---|---|"]
    for v, vals in floors.items():
        wc = [x for x in (work_conserving or {}).get(v, []) if x is not None]
        lines.append(f"| {v} | {spread(vals)} | {spread(wc) if wc else '-'} | "
                     f"{compare.PUBLISHED_FGD_UNALLOCATED_PCT.get(v, float('nan')):.2f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.floor --variants all --seeds 42-51``: print the table."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.floor", description=__doc__.splitlines()[0])
    p.add_argument("--variants", nargs="+", default=["default"], help="openb variants, or 'all'")
    p.add_argument("--seeds", type=parse_seeds, default=parse_seeds("42-51"))
    args = p.parse_args(argv)
    try:
        variants = compare.variant_names(args.variants)
    except ValueError as e:
        p.error(str(e))
    specs = load_cluster_file(trace.DEFAULT_NODES, replicas_per_gpu=1)
    gpus = bundled_gpu_kinds()
    floors, work_conserving = {}, {}
    for v in variants:
        pods = trace.load_pods(compare.pods_path(v))
        pct = compare.parse_variant(v)[1]  # GPU memory (-g<PCT>) is not in the LP: a valid, weaker floor
        if pct:
            pods = constrain.restrict_models(pods, pct, specs)
        floors[v] = [unallocated_floor_pct(pods, s, gpus) for s in args.seeds]
        work_conserving[v] = [work_conserving_floor_pct(pods, s, sum(gpus.values())) for s in args.seeds]
    print(table(floors, args.seeds, work_conserving))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
