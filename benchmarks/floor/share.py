"""The cutting-stock floor over GPU share, every GPU of one kind (``max_allocated_milli``):
column generation over bin patterns (the package notes).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from benchmarks.floor.demand import MILLI_PER_GPU, ArrivedGpuDemand
from benchmarks.floor.lp import best_pattern, load_linprog


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
        Without scipy (the ``bench`` extra).
    """
    if not demand.fractional and not demand.whole:
        return 0.0
    return column_generation(demand, n_gpus, max_rounds)[0]


def column_generation(demand: ArrivedGpuDemand, n_gpus: int, max_rounds: int,
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
        value, counts = best_pattern(sizes, sizes - duals[1:], avail, step)
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
        Without scipy (the ``bench`` extra).
    """
    linprog = load_linprog()

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
