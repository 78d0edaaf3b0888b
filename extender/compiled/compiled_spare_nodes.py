"""Spare nodes' node score (``scoring.strategies.spare_nodes``) in one compiled pass.

The reference's numbers to the bit: per node the wholly free healthy GPUs before and after
the pod, the cost summed over the multi-GPU sizes in the reference's order, then
``1/2 - cost / 2000`` clipped. The formula and its source are in the reference's module
notes.

``tests/extender/compiled/test_compiled_strategies.py`` holds it to the reference.
"""

from __future__ import annotations

import numba
import numpy as np
from numpy.typing import NDArray

from extender.compiled.jit import kernel
from scoring.fit import FitContext
from scoring.request import MILLI_PER_GPU
from scoring.strategies import spare_nodes as reference

_B2 = numba.boolean[:, :]


@kernel(numba.void(_B2, _B2, numba.int64[:, :], _B2, numba.int64[:], numba.float64[:], numba.float64[:]))
def _node(exists, healthy, free, chosen, sizes, price, out):  # type: ignore[no-untyped-def]
    """``out[i]``: the node score of row ``i``; ``price[j]`` is ``1000 * sizes[j] * P_k``."""
    for i in range(exists.shape[0]):
        before = 0
        taken = 0
        for g in range(exists.shape[1]):
            if exists[i, g] and healthy[i, g] and free[i, g] >= MILLI_PER_GPU:
                before += 1
                if chosen[i, g]:
                    taken += 1
        after = before - taken
        cost = 0.0
        for j in range(sizes.shape[0]):
            cost += (before // sizes[j] - after // sizes[j]) * price[j]
        out[i] = min(max(0.5 - cost / 2000.0, 0.0), 1.0)


def node_score(ctx: FitContext, chosen: NDArray[np.bool_]) -> NDArray[np.float64]:
    """``scoring.strategies.spare_nodes.node_score``, the same numbers.

    Parameters
    ----------
    ctx : FitContext
    chosen : ndarray of shape (m, max_gpus), bool

    Returns
    -------
    ndarray of shape (m,), float64
    """
    need = ctx.terms.get(reference.TERM, ())
    if not isinstance(need, tuple) or not need or ctx.gpu_healthy is None:
        return reference.node_score(ctx, chosen)
    sizes = np.array([k for k, _ in need], dtype=np.int64)
    price = np.array([MILLI_PER_GPU * k * p for k, p in need], dtype=np.float64)
    out = np.empty(chosen.shape[0])
    try:
        _node(ctx.gpu_exists, ctx.gpu_healthy, ctx.free_milli, chosen, sizes, price, out)
    except TypeError:  # arrays of other dtypes: no compile on the hot path
        return reference.node_score(ctx, chosen)
    return out
