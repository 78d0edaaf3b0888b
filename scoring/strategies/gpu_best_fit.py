"""GPU best-fit: put the pod on the GPU it fills most tightly.

Notes
-----
Per GPU ``g`` that fits, with free share ``f_g`` (milli) and request ``r`` (milli)::

    gpu_score_g = min(1 - (f_g - r) / 1000, 1)

so a GPU left exactly full scores 1 and an empty GPU taking a 100-milli pod scores 0.1 (a
pod that fits only by squeezing best-effort pods, ``f_g < r``, also scores 1).
The node score is the mean of ``gpu_score`` over the GPUs chosen on that node. A whole-GPU
pod leaves ``f_g - r = 0`` on any free GPU, so this strategy ties on whole-GPU pods and
the packing strategies decide them. Source: the BestFit heuristic of the bin-packing
literature (Johnson 1974) applied per GPU, as in Weng et al., "Beware of Fragmentation",
USENIX ATC '23, section 6 (BestFit baseline).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from scoring.fit import FitContext
from scoring.utilization import tightness

NAME = "gpu_best_fit"


def gpu_score(ctx: FitContext) -> NDArray[np.float64]:
    """Tightness of fit per GPU (``scoring.utilization.tightness``).

    Parameters
    ----------
    ctx : FitContext

    Returns
    -------
    ndarray of shape (m, max_gpus), float64
        In [0, 1]; 0 where the GPU does not fit.
    """
    return tightness(ctx)


node_score = None
"""Node score = mean of ``gpu_score`` over the chosen GPUs (done by the scorer)."""
