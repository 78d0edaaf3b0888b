"""BestFit as published: the node left with the least CPU and GPU after placement.

Notes
-----
The BestFit baseline of Weng et al., "Beware of Fragmentation", USENIX ATC '23 (section 6),
as the authors' simulator computes it (hkust-adsl/kubernetes-scheduler-simulator,
``pkg/simulator/plugin/best_fit_score.go``). For a node with free CPU ``C`` (milli) and
free GPU share ``F = sum_g f_g`` (milli), and a pod asking ``c`` CPU milli and ``k`` GPUs
of ``r`` milli::

    left       = 0.5 * (C - c) / 128000 + 0.5 * (F - k * r) / 8000
    node_score = trunc(100 * (1 - left)) / 100

128,000 CPU milli and 8 GPUs are the simulator's ``MaxSpecCpu`` / ``MaxSpecGpu``. The
simulator's scores are integers 0..100 and the published numbers come from ties broken by
the smallest node name; the truncation keeps those ties, and gpufrac's own tie-break (lowest
cluster row, rows in node-name order) is the same rule. ``left`` may exceed 1 on nodes
larger than the spec; the score is clipped to [0, 1].

Inside the node the pod takes the GPUs with the least free share that fits (the
simulator's ``allocateGpuIdBasedOnBestFit``): ``gpu_score_g = 1 - (f_g - r) / 1000``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from scoring.fit import FitContext
from scoring.reduce import clip
from scoring.utilization import tightness

NAME = "best_fit"

MAX_SPEC_CPU_MILLI = 128_000
"""The simulator's CPU normalisation (``MaxSpecCpu``)."""

MAX_SPEC_GPU_MILLI = 8_000
"""The simulator's GPU normalisation (``MaxSpecGpu``: 8 GPUs)."""

SCORE_LEVELS = 100
"""The simulator's integer score range (kube-scheduler's ``MaxNodeScore``)."""


gpu_score = tightness
"""The tightest GPU inside the node: ``1 - (f_g - r) / 1000`` (``scoring.utilization.tightness``,
as ``scoring.strategies.gpu_best_fit``)."""


def node_score(ctx: FitContext, chosen: NDArray[np.bool_]) -> NDArray[np.float64]:
    """How little CPU and GPU the node has left after placement, in 1/100 steps.

    Parameters
    ----------
    ctx : FitContext
    chosen : ndarray of shape (m, max_gpus), bool
        Unused (the node totals do not depend on which GPUs).

    Returns
    -------
    ndarray of shape (m,), float64
        In [0, 1], a multiple of 1/100; higher means less left over.
    """
    req = ctx.request
    gpu_free = np.where(ctx.gpu_exists, ctx.free_milli, 0).sum(axis=1)
    # The simulator's order of operations, so that scores truncate to the same integer.
    left = ((ctx.cpu_free_milli - req.cpu_milli) / MAX_SPEC_CPU_MILLI * 0.5
            + (gpu_free - req.gpu_count * req.gpu_milli) / MAX_SPEC_GPU_MILLI * 0.5)
    score: NDArray[np.float64] = clip(np.trunc((1.0 - left) * SCORE_LEVELS) / SCORE_LEVELS, 0.0, 1.0)
    return score
