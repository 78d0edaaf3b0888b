"""Shadow prices of GPUs and pod sizes from the cutting-stock LP of a saturated cluster.

Notes
-----
GPUs are bins of 1000 milli; a workload asks for ``n_s`` pods of share ``r_s`` (a whole-GPU
pod of ``k`` GPUs counts as ``k`` pods of ``r_s = 1000``). The most GPU share ``G`` GPUs can
allocate, if any pods may be left out, is the Gilmore-Gomory cutting-stock LP over bin
patterns ``p`` (``a_ps`` pods of size ``s``, ``sum_s a_ps r_s <= 1000``)::

    maximize    sum_p x_p sum_s a_ps r_s
    subject to  sum_p x_p <= G                    (dual y_G: the value of one more GPU)
                sum_p a_ps x_p <= n_s              (dual y_s: the value of one more s-pod)
                x_p >= 0

(Gilmore and Gomory, "A Linear Programming Approach to the Cutting-Stock Problem",
Operations Research 9(6), 1961). It is solved by column generation: a primal simplex on the
patterns found so far (one pod per bin to start), then the pricing step, an unbounded
knapsack over the sizes with values ``r_s - y_s``, adds for each size the best pattern
holding it while such patterns are worth more than ``y_G``. ``benchmarks/floor.py`` solves
the same LP with HiGHS to bound unallocated share; this module needs only numpy.

The duals are what an online packer can charge a placement (online stochastic bin packing
judged against the LP over bin patterns of the item distribution: Gupta and Radovanovic,
"Interior-Point Based Online Stochastic Bin Packing", Operations Research, 2020, SSRN
2673951): on openb default ``y_G = 810`` (the marginal GPU holds a lone 810-milli pod), a
160-milli pod is worth all of its share (it is the one that fills an 810-milli pod's gap),
a 230-milli pod 27.5.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from scoring.request import MILLI_PER_GPU

_EPS = 1e-9

BLAND_AFTER = 500
"""Simplex pivots by the steepest reduced cost (Dantzig) before switching to Bland's rule."""


