"""Gap price: charge each placement what its GPU's gap and the pod are worth at saturation.

Notes
-----
Gap fill, the term before it, valued a free gap by the chance that a pod of the right share
comes (``docs/decisions/0003-gap-fill.md``). That misses competition: the 320-milli pods that fill the 350-milli gaps beside 650-milli
pods are the same ones a 470-milli pod's gap would take, and an empty GPU is not free
either, because at saturation every GPU ends up holding something. This term takes both
from the dual of the cutting-stock LP of the learned workload scaled to the cluster
(``scoring.cutting_stock``): with ``y_s`` the shadow price of a pod of share ``s``,
``G`` the healthy GPUs and ``n_s`` the workload's pods of share ``s``, scaled so that
their GPU share is ``SATURATION * 1000 * G``::

    y       = shadow_prices(sizes, n, G)                     (scoring.cutting_stock)
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

The value function and its cache are ``scoring.gaps`` (shared with ``priced_stranding``).

GPU kinds: a pod restricted to some models (``gpufrac.io/gpu-model``) may use only their
GPUs, and a pod of ``k`` GPUs only GPUs of nodes with ``k`` or more. Once the learned
workload holds such a type, the LP has one bin kind per (model, GPUs of the node) and a
demand row per (share, kinds it may use) class, solved together
(``scoring.cutting_stock.shadow_prices_by_model``, ``scoring.gaps.joint_gap_waste``), and
each GPU is priced with its kind's ``U``. A kind that few pods may use is then kept for
them: with T4-only whole pods waiting for the T4s and flexible 500-milli pods, ``U_T4(1000)
= 0`` (an empty T4 is worth a pod nothing else can hold) while ``U_V100(1000) = 1000``, so a
flexible pod scores 0.25 on the empty T4 and 0.75 on a V100 (the worked example in
``tests/scoring/test_cutting_stock.py``). While every type may use every kind this is the
single LP above.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from scoring.fit import FitContext
from scoring.gaps import gap_score, model_waste

NAME = "gap_price"

node_score = None
"""A per-GPU term: the node score is the mean over the chosen GPUs."""


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
