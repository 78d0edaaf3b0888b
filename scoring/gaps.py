"""Gaps: what a GPU's free share is worth, shared by ``gap_price`` and ``priced_stranding``.

A value function ``V`` of the free share ``f`` (milli-GPU, 0..1000) gives the share of a gap
of ``f`` lost at saturation; a per-GPU term scores a placement by how it changes ``V`` of the
GPU's gap. ``gap_waste`` is that function at the shadow prices of the cutting-stock LP of the
learned workload scaled to the cluster (``scoring.cutting_stock``; the formula and its
source are in ``scoring.strategies.gap_price``):

    U(0) = 0,   U(f) = min(f, min_{s <= f} y_s + U(f - s))     f = 1..1000

``model_waste`` gives it per GPU model: while no task type is restricted to some models, one
LP over all GPUs (``gap_waste``); otherwise one LP with a bin kind per model and a demand
row per (share, accepted models) class (``joint_gap_waste``), so that a model that
restricted pods need is priced for them. ``waste_by_gpu`` looks it up for every candidate GPU,
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

from scoring.cutting_stock import priced_waste, shadow_prices, shadow_prices_by_model
from scoring.fit import FitContext
from scoring.fragmentation import TaskTypes
from scoring.request import ANY_MODEL_MASK, MILLI_PER_GPU

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


def gap_waste(tasks: TaskTypes, n_gpus: int) -> NDArray[np.float64]:
    """Share ``U(f)`` of a gap of ``f`` milli lost at the workload's shadow prices, models ignored.

    Parameters
    ----------
    tasks : TaskTypes
        The learned workload; every type is counted, whatever models it accepts.
    n_gpus : int
        Healthy GPUs of the cluster, >= 0.

    Returns
    -------
    ndarray of shape (1001,), float64, read-only
        ``U[f]`` in ``[0, f]`` milli-GPU; ``U[f] = f`` (no price) when ``n_gpus`` is 0. Cached per rounded workload, and per workload object
        (``TaskTypes`` are immutable): the same one asked again costs a lookup.
    """
    global _LAST
    last_tasks, memo = _LAST
    if last_tasks is not tasks:  # one workload at a time: an incremental evaluation keeps one for long
        memo = {}
        _LAST = (tasks, memo)
    if n_gpus not in memo:
        memo[n_gpus] = _gap_waste(tasks, n_gpus)
    return memo[n_gpus]


_LAST: tuple[TaskTypes | None, dict[int, NDArray[np.float64]]] = (None, {})
"""The last workload ``gap_waste`` saw, and its answers by GPUs."""


def _gap_waste(tasks: TaskTypes, n_gpus: int) -> NDArray[np.float64]:
    pods: dict[int, int] = {}
    for k, r, c in zip(tasks.gpu_count.tolist(), tasks.gpu_milli.tolist(), tasks.count.tolist(), strict=True):
        if k > 0:
            s = min(r, MILLI_PER_GPU)
            pods[s] = pods.get(s, 0) + k * c
    demand_milli = sum(s * n for s, n in pods.items())
    if n_gpus <= 0 or demand_milli <= 0:
        return _priced_waste((), 0)
    scale = SATURATION * MILLI_PER_GPU * n_gpus / demand_milli
    key = tuple((s, round(math.log(n * scale) / math.log(COUNT_STEP))) for s, n in sorted(pods.items()))
    return _priced_waste(key, int(n_gpus))


def model_waste(ctx: FitContext) -> Callable[[int | None], NDArray[np.float64]]:
    """``U`` of ``ctx``'s workload as a function of the GPU model id.

    While every task type accepts any model, one LP over all healthy GPUs prices every
    model alike (``gap_waste``). Once some type accepts only some models, one LP with a bin
    kind per model prices them together (``joint_gap_waste``): a model that the restricted
    types need costs more to fill with pods that could go elsewhere.

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
        if model is None or tasks.model_mask is None:
            return gap_waste(tasks, sum(gpus))
        by_model = joint_gap_waste(tasks, tuple(gpus))
        return by_model[model] if model < len(by_model) else _priced_waste((), 0)

    return waste


def accepted_models(mask: int, n_models: int) -> int:
    """The models ``0..n_models-1`` a ``scoring.request.model_mask`` accepts, one bit each.

    Ids past 62 have no bit of their own in a mask: only ``ANY_MODEL_MASK`` accepts them
    (as ``TaskTypes.allowed``).
    """
    if mask == ANY_MODEL_MASK:
        return (1 << n_models) - 1
    return mask & ((1 << min(n_models, 63)) - 1)


