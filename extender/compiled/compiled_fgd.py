"""FGD's scores (``scoring.strategies.fgd``) in one compiled pass over the candidate rows.

The numbers are the reference's to the bit: the same integer sums ``N * F_n`` (before, and
after the pod on each fitting GPU or on the chosen GPUs), then the reference's own
``to_score`` on them. What differs is how they are reached: loops over rows, GPUs and task
types in machine code instead of about sixty numpy calls a pod, whose fixed cost is most of
a one-row rescoring (decision record 0032). The module notes of ``scoring.strategies.fgd``
give the formula and its source.

What this pass does not cover runs the reference: no workload known yet, and GPU memory as a
dimension (a type that asks for explicit GPU memory, ``TaskTypes.gpu_memory_mib``). The
kernels take the arrays of one signature (``_ROWS``); a ``FitContext`` of other dtypes
(none is built so today) is scored by the reference too, never compiled on the hot path.

``tests/extender/compiled/test_compiled_fgd.py`` holds the kernels to the reference.
"""

from __future__ import annotations

import numba
import numpy as np
from numpy.typing import NDArray

from extender.compiled.jit import inline, kernel
from scoring.fit import FitContext
from scoring.fragmentation import TaskTypes
from scoring.strategies import fgd as reference

_I2, _B2, _I1, _B1 = numba.int64[:, :], numba.boolean[:, :], numba.int64[:], numba.boolean[:]
_ROWS = (_I2, _B2, _I2, _B1, _I1, _I1, _I1, _I1, _I1, _I1, _I1, _I1, numba.int64, numba.int64, numba.int64)
"""Per row: free share, GPU exists, model id (m, G); node fits, free CPU, free host memory
(m,); per task type: share, GPU count, CPU, memory, pods, model mask (t,); the pod's share,
CPU and memory."""


@inline
def _usable(mask: int, model: int) -> bool:
    """``TaskTypes.allowed`` for one type and one GPU: padding (-1) reads as model 0, ids past
    62 share bit 63 (a mask of -1 accepts every model)."""
    return ((mask >> min(max(model, 0), 63)) & 1) == 1


@inline
def _counts(free: NDArray[np.int64], exists: NDArray[np.bool_], model: NDArray[np.int64], i: int,
            t_milli: NDArray[np.int64], t_mask: NDArray[np.int64], cnt: NDArray[np.int64],
            small: NDArray[np.int64], chosen: NDArray[np.bool_] | None, take: int) -> int:
    """Row ``i``'s usable GPUs per type (``cnt``) and the share on the GPUs each type cannot
    use (``small``), with ``take`` less share on the ``chosen`` GPUs; the row's free share."""
    n_types = t_milli.shape[0]
    cnt[:] = 0
    small[:] = 0
    total = 0
    for g in range(free.shape[1]):
        f = _free(free, exists, chosen, i, g, take)
        total += f
        for t in range(n_types):
            if f >= t_milli[t] and _usable(t_mask[t], model[i, g]):
                cnt[t] += 1
            else:
                small[t] += f
    return total


@inline
def _free(free: NDArray[np.int64], exists: NDArray[np.bool_], chosen: NDArray[np.bool_] | None,
          i: int, g: int, take: int) -> int:
    if not exists[i, g]:
        return 0
    if chosen is not None and chosen[i, g]:
        return int(free[i, g]) - take
    return int(free[i, g])


@inline
def _expected(cnt: NDArray[np.int64], small: NDArray[np.int64], total: int, cpu: int, mem: int,
              t_k: NDArray[np.int64], t_cpu: NDArray[np.int64], t_mem: NDArray[np.int64],
              t_count: NDArray[np.int64]) -> int:
    """``sum_t n_t * (small_t if t runs else total)``: ``N * F_n`` (the reference's ``_expected``)."""
    out = 0
    for t in range(cnt.shape[0]):
        if cnt[t] >= t_k[t] and cpu >= t_cpu[t] and mem >= t_mem[t]:
            out += t_count[t] * small[t]
        else:
            out += t_count[t] * total
    return out


@kernel(numba.void(*_ROWS, _B2, _I2))
def _gpu_delta(free, exists, model, node_fits, cpu_free, mem_free, t_milli, t_k, t_cpu, t_mem,  # type: ignore[no-untyped-def]
               t_count, t_mask, req_milli, req_cpu, req_mem, gpu_fits, out):
    """``out[i, g] = N * (F_n with the pod on GPU g alone - F_n)`` on every fitting GPU of every
    fitting row; ``out`` is left as it is elsewhere."""
    n_types = t_milli.shape[0]
    cnt = np.empty(n_types, np.int64)
    small = np.empty(n_types, np.int64)
    for i in range(free.shape[0]):
        if not node_fits[i]:
            continue
        total = _counts(free, exists, model, i, t_milli, t_mask, cnt, small, None, 0)
        before = _expected(cnt, small, total, cpu_free[i], mem_free[i], t_k, t_cpu, t_mem, t_count)
        cpu_after, mem_after = cpu_free[i] - req_cpu, mem_free[i] - req_mem
        for g in range(free.shape[1]):
            if not gpu_fits[i, g]:
                continue
            f = _free(free, exists, None, i, g, 0)
            fp = f - req_milli
            after = 0
            for t in range(n_types):
                usable = _usable(t_mask[t], model[i, g])
                was, now = f >= t_milli[t] and usable, fp >= t_milli[t] and usable
                c = cnt[t] - was + now
                s = small[t] - (0 if was else f) + (0 if now else fp)
                if c >= t_k[t] and cpu_after >= t_cpu[t] and mem_after >= t_mem[t]:
                    after += t_count[t] * s
                else:
                    after += t_count[t] * (total - req_milli)
            out[i, g] = after - before