def _best_patterns(sizes: NDArray[np.int64], values: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Unbounded knapsack: for each size, the most valuable multiset within one GPU that holds it.

    Parameters
    ----------
    sizes : ndarray of shape (s,), int64
        Shares in milli-GPU, 1..1000.
    values : ndarray of shape (s,), float64

    Returns
    -------
    value : ndarray of shape (s,), float64
        ``value[i]``: the best total value of a pattern with at least one pod of size ``i``.
    counts : ndarray of shape (s, s), int64
        ``counts[i]``: that pattern, pods of each size.

    Notes
    -----
    One dynamic programme over the exact fill ``best[c]`` (the most value of a multiset of
    total share exactly ``c``); ``best[c]`` reads ``best[c - r]`` for ``r >= min(sizes)``
    only, so each block of ``min(sizes)`` consecutive ``c`` is one vectorized step. Pattern ``i`` is one pod of size ``i`` plus the best fill of the
    remaining ``1000 - r_i``. Pricing every size at once gives column generation up to ``s``
    columns per round (openb: 6 rounds instead of 38).
    """
    best = np.full(MILLI_PER_GPU + 1, -np.inf)
    best[0] = 0.0
    choice = np.zeros(MILLI_PER_GPU + 1, dtype=np.int64)
    col = sizes[:, None]  # (s, 1)
    step = int(sizes.min())
    for lo in range(step, MILLI_PER_GPU + 1, step):
        c = np.arange(lo, min(lo + step, MILLI_PER_GPU + 1))
        prev = c - col  # (s, b)
        cand = np.where(prev >= 0, best[np.maximum(prev, 0)] + values[:, None], -np.inf)
        choice[c] = np.argmax(cand, axis=0)
        best[c] = cand[choice[c], np.arange(c.shape[0])]
    # Best fill within capacity c (not exactly c): running maximum and where it was reached.
    at = np.maximum.accumulate(np.where(best == np.maximum.accumulate(best), np.arange(best.shape[0]), 0))
    rest = MILLI_PER_GPU - sizes
    value = values + best[at[rest]]
    counts = np.zeros((sizes.shape[0], sizes.shape[0]), dtype=np.int64)
    for i in range(sizes.shape[0]):
        counts[i, i] = 1
        cap = int(at[rest[i]])
        while cap > 0:
            j = int(choice[cap])
            counts[i, j] += 1
            cap -= int(sizes[j])
    return value, counts


def shadow_prices(sizes: NDArray[np.int64], pods: NDArray[np.float64], n_gpus: float,
                  max_rounds: int = 200) -> tuple[float, NDArray[np.float64]]:
    """Optimal duals of the cutting-stock LP (module notes).

    Parameters
    ----------
    sizes : ndarray of shape (s,), int64
        Distinct pod shares, milli-GPU in 1..1000, ascending.
    pods : ndarray of shape (s,), float64
        Pods of each size, >= 0 (need not be integers: a distribution scaled to the cluster).
    n_gpus : float
        GPUs (bins), >= 0.
    max_rounds : int
        Column-generation rounds at most. The duals of the last restricted LP are returned
        if pricing still finds a better pattern then (never seen on the openb workloads,
        which converge in under 10 rounds).

    Returns
    -------
    gpu_price : float
        ``y_G >= 0``, milli-GPU of allocation one more GPU would add.
    size_price : ndarray of shape (s,), float64
        ``y_s >= 0``, milli-GPU of allocation one more pod of each size would add.

    Notes
    -----
    ``shadow_prices_by_model`` with one model that every size accepts (the same pivots).
    """
    s = sizes.shape[0]
    if s == 0 or n_gpus <= 0:
        return 0.0, np.zeros(s)
    gpu_price, size_price = shadow_prices_by_model(sizes, np.ones((s, 1), dtype=bool), pods,
                                                   np.array([float(n_gpus)]), max_rounds)
    return float(gpu_price[0]), size_price


def shadow_prices_by_model(sizes: NDArray[np.int64], allowed: NDArray[np.bool_], pods: NDArray[np.float64],
                           n_gpus: NDArray[np.float64], max_rounds: int = 200
                           ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Optimal duals of the cutting-stock LP with one kind of bin per GPU model.

    Pods of class ``c`` (share ``r_c``, ``n_c`` pods) may use the GPU models ``j`` with
    ``allowed[c, j]``; model ``j`` has ``G_j`` GPUs, and a pattern ``p`` of model ``j`` holds
    only classes allowed on ``j``::

        maximize    sum_j sum_p x_jp sum_c a_pc r_c
        subject to  sum_p x_jp <= G_j                   for every model j   (dual y_j)
                    sum_j sum_p a_pc x_jp <= n_c         for every class c   (dual y_c)
                    x_jp >= 0

    (the Gilmore-Gomory LP with several stock lengths of one width and item-specific
    stock, Gilmore and Gomory, Operations Research 9(6), 1961; Section 5 treats several
    stock kinds). Pricing solves one unbounded knapsack per model over its classes, values
    ``r_c - y_c``, and adds a pattern of model ``j`` when it is worth more than ``y_j``.

    Parameters
    ----------
    sizes : ndarray of shape (c,), int64
        Share of each class, milli-GPU in 1..1000 (classes may share a size).
    allowed : ndarray of shape (c, j), bool
        Which models each class may use.
    pods : ndarray of shape (c,), float64
        Pods of each class, >= 0.
    n_gpus : ndarray of shape (j,), float64
        GPUs of each model, >= 0.
    max_rounds : int
        Column-generation rounds at most (the last restricted LP's duals are returned then).

    Returns
    -------
    gpu_price : ndarray of shape (j,), float64
        ``y_j >= 0``, milli-GPU of allocation one more GPU of model ``j`` would add.
    class_price : ndarray of shape (c,), float64
        ``y_c >= 0``, milli-GPU of allocation one more pod of class ``c`` would add.

    Notes
    -----
    The restricted LP is solved by a dense tableau simplex (Dantzig's steepest reduced cost;
    Bland's rule after ``BLAND_AFTER`` pivots, which cannot cycle). New patterns enter the
    tableau as ``B^-1 a`` with reduced cost ``y . a - value`` and the simplex goes on from
    the current basis. Where several dual vertices are optimal, the pivot rules fix which
    one comes out: the same input gives the same prices. A model with no GPUs, or a class
    that no model with GPUs accepts, gets no column and prices at 0.
    """
    c_n, j_n = allowed.shape
    if c_n == 0 or j_n == 0:
        return np.zeros(j_n), np.zeros(c_n)
    rows = j_n + c_n
    usable = allowed & (np.asarray(n_gpus)[None, :] > 0)  # (c, j)
    # Columns: the slacks (their reduced costs are the duals), then one pod per GPU of each
    # (class, model) allowed; priced patterns are appended.
    cls, mdl = np.nonzero(usable.T)[::-1]  # model-major order: model 0's classes first
    first = np.zeros((rows, cls.shape[0]))
    first[mdl, np.arange(cls.shape[0])] = 1.0
    first[j_n + cls, np.arange(cls.shape[0])] = 1.0
    tab = np.hstack([np.eye(rows), first])
    rhs = np.concatenate([np.asarray(n_gpus, dtype=np.float64), pods.astype(np.float64)])
    rc = np.concatenate([np.zeros(rows), -sizes[cls].astype(np.float64)])  # y . a - value
    basis = np.arange(rows)
    pivots = 0
    y = np.zeros(rows)
    for _ in range(max_rounds):
        while True:
            j = int(np.argmin(rc))
            if rc[j] >= -_EPS * MILLI_PER_GPU:
                break
            if pivots >= BLAND_AFTER:  # Bland's rule: no cycling on degenerate vertices
                j = int(np.flatnonzero(rc < -_EPS * MILLI_PER_GPU)[0])
            pivots += 1
            col = tab[:, j]
            ok = col > _EPS
            ratio = np.where(ok, rhs / np.where(ok, col, 1.0), np.inf)
            tied = np.flatnonzero(ratio <= ratio.min() + _EPS)
            r = int(tied[np.argmin(basis[tied])])
            piv = tab[r, j]
            tab[r] /= piv
            rhs[r] /= piv
            f = tab[:, j].copy()
            f[r] = 0.0
            tab -= f[:, None] * tab[r]
            rhs -= f * rhs[r]
            rc = rc - rc[j] * tab[r]
            basis[r] = j
        y = rc[:rows].copy()
        cols = []
        for m in range(j_n):
            idx = np.flatnonzero(usable[:, m])
            if idx.shape[0] == 0:
                continue
            value, counts = _best_patterns(sizes[idx], sizes[idx] - y[j_n + idx])
            better = value - y[m] > _EPS * MILLI_PER_GPU
            for pattern in sorted({tuple(c) for c in counts[better].tolist()}):
                a = np.zeros(rows)
                a[m] = 1.0
                a[j_n + idx] = pattern
                cols.append(a)
        if not cols:
            break
        a = np.array(cols).T  # (rows, k)
        tab = np.hstack([tab, tab[:, :rows] @ a])
        rc = np.concatenate([rc, y @ a - a[j_n:].T @ sizes.astype(np.float64)])
    return np.maximum(y[:j_n], 0.0), np.maximum(y[j_n:], 0.0)


def priced_waste(sizes: NDArray[np.int64], size_price: NDArray[np.float64]) -> NDArray[np.float64]:
    """Share of a free gap lost at these prices: ``U(f)``, ``f = 0..1000`` milli.

    ``U(0) = 0``, ``U(f) = min(f, min_{s: r_s <= f} y_s + U(f - r_s))``: fill the gap with
    pods, paying each pod's price (what it is worth elsewhere), or leave the rest free.
    With ``V(f) = f - U(f)`` the best priced value of a gap, ``V`` is the pricing knapsack
    of ``shadow_prices`` over a gap of ``f`` instead of a GPU.

    Parameters
    ----------
    sizes : ndarray of shape (s,), int64
        Pod shares, milli-GPU in 1..1000, ascending.
    size_price : ndarray of shape (s,), float64
        ``y_s >= 0``.

    Returns
    -------
    ndarray of shape (1001,), float64
        ``U[f]`` in ``[0, f]``.
    """
    f = np.arange(MILLI_PER_GPU + 1)
    u = f.astype(np.float64)
    if sizes.shape[0] == 0:
        return u
    col = sizes[:, None]
    price = size_price[:, None]
    step = int(sizes.min())
    for lo in range(step, MILLI_PER_GPU + 1, step):
        fb = f[lo:lo + step]
        prev = fb - col
        cand = np.where(prev >= 0, price + u[np.maximum(prev, 0)], np.inf)
        u[lo:lo + step] = np.minimum(fb, cand.min(axis=0))
    return u
