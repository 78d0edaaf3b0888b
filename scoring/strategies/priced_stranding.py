"""Priced stranding: charge a placement the gap value it leaves without CPU or memory to use it.

Notes
-----
``scoring.strategies.gap_price`` values a GPU's free share ``f`` at ``V(f) = f - U(f)`` milli-GPU, the
share the workload is expected to use, as if any pod could go there. But pods bring CPU and
host memory, and a node's free GPUs are of use only as far as its free CPU and memory go:
the rest is "CPU-stranded" (Weng et al., USENIX ATC '23, section 3). With the learned
workload's CPU and memory per milli-GPU (``rho_cpu = sum_t n_t cpu_t / sum_t n_t k_t s_t``,
``rho_mem`` alike, over the GPU task types: ``n_t`` pods of ``k_t`` GPUs of share ``s_t``),
a node with free CPU ``c``, free memory ``m`` and GPUs of free share ``f_g`` strands::

    S(c, m, f) = max(0, sum_g V(f_g) - min(c / rho_cpu, m / rho_mem))

milli-GPU of value, and the pod, taking ``c - c'``, ``m - m'`` and leaving ``f'``, costs::

    delta = S(c', m', f') - S(c, m, f)
    score = 1/2 - delta / 2000          (clipped to [0, 1])

in the units of ``gap_price`` (``1/2 - delta / 2000``, the same weight prices a milli of
stranded value like a milli of priced gap). ``delta`` is negative where the pod uses GPU
value the node's CPU could not have served anyway.

On openb default (``rho_cpu`` about 10.9 CPU milli per milli-GPU; ``V(1000) = 810``) a
470-milli pod asking 8 cores on a 1-GPU, 8-core node strands ``V(530) - 0 = 405`` where the
node stranded ``810 - 8000 / 10.9 = 75`` before (``delta = +330``), while on a 96-core, 8-GPU node it
strands nothing; an 810-milli pod asking 3 cores on that small node leaves ``V(190) = 0``
and 5 cores (``delta = -75``). FGD's fragmentation (``scoring.strategies.fgd``) rates the first
placement cheap, because the small node already could not run the types that need more
than 8 cores.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from scoring.fit import FitContext
from scoring.gaps import model_waste, waste_by_gpu
from scoring.reduce import clip
from scoring.request import MILLI_PER_GPU

NAME = "priced_stranding"

gpu_score = None
"""A node property: the GPUs are chosen by the other terms."""


def host_per_milli(ctx: FitContext) -> tuple[float, float]:
    """``(rho_cpu, rho_mem)``: the workload's CPU milli and memory MiB per milli-GPU.

    Parameters
    ----------
    ctx : FitContext
        With ``ctx.tasks`` set.

    Returns
    -------
    tuple of float
        Both >= 0; (0, 0) when no type asks for a GPU.
    """
    tasks = ctx.tasks
    assert tasks is not None
    gpu = tasks.gpu_count > 0
    share = float((tasks.count * tasks.gpu_count * np.minimum(tasks.gpu_milli, MILLI_PER_GPU))[gpu].sum())
    if share <= 0:
        return 0.0, 0.0
    return (float((tasks.count * tasks.cpu_milli)[gpu].sum()) / share,
            float((tasks.count * tasks.memory_mib)[gpu].sum()) / share)


def node_score(ctx: FitContext, chosen: NDArray[np.bool_]) -> NDArray[np.float64]:
    """``1/2 - delta / 2000`` per node (see module notes).

    Parameters
    ----------
    ctx : FitContext
    chosen : ndarray of shape (m, max_gpus), bool
        GPUs the pod takes on each node.

    Returns
    -------
    ndarray of shape (m,), float64
        In [0, 1]; 1/2 while no workload is known.
    """
    m = ctx.rows.shape[0]
    if ctx.tasks is None:
        return np.full(m, 0.5)
    rho_cpu, rho_mem = host_per_milli(ctx)
    req = ctx.request
    free = clip(ctx.free_milli, 0, MILLI_PER_GPU)  # 0 on padding
    after = np.where(chosen, clip(free - req.gpu_milli, 0, MILLI_PER_GPU), free)
    u_free, u_after = waste_by_gpu(ctx, model_waste(ctx), free, after)
    value, value_after = (free - u_free).sum(axis=1), (after - u_after).sum(axis=1)

    def serves(cpu: NDArray[np.int64], mem: NDArray[np.int64]) -> NDArray[np.float64]:
        by_cpu = np.maximum(cpu, 0) / rho_cpu if rho_cpu > 0 else np.full(m, np.inf)
        by_mem = np.maximum(mem, 0) / rho_mem if rho_mem > 0 else np.full(m, np.inf)
        return np.minimum(by_cpu, by_mem)

    cpu, mem = ctx.cpu_free_milli, ctx.mem_host_free_mib
    before = np.maximum(value - serves(cpu, mem), 0.0)
    left = np.maximum(value_after - serves(cpu - req.cpu_milli, mem - req.memory_mib), 0.0)
    score: NDArray[np.float64] = clip(0.5 - (left - before) / 2000.0, 0.0, 1.0)
    return score
