"""Gap fill: leave on a GPU a free share the coming pods will fill, not one they will waste.

Notes
-----
FGD (``scoring.fgd``) scores the fragmentation a placement causes now: the free share the
workload's task types cannot use. Near saturation what counts is what is still free once
the cluster is full. This term estimates it per GPU with a value function over the free
share, from the learned workload (``scoring.workload``). With ``n_s`` the pods of share
``s`` per GPU (one-GPU types by their share, whole-GPU types of any count as ``s = 1000``),
``N`` all GPU pods of the workload and ``P_ABUNDANT`` below::

    a_s      = min(1, n_s / (N * P_ABUNDANT))                (how surely an s-pod comes)
    W(0)     = 0
    W(f)     = min(f, min_{s <= f} a_s * W(f - s) + (1 - a_s) * f)     f = 1..1000
    delta_g  = W(f_g - r) - W(f_g)
    score_g  = 1/2 - delta_g / 2000

``W(f)``, in milli-GPU, is the share of a gap ``f`` expected to stay unallocated: filled by
the best next pod if one of that share comes (``a_s``), wasted otherwise. ``W`` is the
unbounded-knapsack recursion (the pricing step of the Gilmore-Gomory cutting-stock LP,
``benchmarks/floor.py``) with each size discounted by its scarcity: sizes of at least
``P_ABUNDANT`` of the pods count as always available, rarer ones in proportion. Both ``W``
values lie in ``[0, f]``, so ``delta_g`` is in ``[-1000, 1000]`` and the score in ``[0, 1]``;
1/2 is "no change in expected waste". gpufrac's own term, found by decomposing what the
default left unallocated on openb (seed 42, 100 % arrived: no GPU fully free; 3.03 points
in the ~190 milli beside lone 810-milli pods, which only the few pods of 160 milli or less
can fill, and 1.26 points in pairs such as 470 + 320 where 650 + 320 and 470 + 470 were
possible). It moves a 320-milli pod off the gap of a 470-milli pod (leaving 210, which few
pods fit: ``W(210) = 125`` on openb) onto the gap of a 650-milli pod (leaving 30).

GPU models (``gpu_spec``): when some task type accepts only some models, a GPU of model
``j`` is valued with ``W_j``, built from the ``n_s`` of the types that accept ``j`` only
(``N`` stays all GPU pods, so a size few pods can take on that model counts as scarce
there). The openb pod lists carry no ``gpu_spec``, so this part is not measured on them.

The node score is the mean over the GPUs chosen there (a per-GPU term only).
``benchmarks/README.md`` has the measurements.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

from scoring.fit import FitContext
from scoring.fragmentation import TaskTypes
from scoring.request import MILLI_PER_GPU

NAME = "gap_fill"

P_ABUNDANT = 0.02
"""Share of the GPU pods from which a size counts as always available to fill a gap."""

node_score = None
"""A per-GPU term: the node score is the mean over the chosen GPUs."""


@lru_cache(maxsize=32)
def _waste_to_go(sizes: tuple[tuple[int, int], ...], n_pods: int) -> NDArray[np.float64]:
    """``W`` of shape (1001,) for ``sizes`` ((share milli, pods), ascending) of ``n_pods``.

    ``W(f)`` only reads ``W(f - s)`` with ``s >= s_min``, the smallest share, so each block
    of ``s_min`` consecutive ``f`` is one vectorized step over (sizes, block) (20 steps for
    openb's 50-milli minimum instead of 1,000 scalar ones); the arithmetic per element is
    the recursion's, so the values are those of the scalar reference (``tests/scoring/reference.py``).
    """
    f = np.arange(MILLI_PER_GPU + 1)
    w = f.astype(np.float64)
    if not sizes:
        w.setflags(write=False)
        return w
    share = np.array([s for s, _ in sizes], dtype=np.int64)[:, None]  # (k, 1)
    avail = np.array([min(1.0, n / n_pods / P_ABUNDANT) for _, n in sizes])[:, None]
    step = int(share[0, 0])
    for lo in range(step, MILLI_PER_GPU + 1, step):
        fb = f[lo:lo + step]  # (b,); every f - s it reads is below lo, already final
        prev = fb - share  # (k, b)
        cand = np.where(prev >= 0, avail * w[np.maximum(prev, 0)] + (1.0 - avail) * fb, np.inf)
        w[lo:lo + step] = np.minimum(fb, cand.min(axis=0))
    w.setflags(write=False)
    return w


def waste_to_go(tasks: TaskTypes, model: int | None = None) -> NDArray[np.float64]:
    """Expected unallocated share ``W(f)`` of a GPU gap of ``f`` milli (see module notes).

    Parameters
    ----------
    tasks : TaskTypes
        The learned workload.
    model : int or None
        GPU model id: count only the task types that may use it (``TaskTypes.allowed``).
        None counts every type.

    Returns
    -------
    ndarray of shape (1001,), float64, read-only
        ``W[f]`` in ``[0, f]`` milli-GPU for ``f = 0..1000``. Cached per workload.
    """
    accepts = tasks.accepting(model)
    n_s: dict[int, int] = {}
    for k, r, c, ok in zip(tasks.gpu_count.tolist(), tasks.gpu_milli.tolist(), tasks.count.tolist(),
                           accepts.tolist(), strict=True):
        if ok and (k == 1 or r >= MILLI_PER_GPU):
            s = min(r, MILLI_PER_GPU)
            n_s[s] = n_s.get(s, 0) + c
    return _waste_to_go(tuple(sorted(n_s.items())), int(tasks.count.sum()))


def gpu_score(ctx: FitContext) -> NDArray[np.float64]:
    """Change in expected waste of each GPU's gap if the pod's share goes there.

    Parameters
    ----------
    ctx : FitContext

    Returns
    -------
    ndarray of shape (m, max_gpus), float64
        ``1/2 - delta_g / 2000`` in [0, 1], ``W`` of the GPU's model; 0 where the GPU does
        not fit; 1/2 everywhere it fits while no workload is known.
    """
    tasks = ctx.tasks
    if tasks is None:
        return np.where(ctx.gpu_fits, 0.5, 0.0)
    return gap_score(ctx, lambda model: waste_to_go(tasks, model))


def gap_score(ctx: FitContext, waste: Callable[[int | None], NDArray[np.float64]]) -> NDArray[np.float64]:
    """``1/2 - (V(f - r) - V(f)) / 2000`` per GPU for a value function ``V`` of the free share.

    Parameters
    ----------
    ctx : FitContext
        With ``ctx.tasks`` set.
    waste : callable
        GPU model id, or None for "every model", -> ndarray of shape (1001,), float64, with
        ``V[f]`` in ``[0, f]`` milli-GPU (``waste_to_go``; ``scoring.gap_price``).

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