@kernel(numba.void(*_ROWS, _B2, _I1))
def _node_delta(free, exists, model, node_fits, cpu_free, mem_free, t_milli, t_k, t_cpu, t_mem,  # type: ignore[no-untyped-def]
                t_count, t_mask, req_milli, req_cpu, req_mem, chosen, out):
    """``out[i] = N * (F_n with the pod on the chosen GPUs - F_n)`` on every fitting row;
    ``out`` is left as it is elsewhere."""
    n_types = t_milli.shape[0]
    cnt = np.empty(n_types, np.int64)
    small = np.empty(n_types, np.int64)
    for i in range(free.shape[0]):
        if not node_fits[i]:
            continue
        total = _counts(free, exists, model, i, t_milli, t_mask, cnt, small, None, 0)
        before = _expected(cnt, small, total, cpu_free[i], mem_free[i], t_k, t_cpu, t_mem, t_count)
        total = _counts(free, exists, model, i, t_milli, t_mask, cnt, small, chosen, req_milli)
        after = _expected(cnt, small, total, cpu_free[i] - req_cpu, mem_free[i] - req_mem,
                          t_k, t_cpu, t_mem, t_count)
        out[i] = after - before


def _compiled(ctx: FitContext) -> TaskTypes | None:
    """The workload when the kernels cover ``ctx`` (module notes), else None."""
    tasks = ctx.tasks
    if tasks is None or (tasks.gpu_memory_mib is not None and ctx.gpu_mem_free_mib is not None):
        return None
    return tasks


def _rows_args(ctx: FitContext, tasks: TaskTypes) -> tuple[object, ...]:
    """The kernels' arguments up to the pod's (``_ROWS``)."""
    model = ctx.gpu_model if ctx.gpu_model is not None else np.zeros(ctx.free_milli.shape, dtype=np.int64)
    mask = tasks.model_mask if tasks.model_mask is not None else np.full(tasks.count.shape, -1, dtype=np.int64)
    req = ctx.request
    return (ctx.free_milli, ctx.gpu_exists, model, ctx.node_fits, ctx.cpu_free_milli, ctx.mem_host_free_mib,
            tasks.gpu_milli, tasks.gpu_count, tasks.cpu_milli, tasks.memory_mib, tasks.count, mask,
            req.gpu_milli, req.cpu_milli, req.memory_mib)


def gpu_score(ctx: FitContext) -> NDArray[np.float64]:
    """``scoring.strategies.fgd.gpu_score``, the same numbers.

    Parameters
    ----------
    ctx : FitContext

    Returns
    -------
    ndarray of shape (m, max_gpus), float64
        In [0, 1]; 0 where the GPU does not fit.
    """
    tasks = _compiled(ctx)
    if tasks is None:
        return reference.gpu_score(ctx)
    delta = np.zeros(ctx.gpu_fits.shape, dtype=np.int64)
    try:
        _gpu_delta(*_rows_args(ctx, tasks), ctx.gpu_fits, delta)
    except TypeError:  # arrays of another dtype: no compile on the hot path
        return reference.gpu_score(ctx)
    return np.where(ctx.gpu_fits & ctx.node_fits[:, None], reference.to_score(delta, tasks), 0.0)


def node_score(ctx: FitContext, chosen: NDArray[np.bool_]) -> NDArray[np.float64]:
    """``scoring.strategies.fgd.node_score``, the same numbers.

    Parameters
    ----------
    ctx : FitContext
    chosen : ndarray of shape (m, max_gpus), bool

    Returns
    -------
    ndarray of shape (m,), float64
        In [0, 1]; 0 on infeasible nodes.
    """
    tasks = _compiled(ctx)
    if tasks is None:
        return reference.node_score(ctx, chosen)
    delta = np.zeros(chosen.shape[0], dtype=np.int64)
    try:
        _node_delta(*_rows_args(ctx, tasks), chosen, delta)
    except TypeError:  # as gpu_score
        return reference.node_score(ctx, chosen)
    return np.where(ctx.node_fits, reference.to_score(delta, tasks), 0.0)
