"""Gap price: charge each placement what its GPU's gap and the pod are worth at saturation.

Notes
-----
``scoring.gap_fill`` values a free gap by the chance that a pod of the right share comes.
That misses competition: the 320-milli pods that fill the 350-milli gaps beside 650-milli
pods are the same ones a 470-milli pod's gap would take, and an empty GPU is not free
either, because at saturation every GPU ends up holding something. This term takes both
from the dual of the cutting-stock LP of the learned workload scaled to the cluster
(``scoring.cutting_stock``): with ``y_s`` the shadow price of a pod of share ``s``,
``G_j`` the healthy GPUs of the GPU's model ``j`` and ``n_s`` the workload's pods of share
``s`` that accept ``j``, scaled so that their GPU share is ``SATURATION * 1000 * G_j``::

    y       = shadow_prices(sizes, n, G_j)                   (scoring.cutting_stock)
    U(0)    = 0
    U(f)    = min(f, min_{s <= f} y_s + U(f - s))             f = 1..1000
    delta_g = U(f_g - r) - U(f_g)
    score_g = 1/2 - delta_g / 2000

``U(f)`` is the share of a gap ``f`` that is lost at these prices (left free, or filled by
pods worth more elsewhere); ``delta_g + y_r`` is the placement's reduced cost at these
prices, its regret against the LP (the view of online stochastic bin packing in Gupta and
Radovanovic, "Interior-Point Based Online Stochastic Bin Packing", Operations Research,
2020): zero when the pod completes a pattern of the optimal LP solution, and ``y_r`` is
the same on every GPU. A whole-GPU pod of ``k`` GPUs counts as ``k`` pods of 1000 milli, a
fractional pod of ``k`` GPUs as ``k`` pods of its share.

On openb default (seed 42, 100 % arrived) the LP gives ``y_G = 810``: the marginal GPU
holds a lone 810-milli pod, so an empty GPU costs ``U(1000) = 190``, not 0 as in gap fill.
A 230-milli pod then goes to an empty GPU (``U(770) + y_230 - U(1000) = 162.5 + 27.5 -
190 = 0``) rather than into the 350-milli gap of a 650-milli pod (``U(120) + 27.5 -
U(350) = 120 + 27.5 - 80 = 67.5``), where gap fill's scarcity discount preferred the gap.

The scaled counts are rounded to powers of ``COUNT_STEP`` and the prices cached on them:
an LP is solved when a count moves by about 5 % (6-10 ms each; 913 solves over the first
3,000 pods of openb default seed 42, most of them early, while the counts are few).

GPU models: one LP per model, over the types that accept it; a type that accepts several
models is counted in each (an over-count, not measured: the openb pod lists carry no
``gpu_spec``).
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
from scoring.gap_fill import gap_score
from scoring.request import MILLI_PER_GPU

NAME = "gap_price"

SATURATION = 1.0
"""GPU demand the LP assumes, as a multiple of the GPUs' share (1: the cluster is full)."""

COUNT_STEP = 1.05
"""Scaled pod counts are rounded to powers of this before the LP (5 % steps)."""

node_score = None
"""A per-GPU term: the node score is the mean over the chosen GPUs."""


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
        model or ``n_gpus`` is 0. Cached per rounded workload.
    """
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


def gpu_score(ctx: FitContext) -> NDArray[np.float64]:
    """Change in the priced waste of each GPU's gap if the pod's share goes there.

    Parameters
    ----------
    ctx : FitContext

    Returns
    -------
    ndarray of shape (m, max_gpus), float64
        ``1/2 - delta_g / 2000`` in [0, 1] with ``U`` of the GPU's model; 0 where the GPU
        does not fit; 1/2 everywhere it fits while no workload is known.
    """
    if ctx.tasks is None:
        return np.where(ctx.gpu_fits, 0.5, 0.0)
    return gap_score(ctx, model_waste(ctx))


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
