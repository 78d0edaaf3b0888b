"""Memory headroom: prefer GPUs that keep the most memory free after placement.

Notes
-----
Per GPU that fits, with free memory ``F`` (MiB), total ``M`` and request ``q``::

    gpu_score = (F - q) / M

node score = mean over the chosen GPUs. Headroom absorbs the gap between what pods declare
and what they really use (NVML ``memory.used`` exceeds requests in practice, the OOM
complaints of HAMi and gpushare users), at some cost in packing; a small weight keeps it a
tie-breaker among equally packed GPUs.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from scoring.fit import FitContext

NAME = "memory_headroom"


def gpu_score(ctx: FitContext) -> NDArray[np.float64]:
    """Fraction of the GPU's memory still free after placement.

    Parameters
    ----------
    ctx : FitContext

    Returns
    -------
    ndarray of shape (m, max_gpus), float64
        In [0, 1]; 0 where the GPU does not fit.
    """
    total = ctx.mem_total_mib
    left = ctx.mem_free_mib - ctx.mem_req_mib
    frac = np.divide(left, total, out=np.zeros(left.shape), where=total > 0)
    return np.where(ctx.gpu_fits, np.clip(frac, 0.0, 1.0), 0.0)



node_score = None
"""Node score = mean of ``gpu_score`` over the chosen GPUs (done by the scorer)."""
