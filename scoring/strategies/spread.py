"""Spread: prefer the node whose GPUs are the least allocated after placement.

Notes
-----
With ``U``, ``T``, ``k``, ``r`` as in ``node_packing``::

    node_score = 1 - (U + k * r) / T

the GPU analogue of kube-scheduler's ``LeastAllocated``
(``noderesources/least_allocated.go``: ``(capacity - requested) * MaxNodeScore / capacity``).
It lowers contention at the price of fragmentation; it is the opposite of packing and
is off (weight 0) in the shipped default.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from scoring.fit import FitContext
from scoring.utilization import packing

NAME = "spread"

gpu_score = None
"""No per-GPU preference."""


def node_score(ctx: FitContext, chosen: NDArray[np.bool_]) -> NDArray[np.float64]:
    """One minus the node's GPU share utilization after placement.

    Parameters
    ----------
    ctx : FitContext
    chosen : ndarray of shape (m, max_gpus), bool

    Returns
    -------
    ndarray of shape (m,), float64
        In [0, 1]; 0 for a node without GPUs.
    """
    util = packing(ctx)
    return np.where(ctx.node_total_milli > 0, 1.0 - util, 0.0)
