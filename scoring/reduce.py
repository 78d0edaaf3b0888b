"""GPU -> node reductions shared by the per-GPU strategies."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def mean_over_chosen(
    per_gpu: NDArray[np.float64], chosen: NDArray[np.bool_]
) -> NDArray[np.float64]:
    """Mean of a per-GPU score over each node's chosen GPUs.

    Parameters
    ----------
    per_gpu : ndarray of shape (m, max_gpus), float64
    chosen : ndarray of shape (m, max_gpus), bool

    Returns
    -------
    ndarray of shape (m,), float64
        0 on rows with nothing chosen.
    """
    n = chosen.sum(axis=1)
    total = np.where(chosen, per_gpu, 0.0).sum(axis=1)
    return np.divide(total, n, out=np.zeros(total.shape), where=n > 0)
