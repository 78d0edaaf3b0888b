"""Resource balance: keep a node's CPU and GPU share used in the same proportion.

Notes
-----
With CPU used ``C`` of allocatable ``Ca``, host memory ``M`` of ``Ma``, GPU share ``U`` of
``T`` on the node, after adding the pod's requests (``c``, ``m``, ``k * r``)::

    u_cpu = (C + c) / Ca,  u_mem = (M + m) / Ma,  u_gpu = (U + k * r) / T
    node_score = 1 - max(|u_cpu - u_gpu|, |u_mem - u_gpu|)

A node whose CPU runs out while GPUs are still free strands those GPUs (the "CPU-stranded
GPUs" of Weng et al., USENIX ATC '23, section 3); keeping the utilizations aligned keeps
every free GPU usable by a pod with the node's typical CPU-per-GPU ratio. The shape is
kube-scheduler's ``NodeResourcesBalancedAllocation`` (``noderesources/balanced_allocation.go``,
``1 - std(fractions)``) with the GPU as the reference resource, and the Tetris alignment
idea (Grandl et al., SIGCOMM '14). No per-GPU preference.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from scoring.fit import FitContext
from scoring.utilization import balance

NAME = "resource_balance"

gpu_score = None
"""No per-GPU preference: balance is a node property."""


def node_score(ctx: FitContext, chosen: NDArray[np.bool_]) -> NDArray[np.float64]:
    """Alignment of CPU and memory utilization with GPU utilization after placement
    (``scoring.utilization.balance``).

    Parameters
    ----------
    ctx : FitContext
    chosen : ndarray of shape (m, max_gpus), bool
        Unused.

    Returns
    -------
    ndarray of shape (m,), float64
        In [0, 1]; 0 for a node without GPUs or without allocatable CPU or memory.
    """
    return balance(ctx)
