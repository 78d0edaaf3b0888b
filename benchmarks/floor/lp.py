"""The LP pieces the floors share: scipy's ``linprog`` (imported on use) and the bounded
knapsack that prices a new bin pattern in column generation.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np
from numpy.typing import NDArray

from benchmarks.floor.demand import MILLI_PER_GPU


def load_linprog() -> Any:
    """scipy's ``linprog`` (HiGHS): only this benchmark needs it, so it is imported here."""
    try:
        from scipy.optimize import linprog
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError('the floor needs scipy: pip install -e ".[bench]"') from e
    return linprog


def new_highs() -> Any:
    """A silent ``highspy.Highs`` model, for LPs solved many times with changed bounds and
    added columns (each solve starts from the last basis, which ``linprog`` cannot). The
    banner a process's first ``Highs()`` prints to standard output is discarded."""
    try:
        import highspy
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError('the floor needs highspy: pip install -e ".[bench]"') from e
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            h = highspy.Highs()  # type: ignore[no-untyped-call]
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    h.setOptionValue("output_flag", False)
    return h


def best_pattern(sizes: NDArray[np.int64], values: NDArray[np.float64], limit: NDArray[np.int64],
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
