"""Random: a pseudo-random preference, the baseline every placement paper compares against.

Notes
-----
Weng et al. (USENIX ATC '23, section 6) compare against *Random*, which places a pod on a
feasible node and GPU chosen uniformly at random (13.75 % unallocated at 100 % arrived on
openb default). Here each (node row, GPU column) gets::

    gpu_score = splitmix64(row * G + col + key) / 2**64

where ``key`` mixes the pod's requests with the GPU's free share and the node's free CPU.
A node's draws change whenever a pod lands on it, so a run of identical pods scatters as a
random choice would, while the draw depends only on the node's own state and the pod: the
same for the same state, independent of which other nodes are candidates, and
permutation-equivariant over nodes. 0 on GPUs that do not fit. The node score is the mean
over the chosen GPUs (``Scorer`` default). For comparison only.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from scoring.fit import FitContext

NAME = "random_fit"

READS_ROW = True
"""The draws mix in the row: two nodes of equal content draw differently."""

node_score = None
"""The node scores the mean of its chosen GPUs' draws."""

_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(x: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """SplitMix64 finaliser (Steele, Lea, Flood, OOPSLA '14), wrapping uint64 arithmetic."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def gpu_score(ctx: FitContext) -> NDArray[np.float64]:
    """A uniform draw in [0, 1) per candidate GPU.

    Parameters
    ----------
    ctx : FitContext

    Returns
    -------
    ndarray of shape (m, max_gpus), float64
    """
    req = ctx.request
    g = ctx.free_milli.shape[1]
    pod_key = np.uint64((req.cpu_milli * 8_191 + req.gpu_milli * 131 + req.gpu_count) & int(_MASK))
    cells = (ctx.rows.astype(np.uint64)[:, None] * np.uint64(g)
             + np.arange(g, dtype=np.uint64)).astype(np.uint64)
    local = (ctx.free_milli.astype(np.uint64) * np.uint64(1_000_003)
             + ctx.cpu_free_milli.astype(np.uint64)[:, None])
    with np.errstate(over="ignore"):
        draw = _splitmix64(_splitmix64(cells) ^ _splitmix64(local) ^ pod_key)
    uniform = (draw >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return np.where(ctx.gpu_fits, uniform, 0.0)
