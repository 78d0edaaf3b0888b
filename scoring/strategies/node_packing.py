"""Node packing: prefer the node whose GPUs are the most allocated after placement.

Notes
-----
With ``U`` the node's allocated share, ``T`` its total share (1000 x GPUs), ``k`` GPUs
and ``r`` milli requested::

    node_score = (U + k * r) / T

the GPU analogue of kube-scheduler's ``MostAllocated`` (``noderesources/most_allocated.go``:
``requested * MaxNodeScore / capacity``), kept as a float in [0, 1]. It fills partly used
nodes first, keeping whole nodes free for multi-GPU pods. No per-GPU preference.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from scoring.fit import FitContext
from scoring.utilization import packing

NAME = "node_packing"

gpu_score = None
"""No per-GPU preference: the GPU choice is left to the other strategies."""


def node_score(ctx: FitContext, chosen: NDArray[np.bool_]) -> NDArray[np.float64]:
    """GPU share utilization of each node after placement (``scoring.utilization.packing``).

    Parameters
    ----------
    ctx : FitContext
    chosen : ndarray of shape (m, max_gpus), bool
        Unused (the node total does not depend on which GPUs).

    Returns
    -------
    ndarray of shape (m,), float64
        In [0, 1]; 0 for a node without GPUs.
    """
    return packing(ctx)
