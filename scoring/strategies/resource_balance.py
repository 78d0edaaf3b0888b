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
from scoring.reduce import clip

NAME = "resource_balance"

gpu_score = None
"""No per-GPU preference: balance is a node property."""


def utilizations(ctx: FitContext) -> tuple[NDArray[np.bool_], NDArray[np.float64],
                                           NDArray[np.float64], NDArray[np.float64]]:
    """GPU share, CPU and host memory utilization of each node with the pod added.

    Parameters
    ----------
    ctx : FitContext

    Returns
    -------
    ok : ndarray of shape (m,), bool
        The node has GPUs and allocatable CPU and memory (the others are 0 where not).
    u_gpu, u_cpu, u_mem : ndarray of shape (m,), float64
        ``(U + k * r) / T``, ``(C + c) / Ca``, ``(M + m) / Ma`` (see module notes).
    """
    req = ctx.request
    total = ctx.node_total_milli
    ok = (total > 0) & (ctx.cpu_alloc_milli > 0) & (ctx.mem_host_alloc_mib > 0)
    u_gpu = np.divide(ctx.node_used_milli + req.gpu_count * req.gpu_milli, total,
                      out=np.zeros(total.shape), where=ok)
    u_cpu = np.divide(ctx.cpu_alloc_milli - ctx.cpu_free_milli + req.cpu_milli,
                      ctx.cpu_alloc_milli, out=np.zeros(total.shape), where=ok)
    u_mem = np.divide(ctx.mem_host_alloc_mib - ctx.mem_host_free_mib + req.memory_mib,
                      ctx.mem_host_alloc_mib, out=np.zeros(total.shape), where=ok)
    return ok, u_gpu, u_cpu, u_mem


def node_score(ctx: FitContext, chosen: NDArray[np.bool_]) -> NDArray[np.float64]:
    """Alignment of CPU and memory utilization with GPU utilization after placement.

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
    ok, u_gpu, u_cpu, u_mem = utilizations(ctx)
    gap = np.maximum(np.abs(u_cpu - u_gpu), np.abs(u_mem - u_gpu))
    return np.where(ok, clip(1.0 - gap, 0.0, 1.0), 0.0)
