"""Utilization after placement: the node and GPU formulas more than one strategy scores with.

Strategies are independent modules (no strategy imports another; an import-linter contract
holds it); the formulas two of them share live here, each under the name of the strategy
that documents it (its module notes give the formula's source):

- ``utilizations``: GPU share, CPU and host memory used on each node with the pod added;
- ``balance``: ``scoring.strategies.resource_balance`` (two-sided);
- ``host_lead``: ``scoring.strategies.stranding`` (one-sided);
- ``packing``: ``scoring.strategies.node_packing`` (GPU share used);
- ``tightness``: ``scoring.strategies.gpu_best_fit`` (per GPU);
- ``multi_gpu_share``: the multi-GPU share of the learned demand
  (``scoring.strategies.multi_gpu_reserve``, ``scoring.strategies.adaptive_balance``);
- ``room_for_waiting``: how much of what waits the free GPU share could hold
  (``scoring.strategies.consolidation``, ``scoring.strategies.adaptive_balance``).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from scoring.fit import FitContext
from scoring.fragmentation import TaskTypes
from scoring.reduce import clip
from scoring.request import MILLI_PER_GPU
from scoring.state import ClusterState


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
        ``(U + k * r) / T``, ``(C + c) / Ca``, ``(M + m) / Ma`` (``resource_balance`` notes).
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


def balance(ctx: FitContext) -> NDArray[np.float64]:
    """``1 - max(|u_cpu - u_gpu|, |u_mem - u_gpu|)`` per node, in [0, 1]; 0 where not ``ok``."""
    ok, u_gpu, u_cpu, u_mem = utilizations(ctx)
    gap = np.maximum(np.abs(u_cpu - u_gpu), np.abs(u_mem - u_gpu))
    return np.where(ok, clip(1.0 - gap, 0.0, 1.0), 0.0)


def host_lead(ctx: FitContext) -> NDArray[np.float64]:
    """``1 - max(0, u_cpu - u_gpu, u_mem - u_gpu)`` per node, in [0, 1]; 0 where not ``ok``."""
    ok, u_gpu, u_cpu, u_mem = utilizations(ctx)
    lead = np.maximum(np.maximum(u_cpu - u_gpu, u_mem - u_gpu), 0.0)
    return np.where(ok, clip(1.0 - lead, 0.0, 1.0), 0.0)


def packing(ctx: FitContext) -> NDArray[np.float64]:
    """``min((U + k * r) / T, 1)`` per node, in [0, 1]; 0 for a node without GPUs."""
    after = ctx.node_used_milli + ctx.request.gpu_count * ctx.request.gpu_milli
    total = ctx.node_total_milli
    util = np.divide(after, total, out=np.zeros(after.shape), where=total > 0)
    return np.minimum(util, 1.0)


def tightness(ctx: FitContext) -> NDArray[np.float64]:
    """``min(1 - (f_g - r) / 1000, 1)`` per GPU, shape (m, max_gpus); 0 where it does not fit."""
    left = ctx.free_milli - ctx.request.gpu_milli  # < 0 only for a pod squeezing best-effort ones
    return np.where(ctx.gpu_fits, np.minimum(1.0 - left / MILLI_PER_GPU, 1.0), 0.0)


def multi_gpu_share(tasks: TaskTypes | None) -> float:
    """``s``: the share of the GPU demand (milli-GPU) asked by task types of 2+ GPUs.

    Parameters
    ----------
    tasks : TaskTypes or None

    Returns
    -------
    float
        In [0, 1]; 0 for None.
    """
    if tasks is None:
        return 0.0
    demand = tasks.popularity * tasks.gpu_count * tasks.gpu_milli
    total = float(demand.sum())
    return float(demand[tasks.gpu_count >= 2].sum()) / total if total > 0 else 0.0


def room_for_waiting(state: ClusterState) -> float:
    """``clip(2 F / W - 1, 0, 1)``, 1 while ``W <= F``: whether the free room could hold what waits.

    ``W`` is the GPU share the waiting GPU pods ask for together
    (``WorkloadModel.pending_share``), ``F`` the free share of the healthy GPUs of ready
    nodes, each GPU's counted up to one whole GPU (``scoring.strategies.consolidation``'s
    notes: 0 once twice the room waits, the cluster past its capacity).

    Parameters
    ----------
    state : ClusterState
        Read only.

    Returns
    -------
    float
        In [0, 1]; 1 when nothing waits (the free share is then not summed).
    """
    waiting = state.workload.pending_share()
    if waiting <= 0:
        return 1.0
    usable = state.gpu_healthy & state.node_ready[:, None]
    free = int(clip(np.where(usable, state.gpu_free_milli, 0), 0, MILLI_PER_GPU).sum())
    if waiting <= free:
        return 1.0
    return min(max(2.0 * free / waiting - 1.0, 0.0), 1.0)
