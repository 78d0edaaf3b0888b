"""Gaps: what a GPU's free share is worth, shared by ``gap_price`` and ``priced_stranding``.

A value function ``V`` of the free share ``f`` (milli-GPU, 0..1000) gives the share of a gap
of ``f`` lost at saturation; a per-GPU term scores a placement by how it changes ``V`` of the
GPU's gap. ``gap_waste`` is that function at the shadow prices of the cutting-stock LP of the
learned workload scaled to the cluster (``scoring.cutting_stock``; the formula and its
source are in ``scoring.strategies.gap_price``):

    U(0) = 0,   U(f) = min(f, min_{s <= f} y_s + U(f - s))     f = 1..1000

``model_waste`` gives it per GPU model, ``waste_by_gpu`` looks it up for every candidate GPU,
and ``gap_score`` is the shared per-GPU score ``1/2 - (V(f - r) - V(f)) / 2000``.

The scaled counts are rounded to powers of ``COUNT_STEP`` and the prices cached on them: an
LP is solved when a count moves by about 5 % (6-10 ms each; 913 solves over the first 3,000
pods of openb default seed 42, most of them early, while the counts are few).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

from scoring.cutting_stock import priced_waste, shadow_prices
from scoring.fit import FitContext
from scoring.fragmentation import TaskTypes
from scoring.request import MILLI_PER_GPU

SATURATION = 1.0
"""GPU demand the LP assumes, as a multiple of the GPUs' share (1: the cluster is full)."""

COUNT_STEP = 1.05
"""Scaled pod counts are rounded to powers of this before the LP (5 % steps)."""


@lru_cache(maxsize=64)
def _priced_waste(key: tuple[tuple[int, int], ...], n_gpus: int) -> NDArray[np.float64]:
    """``U`` of shape (1001,) for ``key`` ((share milli, rounded log count), ascending)."""
    sizes = np.array([s for s, _ in key], dtype=np.int64)
    pods = np.array([COUNT_STEP ** q for _, q in key])
    _, size_price = shadow_prices(sizes, pods, n_gpus)
    u = priced_waste(sizes, np.round(size_price, 6))
    u.setflags(write=False)
    return u


def gap_waste(tasks: TaskTypes, n_gpus: int, model: int | None = None) -> NDArray[np.float64]:
    """Share ``U(f)`` of a gap of ``f`` milli lost at the workload's shadow prices.

    Parameters
    ----------
    tasks : TaskTypes
        The learned workload.
    n_gpus : int
        Healthy GPUs of the model (of the cluster when ``model`` is None), >= 0.
    model : int or None
        GPU model id: count only the task types that may use it. None counts every type.

    Returns
    -------
    ndarray of shape (1001,), float64, read-only
        ``U[f]`` in ``[0, f]`` milli-GPU; ``U[f] = f`` (no price) when no type may use the
        model or ``n_gpus`` is 0. Cached per rounded workload, and per workload object
        (``TaskTypes`` are immutable): the same one asked again costs a lookup.
    """
    global _LAST
    last_tasks, memo = _LAST
    if last_tasks is not tasks:  # one workload at a time: an incremental evaluation keeps one for long
        memo = {}
        _LAST = (tasks, memo)
    key_in = (n_gpus, model)
    if key_in not in memo:
        memo[key_in] = _gap_waste(tasks, n_gpus, model)
    return memo[key_in]


_LAST: tuple[TaskTypes | None, dict[tuple[int, int | None], NDArray[np.float64]]] = (None, {})
"""The last workload ``gap_waste`` saw, and its answers by (GPUs, model)."""


def _gap_waste(tasks: TaskTypes, n_gpus: int, model: int | None) -> NDArray[np.float64]:
    accepts = tasks.accepting(model)
    pods: dict[int, int] = {}
    for k, r, c, ok in zip(tasks.gpu_count.tolist(), tasks.gpu_milli.tolist(), tasks.count.tolist(),
                           accepts.tolist(), strict=True):
        if ok and k > 0:
            s = min(r, MILLI_PER_GPU)
            pods[s] = pods.get(s, 0) + k * c
    demand_milli = sum(s * n for s, n in pods.items())
    if n_gpus <= 0 or demand_milli <= 0:
        return _priced_waste((), 0)
    scale = SATURATION * MILLI_PER_GPU * n_gpus / demand_milli
    key = tuple((s, round(math.log(n * scale) / math.log(COUNT_STEP))) for s, n in sorted(pods.items()))
    return _priced_waste(key, int(n_gpus))


def model_waste(ctx: FitContext) -> Callable[[int | None], NDArray[np.float64]]:
    """``gap_waste`` of ``ctx``'s workload as a function of the GPU model id.

    Parameters
    ----------
    ctx : FitContext
        With ``ctx.tasks`` set.

    Returns
    -------
    callable
        Model id, or None for every model, -> ndarray of shape (1001,), float64 (``U``).
    """
    tasks = ctx.tasks
    assert tasks is not None
    gpus = ctx.gpus_by_model

    def waste(model: int | None) -> NDArray[np.float64]:
        if model is None:
            return gap_waste(tasks, sum(gpus))
        return gap_waste(tasks, gpus[model] if model < len(gpus) else 0, model)

    return waste


def gap_score(ctx: FitContext, waste: Callable[[int | None], NDArray[np.float64]]) -> NDArray[np.float64]:
    """``1/2 - (V(f - r) - V(f)) / 2000`` per GPU for a value function ``V`` of the free share.

    Parameters
    ----------
    ctx : FitContext
        With ``ctx.tasks`` set.
    waste : callable
        GPU model id, or None for "every model", -> ndarray of shape (1001,), float64, with
        ``V[f]`` in ``[0, f]`` milli-GPU (``waste_to_go``; ``scoring.strategies.gap_price``).

    Returns
    -------
    ndarray of shape (m, max_gpus), float64
        In [0, 1]; 0 where the GPU does not fit.
    """
    free = np.clip(ctx.free_milli, 0, MILLI_PER_GPU)
    after = np.clip(free - ctx.request.gpu_milli, 0, MILLI_PER_GPU)
    w_after, w_free = waste_by_gpu(ctx, waste, after, free)
    delta = w_after - w_free
    return np.where(ctx.gpu_fits, np.clip(0.5 - delta / 2000.0, 0.0, 1.0), 0.0)


def waste_by_gpu(ctx: FitContext, waste: Callable[[int | None], NDArray[np.float64]],
                 *shares: NDArray[np.int64]) -> tuple[NDArray[np.float64], ...]:
    """``V[f]`` per GPU, each GPU with its model's table.

    Parameters
    ----------
    ctx : FitContext
    waste : callable
        As in ``gap_score``.
    *shares : ndarray of shape (m, max_gpus), int64
        Free shares in [0, 1000] milli-GPU of ``ctx``'s candidate GPUs.

    Returns
    -------
    tuple of ndarray of shape (m, max_gpus), float64
        One per ``shares``, milli-GPU.
    """
    tasks = ctx.tasks
    if tasks is None or tasks.model_mask is None or ctx.gpu_model is None:
        w = waste(None)
        return tuple(w[f] for f in shares)
    model = np.maximum(ctx.gpu_model, 0)  # -1 padding: no free share, any row will do
    ids, row = np.unique(model, return_inverse=True)
    w_by_model = np.stack([waste(j) for j in ids.tolist()])
    row = row.reshape(model.shape)
    return tuple(w_by_model[row, f] for f in shares)