def joint_gap_waste(tasks: TaskTypes, n_gpus: tuple[int, ...]) -> tuple[NDArray[np.float64], ...]:
    """``U_j(f)`` per GPU model from one cutting-stock LP with a bin kind per model.

    Task types are grouped into classes by (share, models accepted among those with GPUs);
    their pods, ``k`` per pod of ``k`` GPUs, are scaled so that their share is
    ``SATURATION * 1000 * sum_j G_j`` and rounded to powers of ``COUNT_STEP``, as in
    ``gap_waste``. ``scoring.cutting_stock.shadow_prices_by_model`` gives a price ``y_c``
    per class, and model ``j``'s table is ``U_j(f) = min(f, min_{c on j, r_c <= f} y_c +
    U_j(f - r_c))`` over the classes that may use ``j``.

    Parameters
    ----------
    tasks : TaskTypes
        The learned workload, with ``model_mask`` set.
    n_gpus : tuple of int
        Healthy GPUs of each model id (``ClusterState.gpus_by_model``).

    Returns
    -------
    tuple of ndarray of shape (1001,), float64, read-only
        One ``U_j`` per model id; ``U_j[f] = f`` for a model no class may use or without
        GPUs. Cached per workload object and per rounded workload.
    """
    global _LAST_JOINT
    last_tasks, memo = _LAST_JOINT
    if last_tasks is not tasks:
        memo = {}
        _LAST_JOINT = (tasks, memo)
    if n_gpus not in memo:
        memo[n_gpus] = _joint_gap_waste(tasks, n_gpus)
    return memo[n_gpus]


_LAST_JOINT: tuple[TaskTypes | None, dict[tuple[int, ...], tuple[NDArray[np.float64], ...]]] = (None, {})
"""The last workload ``joint_gap_waste`` saw, and its answers by GPUs per model."""


def _joint_gap_waste(tasks: TaskTypes, n_gpus: tuple[int, ...]) -> tuple[NDArray[np.float64], ...]:
    masks = tasks.model_mask if tasks.model_mask is not None else np.full(tasks.count.shape, ANY_MODEL_MASK)
    present = sum(1 << j for j, g in enumerate(n_gpus) if g > 0)
    pods: dict[tuple[int, int], int] = {}
    for k, r, c, mask in zip(tasks.gpu_count.tolist(), tasks.gpu_milli.tolist(), tasks.count.tolist(),
                             masks.tolist(), strict=True):
        accepted = accepted_models(int(mask), len(n_gpus)) & present
        if accepted and k > 0:
            cls = (min(r, MILLI_PER_GPU), accepted)
            pods[cls] = pods.get(cls, 0) + k * c
    demand_milli = sum(s * n for (s, _), n in pods.items())
    if demand_milli <= 0:
        return tuple(_priced_waste((), 0) for _ in n_gpus)
    scale = SATURATION * MILLI_PER_GPU * sum(n_gpus) / demand_milli
    key = tuple((s, m, round(math.log(n * scale) / math.log(COUNT_STEP))) for (s, m), n in sorted(pods.items()))
    return _joint_priced_waste(key, n_gpus)


@lru_cache(maxsize=64)
def _joint_priced_waste(key: tuple[tuple[int, int, int], ...],
                        n_gpus: tuple[int, ...]) -> tuple[NDArray[np.float64], ...]:
    """``U_j`` per model for ``key`` ((share, accepted-model bits, rounded log count))."""
    sizes = np.array([s for s, _, _ in key], dtype=np.int64)
    pods = np.array([COUNT_STEP ** q for _, _, q in key])
    allowed = np.array([[(m >> j) & 1 for j in range(len(n_gpus))] for _, m, _ in key], dtype=bool)
    _, class_price = shadow_prices_by_model(sizes, allowed.reshape(len(key), len(n_gpus)), pods,
                                            np.array(n_gpus, dtype=np.float64))
    price = np.round(class_price, 6)
    out = []
    for j in range(len(n_gpus)):
        on = allowed[:, j] if len(key) else np.zeros(0, dtype=bool)
        u = priced_waste(sizes[on], price[on]) if n_gpus[j] > 0 else _priced_waste((), 0).copy()
        u.setflags(write=False)
        out.append(u)
    return tuple(out)


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
