"""Stranding: keep a node's CPU and memory from running ahead of its GPUs.

Notes
-----
With CPU used ``C`` of allocatable ``Ca``, host memory ``M`` of ``Ma``, GPU share ``U`` of
``T`` on the node, after adding the pod's requests (``c``, ``m``, ``k * r``)::

    u_cpu = (C + c) / Ca,  u_mem = (M + m) / Ma,  u_gpu = (U + k * r) / T
    node_score = 1 - max(0, u_cpu - u_gpu, u_mem - u_gpu)

Free GPUs on a node whose CPU or memory is spent are "CPU-stranded" (Weng et al., USENIX
ATC '23, section 3): no pod can use them. This is ``scoring.strategies.resource_balance`` with only
that side kept: a node is penalised only where host resources would be used ahead of the
GPUs. A CPU-only pod then goes where the GPUs are already busy (their cores are surplus),
and a GPU pod that needs few cores is not pushed to spread over empty nodes, which the
two-sided balance does (``1 - |u_cpu - u_gpu|`` is highest on the emptiest node when
``u_cpu`` stays near 0). No per-GPU preference.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from scoring.fit import FitContext
from scoring.utilization import host_lead

NAME = "stranding"

gpu_score = None
"""No per-GPU preference: stranding is a node property."""


def node_score(ctx: FitContext, chosen: NDArray[np.bool_]) -> NDArray[np.float64]:
    """How far host utilization would run ahead of GPU utilization, as ``1 - lead``
    (``scoring.utilization.host_lead``).

    Parameters
    ----------
    ctx : FitContext
    chosen : ndarray of shape (m, max_gpus), bool
        Unused (the node totals do not depend on which GPUs).

    Returns
    -------
    ndarray of shape (m,), float64
        In [0, 1]; 1 where neither CPU nor memory would lead; 0 for a node without GPUs or
        without allocatable CPU or memory.
    """
    return host_lead(ctx)
