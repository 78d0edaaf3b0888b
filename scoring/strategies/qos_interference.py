"""QoS interference: keep best-effort pods off GPUs that hold guaranteed ones, and back.

Notes
-----
Per GPU that fits, with ``G`` guaranteed and ``B`` best-effort pods on it::

    conflict = (pod is best-effort and G > 0) or (pod is guaranteed and B > 0)
    gpu_score = 0 if conflict else 1

node score = mean over the chosen GPUs. A burstable pod never conflicts. This is the
score-level form of the isolation of Baymax (Chen et al., ASPLOS '16) and AntMan
(Xiao et al., OSDI '20): latency-critical work must not share an SM pool with
opportunistic work when another GPU can take it.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from scoring.fit import FitContext
from scoring.request import QoSClass

NAME = "qos_interference"


def gpu_score(ctx: FitContext) -> NDArray[np.float64]:
    """1 on GPUs without a conflicting QoS class, 0 otherwise.

    Parameters
    ----------
    ctx : FitContext

    Returns
    -------
    ndarray of shape (m, max_gpus), float64
        In {0, 1}; 0 where the GPU does not fit.
    """
    qos = ctx.request.qos
    if qos == QoSClass.BEST_EFFORT:
        conflict = ctx.qos_pods[:, :, QoSClass.GUARANTEED] > 0
    elif qos == QoSClass.GUARANTEED:
        conflict = ctx.qos_pods[:, :, QoSClass.BEST_EFFORT] > 0
    else:
        conflict = np.zeros(ctx.gpu_fits.shape, dtype=bool)
    return np.where(ctx.gpu_fits & ~conflict, 1.0, 0.0)



node_score = None
"""Node score = mean of ``gpu_score`` over the chosen GPUs (done by the scorer)."""
