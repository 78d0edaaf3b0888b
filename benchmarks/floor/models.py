"""The cutting-stock floor with a bin kind per GPU model (``max_allocated_milli_by_model``),
for pod lists that carry ``gpu_spec`` (the package notes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from benchmarks.floor.demand import MILLI_PER_GPU, ModelGpuDemand
from benchmarks.floor.lp import best_pattern, load_linprog


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
            value, counts = best_pattern(sizes, np.where(on, sizes - duals[len(models):len(models) + len(classes)],
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
    linprog = load_linprog()

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
