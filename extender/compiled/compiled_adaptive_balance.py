"""Adaptive balance's node score (``scoring.strategies.adaptive_balance``) in one compiled pass.

The reference's numbers to the bit: per node the utilizations after placement
(``scoring.utilization.utilizations``), the two-sided balance and the one-sided host lead,
mixed by the reference's own factors (``adaptive_balance.mix``), in the reference's order of
float operations; no sum over GPUs, so no summation order to match. The formula and its
source are in the reference's module notes.

``tests/extender/compiled/test_compiled_strategies.py`` holds it to the reference.
"""

from __future__ import annotations

import numba
import numpy as np
from numpy.typing import NDArray

from extender.compiled.jit import kernel
from scoring.fit import FitContext
from scoring.strategies import adaptive_balance as reference

_I1, _F1 = numba.int64[:], numba.float64[:]


@kernel(numba.void(_I1, _I1, _I1, _I1, _I1, _I1, numba.int64, numba.int64, numba.int64, numba.float64,
                   numba.float64, _F1))
def _node(used, total, cpu_alloc, cpu_free, mem_alloc, mem_free, gpu, cpu, mem, two_sided, one_sided,  # type: ignore[no-untyped-def]
          out):
    """``out[i]``: the node score of row ``i`` (0 without GPUs, allocatable CPU or memory)."""
    for i in range(used.shape[0]):
        two = 0.0
        one = 0.0
        if total[i] > 0 and cpu_alloc[i] > 0 and mem_alloc[i] > 0:
            u_gpu = (used[i] + gpu) / total[i]
            u_cpu = (cpu_alloc[i] - cpu_free[i] + cpu) / cpu_alloc[i]
            u_mem = (mem_alloc[i] - mem_free[i] + mem) / mem_alloc[i]
            gap = max(abs(u_cpu - u_gpu), abs(u_mem - u_gpu))
            two = min(max(1.0 - gap, 0.0), 1.0)
            lead = max(max(u_cpu - u_gpu, u_mem - u_gpu), 0.0)
            one = min(max(1.0 - lead, 0.0), 1.0)
        out[i] = (two_sided * two + one_sided * one) / 2.0


def node_score(ctx: FitContext, chosen: NDArray[np.bool_]) -> NDArray[np.float64]:
    """``scoring.strategies.adaptive_balance.node_score``, the same numbers.

    Parameters
    ----------
    ctx : FitContext
    chosen : ndarray of shape (m, max_gpus), bool
        Unused, as in the reference.

    Returns
    -------
    ndarray of shape (m,), float64
    """
    two_sided, one_sided = reference.mix(ctx)
    req = ctx.request
    out = np.empty(ctx.rows.shape[0])
    try:
        _node(ctx.node_used_milli, ctx.node_total_milli, ctx.cpu_alloc_milli, ctx.cpu_free_milli,
              ctx.mem_host_alloc_mib, ctx.mem_host_free_mib, req.gpu_count * req.gpu_milli, req.cpu_milli,
              req.memory_mib, two_sided, one_sided, out)
    except TypeError:  # arrays of other dtypes: no compile on the hot path
        return reference.node_score(ctx, chosen)
    return out
