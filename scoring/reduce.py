"""GPU -> node reductions shared by the scorer."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def mean_at(per_gpu: NDArray[np.float64], cols: NDArray[np.int64]) -> NDArray[np.float64]:
    """Mean of a per-GPU score over each node's chosen GPU columns.

    Parameters
    ----------
    per_gpu : ndarray of shape (m, max_gpus), float64
    cols : ndarray of shape (m, k), int64
        Chosen columns per node, k >= 1; entries < 0 (infeasible rows) count as column 0,
        the caller masks those rows.

    Returns
    -------
    ndarray of shape (m,), float64
    """
    mean: NDArray[np.float64] = np.take_along_axis(per_gpu, np.maximum(cols, 0), axis=1).mean(axis=1)
    return mean
