"""GPU fragmentation of nodes against a workload distribution (the FGD measure).

Notes
-----
Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation
Gradient Descent", USENIX ATC '23, section 4. For node ``n`` with free share ``f_g`` per GPU
and a task type ``m`` (``k_m`` GPUs of ``r_m`` milli, CPU ``c_m``, memory ``q_m``) of
popularity ``p_m``::

    F_n(m) = sum_g f_g                       if m cannot run on n (CPU, memory, or fewer
                                             than k_m GPUs with f_g >= r_m)
           = sum_g f_g * [f_g < r_m]         otherwise (GPUs too small for m)
    F_n    = sum_m p_m * F_n(m)

The fragmentation rate of a cluster is ``sum_n F_n / sum_n sum_g f_g``: the share of the
unallocated GPU capacity that the workload cannot use. Task types that request no GPU are
left out of the distribution (they cannot use any GPU share).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from scoring.request import MILLI_PER_GPU

K = TypeVar("K", bound=Hashable)


def total_variation(pa: dict[K, float], pb: dict[K, float]) -> float:
    """Total variation distance ``1/2 * sum_k |p_a(k) - p_b(k)|`` of two distributions given
    as ``{key: probability}`` (a key missing from one has probability 0 there); in [0, 1]."""
    return 0.5 * sum(abs(pa.get(k, 0.0) - pb.get(k, 0.0)) for k in pa.keys() | pb.keys())


@dataclass(frozen=True, slots=True)
class TaskTypes:
    """A workload distribution over task types; all arrays of shape (t,).

    Attributes
    ----------
    gpu_count : ndarray of int64
    gpu_milli : ndarray of int64
        Share per GPU, milli-GPU.
    cpu_milli : ndarray of int64
    memory_mib : ndarray of int64
    popularity : ndarray of float64
        Sums to 1.
    count : ndarray of int64
        Pods of each type (``popularity = count / count.sum()``); ``scoring.strategies.fgd`` weighs with
        these integers so that its sums are exact.
    model_mask : ndarray of int64 or None
        GPU models each type accepts, as ``scoring.request.model_mask`` bit masks (bit j:
        model id j); None when every type accepts any model.
    gpu_memory_mib : ndarray of int64 or None
        Explicit GPU memory per GPU each type asks for, MiB (0: its share's proportion, which
        fits wherever the share does); None when no type asks for any. ``scoring.strategies.fgd``
        counts a GPU with less free memory than a type asks as unusable for it.
    demand : tuple of (int, int, int, int, int) or None
        ``(gpu_count, share milli per GPU (at most 1000), model_mask, gpu_memory_mib, pods)``
        of every counted GPU pod, aggregated over CPU and host memory, sorted; not only the
        types above (which ``WorkloadModel`` cuts to the most frequent). The cutting-stock
        prices (``scoring.gaps``) read it: restricted pods spread over many rare types, and
        the most frequent types alone hid two thirds of their demand on the openb
        ``default-m33`` variant. ``gpu_memory_mib`` is the explicit GPU memory per GPU
        rounded up to ``scoring.workload.DEMAND_MEMORY_STEP_MIB`` (0: a share's proportion),
        so that the prices know which GPUs a pod's memory fits. None: the types above are
        the demand.
    demand_keys : tuple of (int, int, int, int) or None
        ``demand``'s classes without their counts, in its order. ``WorkloadModel`` hands the
        same tuple object to every workload it builds while the classes stay the same (and
        the same type arrays while the types and their order do): ``scoring.drift``
        compares two such workloads by identity and ``demand_count`` without a dictionary.
    demand_count : ndarray of shape (d,), int64, or None
        ``demand``'s pod counts, in its order.
    """

    gpu_count: NDArray[np.int64]
    gpu_milli: NDArray[np.int64]
    cpu_milli: NDArray[np.int64]
    memory_mib: NDArray[np.int64]
    popularity: NDArray[np.float64]
    count: NDArray[np.int64]
    model_mask: NDArray[np.int64] | None = None
    gpu_memory_mib: NDArray[np.int64] | None = None
    demand: tuple[tuple[int, int, int, int, int], ...] | None = None
    demand_keys: tuple[tuple[int, int, int, int], ...] | None = None
    demand_count: NDArray[np.int64] | None = None

    def allowed(self, gpu_model: NDArray[np.int64]) -> NDArray[np.bool_] | None:
        """Which GPUs each type may use.

        Parameters
        ----------
        gpu_model : ndarray of shape (m, G), int64
            Model id per GPU (``ClusterState.gpu_model``; -1 padding is treated as id 0,
            padding GPUs have no free share anyway). Ids past 62 have no bit of their own
            (``scoring.request.model_mask``): only the types that accept any model may use
            them.

        Returns
        -------
        ndarray of shape (m, t, G), bool, or None when every type accepts any model.
        """
        if self.model_mask is None:
            return None
        ids = np.clip(gpu_model, 0, 63)  # >> 63: 0 for a mask of bits 0..62, -1 for ANY
        return ((self.model_mask[None, :, None] >> ids[:, None, :]) & 1).astype(bool)

    def accepting(self, model: int | None) -> NDArray[np.bool_]:
        """Which types may use GPUs of one model.

        Parameters
        ----------
        model : int or None
            Model id (as in ``allowed``); None for "every type".

        Returns
        -------
        ndarray of shape (t,), bool
        """
        allowed = None if model is None else self.allowed(np.array([[model]]))  # (1, t, 1)
        return np.ones(self.count.shape, dtype=bool) if allowed is None else allowed[0, :, 0]

    @classmethod
    def from_counts(cls, rows: NDArray[np.int64]) -> TaskTypes:
        """Distribution of the distinct rows of ``rows``.

        Parameters
        ----------
        rows : ndarray of shape (n_pods, 4), int64
            ``(gpu_count, gpu_milli, cpu_milli, memory_mib)`` per pod; rows with
            ``gpu_count == 0`` are dropped.

        Raises
        ------
        ValueError
            If no row requests a GPU.
        """
        rows = np.asarray(rows, dtype=np.int64)
        rows = rows[rows[:, 0] > 0]
        if rows.shape[0] == 0:
            raise ValueError("no GPU task in the workload")
        uniq, counts = np.unique(rows, axis=0, return_counts=True)
        counts = counts.astype(np.int64)
        return cls(uniq[:, 0], uniq[:, 1], uniq[:, 2], uniq[:, 3], counts / counts.sum(), counts)


def node_fragmentation_milli(
    free_milli: NDArray[np.int64],
    cpu_free_milli: NDArray[np.int64],
    mem_free_mib: NDArray[np.int64],
    tasks: TaskTypes,
) -> NDArray[np.float64]:
    """Expected fragmented GPU share per node, ``F_n`` (see module notes).

    Parameters
    ----------
    free_milli : ndarray of shape (n_nodes, max_gpus), int64
        Free share per GPU; 0 on padding and on GPUs that cannot be used (unhealthy).
    cpu_free_milli, mem_free_mib : ndarray of shape (n_nodes,), int64
    tasks : TaskTypes

    Returns
    -------
    ndarray of shape (n_nodes,), float64
        In [0, sum of free_milli of the node], milli-GPU.
    """
    f = free_milli[:, None, :]  # (n, 1, g)
    r = tasks.gpu_milli[None, :, None]  # (1, t, 1)
    fits_gpu = f >= r
    runnable = (
        (fits_gpu.sum(axis=2) >= tasks.gpu_count[None, :])
        & (cpu_free_milli[:, None] >= tasks.cpu_milli[None, :])
        & (mem_free_mib[:, None] >= tasks.memory_mib[None, :])
    )  # (n, t)
    total = free_milli.sum(axis=1)[:, None]  # (n, 1)
    small = np.where(fits_gpu, 0, f).sum(axis=2)  # (n, t)
    per_task = np.where(runnable, small, total)
    expected: NDArray[np.float64] = per_task @ tasks.popularity
    return expected


def fragmentation_rate(
    free_milli: NDArray[np.int64],
    cpu_free_milli: NDArray[np.int64],
    mem_free_mib: NDArray[np.int64],
    tasks: TaskTypes,
) -> float:
    """Share of the free GPU capacity that the workload cannot use, in [0, 1].

    Parameters
    ----------
    free_milli : ndarray of shape (n_nodes, max_gpus), int64
    cpu_free_milli, mem_free_mib : ndarray of shape (n_nodes,), int64
    tasks : TaskTypes

    Returns
    -------
    float
        0.0 when nothing is free.
    """
    free = float(free_milli.sum())
    if free <= 0:
        return 0.0
    frag = node_fragmentation_milli(free_milli, cpu_free_milli, mem_free_mib, tasks).sum()
    return float(min(frag / free, 1.0))


__all__ = ["MILLI_PER_GPU", "TaskTypes", "fragmentation_rate", "node_fragmentation_milli"]
