"""Feasibility of one pod on candidate nodes: per GPU, per node, with a reason per node.

A GPU fits when it exists, is of an allowed model, is healthy, may hold the pod's QoS class
(isolation), has the share and the memory the class may take (``scoring.request.QoSPolicy``)
and a free time-slicing replica slot. A node fits when it is ready, has the pod's CPU and host
memory free, and at least ``gpu_count`` GPUs fit. The first failing check names the reason.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
from numpy.typing import NDArray

from scoring.fragmentation import TaskTypes
from scoring.memo import Memo
from scoring.request import MILLI_PER_GPU, PodRequest, QoSClass, QoSPolicy
from scoring.state import ClusterState


class Reason(enum.IntEnum):
    """Why a node is infeasible; the first failing check wins.

    Checks run in value order, except ``QOS_ISOLATION``, which runs after ``GPU_UNHEALTHY``
    (it was added later; values are stable codes).
    """

    FITS = 0
    NODE_NOT_READY = 1
    INSUFFICIENT_CPU = 2
    INSUFFICIENT_MEMORY = 3
    TOO_FEW_GPUS = 4
    GPU_MODEL_MISMATCH = 5
    GPU_UNHEALTHY = 6
    INSUFFICIENT_GPU_SHARE = 7
    INSUFFICIENT_GPU_MEMORY = 8
    NO_REPLICA_SLOT = 9
    QOS_ISOLATION = 10


_REASON_BY_STAGE = np.array([
    Reason.TOO_FEW_GPUS,            # stopped before "exists": fewer than k GPU columns
    Reason.GPU_MODEL_MISMATCH,
    Reason.GPU_UNHEALTHY,
    Reason.QOS_ISOLATION,
    Reason.INSUFFICIENT_GPU_SHARE,
    Reason.INSUFFICIENT_GPU_MEMORY,
    Reason.NO_REPLICA_SLOT,
    Reason.FITS,
], dtype=np.int8)
"""Reason for a node whose k-th best GPU passed this many nested GPU checks."""
_REASON_BY_STAGE.setflags(write=False)


NO_TERMS: Mapping[str, object] = MappingProxyType({})
"""No strategy terms (read-only)."""


@dataclass(frozen=True, slots=True, eq=False)
class FitContext:
    """Everything the strategies need about one pod on ``m`` candidate nodes, computed once.

    Attributes
    ----------
    request : PodRequest
    rows : ndarray of shape (m,), int64
        Candidate rows in the ``ClusterState``.
    gpu_fits : ndarray of shape (m, max_gpus), bool
        GPU can take the pod (all GPU checks pass).
    node_fits : ndarray of shape (m,), bool
    reason : ndarray of shape (m,), int8
        ``Reason`` per node, ``FITS`` where ``node_fits``.
    free_milli : ndarray of shape (m, max_gpus), int64
        Free share before placement, 0 on padding.
    mem_req_mib : ndarray of shape (m, max_gpus), int64
        GPU memory the pod would take on each GPU.
    mem_free_mib, mem_total_mib : ndarray of shape (m, max_gpus), int64
        Free memory is what allocations leave (for guaranteed pods: what the larger of the
        allocated and the NVML-used memory leaves).
    gpu_exists : ndarray of shape (m, max_gpus), bool
    qos_pods : ndarray of shape (m, max_gpus, 3), int64
    node_used_milli, node_total_milli : ndarray of shape (m,), int64
        Allocated and total GPU share of the node's existing GPUs.
    cpu_free_milli, mem_host_free_mib : ndarray of shape (m,), int64
    cpu_alloc_milli, mem_host_alloc_mib : ndarray of shape (m,), int64
    gpu_model : ndarray of shape (m, max_gpus), int64
        Model id per GPU (-1 for padding).
    gpu_healthy : ndarray of shape (m, max_gpus), bool
        ``ClusterState.gpu_healthy`` of the candidate rows.
    gpu_mem_free_mib : ndarray of shape (m, max_gpus), int64
        ``ClusterState.gpu_mem_free_mib`` of the candidate rows: free GPU memory as
        allocations leave it, whatever the pod's QoS (the fragmentation view).
    tasks : TaskTypes or None
        The target workload for fragmentation (``ClusterState.workload``); None while the
        cluster holds no GPU pod.
    gpus_by_model : tuple of int
        ``ClusterState.gpus_by_model``: healthy GPUs of each model id in the whole cluster; a
        tuple, not an array, because it is cluster-wide, not per candidate.
    gpus_by_kind : tuple of (int, int, int)
        ``ClusterState.gpus_by_kind``: (model id, GPUs of the node, healthy GPUs), cluster-wide.
    memory_by_kind : tuple of int
        ``ClusterState.memory_by_kind``: the most memory a GPU of each kind has, MiB.
    whole_node_unseen : bool
        ``ClusterTerms.whole_node_unseen``.
    terms : mapping of str to object
        ``ClusterTerms.strategy_terms``: each strategy's own cluster-wide term, under its
        ``TERM`` name (``scoring.strategies``); read only by that strategy.
    memo : Memo
        What the evaluation's owner keeps between evaluations (``scoring.memo``).
    """

    request: PodRequest
    rows: NDArray[np.int64]
    gpu_fits: NDArray[np.bool_]
    node_fits: NDArray[np.bool_]
    reason: NDArray[np.int8]
    free_milli: NDArray[np.int64]
    mem_req_mib: NDArray[np.int64]
    mem_free_mib: NDArray[np.int64]
    mem_total_mib: NDArray[np.int64]
    gpu_exists: NDArray[np.bool_]
    qos_pods: NDArray[np.int64]
    node_used_milli: NDArray[np.int64]
    node_total_milli: NDArray[np.int64]
    cpu_free_milli: NDArray[np.int64]
    mem_host_free_mib: NDArray[np.int64]
    cpu_alloc_milli: NDArray[np.int64]
    mem_host_alloc_mib: NDArray[np.int64]
    gpu_model: NDArray[np.int64] | None = None
    gpu_healthy: NDArray[np.bool_] | None = None
    gpu_mem_free_mib: NDArray[np.int64] | None = None
    tasks: TaskTypes | None = None
    gpus_by_model: tuple[int, ...] = ()
    gpus_by_kind: tuple[tuple[int, int, int], ...] = ()
    memory_by_kind: tuple[int, ...] = ()
    whole_node_unseen: bool = False
    terms: Mapping[str, object] = field(default_factory=lambda: NO_TERMS)
    memo: Memo = field(default_factory=Memo)


def gpu_memory_request_mib(
    gpu_milli: int, gpu_memory_mib: int | None, mem_total_mib: NDArray[np.int64]
) -> NDArray[np.int64]:
    """GPU memory a pod takes on each GPU.

    Parameters
    ----------
    gpu_milli : int
        The pod's share per GPU, milli-GPU (``PodRequest.gpu_milli``, or a recorded share).
    gpu_memory_mib : int or None
        Its explicit memory per GPU (``PodRequest.gpu_memory_mib``), MiB.
    mem_total_mib : ndarray of any shape, int64
        Total memory of the GPUs, MiB.

    Returns
    -------
    ndarray of the shape of ``mem_total_mib``, int64
        ``gpu_memory_mib`` everywhere when set, else ``floor(gpu_milli * mem_total_mib /
        1000)`` (the pod's share of that GPU's memory).

    Notes
    -----
    Rounding down matters: shares that add up to at most 1000 milli then always add up to
    at most the GPU's memory (a sum of floors never exceeds the floor of the sum). Rounding
    up refused a 400-milli pod beside a 600-milli one on a 16384 MiB GPU (9831 + 6554 MiB).
    """
    if gpu_memory_mib is not None:
        return np.full(mem_total_mib.shape, gpu_memory_mib, dtype=np.int64)
    return (gpu_milli * mem_total_mib) // MILLI_PER_GPU


DEFAULT_QOS_POLICY = QoSPolicy()


def share_room(qos: QoSClass, used: NDArray[np.int64], best_effort: NDArray[np.int64],
               qos_pods: NDArray[np.int64], policy: QoSPolicy) -> NDArray[np.int64]:
    """The most share a pod of class ``qos`` may take on each GPU (``QoSPolicy`` rules).

    ``share_fits`` is ``request <= share_room``; the cache also uses it to bound what it
    counts of an allocation it did not make (``extender.cache.accounting``).

    Parameters
    ----------
    qos : QoSClass
    used, best_effort : ndarray of shape (m, g), int64
        Allocated share, and its best-effort part, milli-GPU.
    qos_pods : ndarray of shape (m, g, 3), int64
        Pods per QoS class on each GPU.
    policy : QoSPolicy

    Returns
    -------
    ndarray of shape (m, g), int64
        Milli-GPU; negative where the GPU is already past what the class may use.
    """
    holds_guaranteed = qos_pods[..., QoSClass.GUARANTEED] > 0
    if qos == QoSClass.GUARANTEED:
        return MILLI_PER_GPU - used
    if qos == QoSClass.BURSTABLE:
        reserved_room = MILLI_PER_GPU - used + best_effort
        return np.where(holds_guaranteed, np.minimum(reserved_room, MILLI_PER_GPU - used), reserved_room)
    return np.where(holds_guaranteed, MILLI_PER_GPU, policy.best_effort_cap_milli) - used


def share_fits(request: PodRequest, used: NDArray[np.int64], best_effort: NDArray[np.int64],
               qos_pods: NDArray[np.int64], policy: QoSPolicy) -> NDArray[np.bool_]:
    """Whether each GPU has the share the pod's QoS class may take: ``request.gpu_milli <=
    share_room(request.qos, ...)``, the other parameters as ``share_room``'s.

    Returns
    -------
    ndarray of shape (m, g), bool
    """
    return request.gpu_milli <= share_room(request.qos, used, best_effort, qos_pods, policy)


def isolation_ok(request: PodRequest, qos_pods: NDArray[np.int64],
                 policy: QoSPolicy) -> NDArray[np.bool_] | None:
    """GPUs the pod may join under ``policy.isolate_guaranteed``; None when nothing is excluded.

    Parameters
    ----------
    request : PodRequest
    qos_pods : ndarray of shape (m, g, 3), int64
    policy : QoSPolicy

    Returns
    -------
    ndarray of shape (m, g), bool, or None
    """
    if not policy.isolate_guaranteed or request.qos == QoSClass.BURSTABLE:
        return None
    other = QoSClass.BEST_EFFORT if request.qos == QoSClass.GUARANTEED else QoSClass.GUARANTEED
    allowed: NDArray[np.bool_] = qos_pods[..., other] == 0
    return allowed


@dataclass(frozen=True, slots=True, eq=False)
class ClusterTerms:
    """The cluster-wide inputs of the scores, the same for every candidate node.

    Attributes
    ----------
    tasks : TaskTypes or None
        ``ClusterState.workload.task_types()``.
    whole_node_unseen : bool
        ``not ClusterState.workload.whole_node_seen()`` while no pod that held GPUs has left
        (``WorkloadModel.churn`` 0: a filling cluster; where pods leave, ``consolidation``
        keeps nodes whole instead): too few counted pods have taken a whole node
        of the largest size yet (``scoring.scorer.Ties.KEEP_WHOLE`` then keeps empty nodes
        through near-ties).
    strategy_terms : mapping of str to object
        The strategies' own cluster-wide terms, by ``TERM`` name (``Scorer.cluster_terms``
        adds them; this module knows none of them).
    """

    tasks: TaskTypes | None
    whole_node_unseen: bool = False
    strategy_terms: Mapping[str, object] = field(default_factory=lambda: NO_TERMS)


def cluster_terms(state: ClusterState) -> ClusterTerms:
    """The state's current workload terms (no strategy terms: ``Scorer.cluster_terms`` adds them)."""
    return ClusterTerms(state.workload.task_types(),
                        not state.workload.whole_node_seen() and state.workload.churn() == 0.0)


def fit(state: ClusterState, request: PodRequest, rows: NDArray[np.int64],
        policy: QoSPolicy = DEFAULT_QOS_POLICY, terms: ClusterTerms | None = None,
        memo: Memo | None = None) -> FitContext:
    """Decide feasibility of ``request`` on the nodes ``rows``.

    Parameters
    ----------
    state : ClusterState
        Read only.
    request : PodRequest
    rows : ndarray of shape (m,), int64
        Candidate node rows; may be empty.
    policy : QoSPolicy
        What each QoS class may share.
    terms : ClusterTerms, optional
        The cluster-wide terms to score with; ``cluster_terms(state)`` by default. An
        incremental evaluation (``scoring.incremental``) passes the ones its kept rows were
        scored with, so that every row of one evaluation sees the same workload.
    memo : Memo, optional
        The evaluation owner's (``scoring.memo``); a fresh one when None.

    Returns
    -------
    FitContext
        Per-GPU and per-node feasibility, reasons, and the sliced arrays the strategies use.
    """
    rows = np.asarray(rows, dtype=np.int64)
    exists = state.gpu_exists[rows]
    mem_total = state.gpu_mem_total_mib[rows]
    mem_free = state.gpu_mem_free_mib[rows]
    if request.qos == QoSClass.GUARANTEED:
        # Guaranteed pods reserve memory: what NVML sees in use counts when it is larger.
        mem_free = np.minimum(mem_free, mem_total - state.gpu_mem_nvml_used_mib[rows])
    free_milli = state.gpu_free_milli[rows]
    qos_pods = state.gpu_qos_pods[rows]
    mem_req = gpu_memory_request_mib(request.gpu_milli, request.gpu_memory_mib, mem_total)
    cpu_free = state.cpu_alloc_milli[rows] - state.cpu_used_milli[rows]
    mem_host_free = state.mem_alloc_mib[rows] - state.mem_used_mib[rows]

    k = request.gpu_count
    # Cumulative GPU checks, in Reason order; each stage keeps what passed the previous one.
    if request.allowed_models is None:
        model_ok = exists
    else:
        allowed = np.fromiter(request.allowed_models, dtype=np.int64)
        model_ok = exists & np.isin(state.gpu_model[rows], allowed)
    gpu_healthy = state.gpu_healthy[rows]
    healthy = model_ok & gpu_healthy
    isolated = isolation_ok(request, qos_pods, policy)
    qos_ok = healthy if isolated is None else healthy & isolated
    share_ok = qos_ok & share_fits(request, state.gpu_used_milli[rows],
                                   state.gpu_best_effort_milli[rows], qos_pods, policy)
    mem_ok = share_ok & (mem_free >= mem_req)
    slot_ok = mem_ok & (state.gpu_slots_free[rows] > 0)

    m = rows.shape[0]
    if k > 0:
        # The checks are nested, so the number each GPU passes is the stage it reached
        # (0..7). A node fits GPU-wise when its k-th best GPU reached stage 7; otherwise the
        # stage its k-th best GPU stopped at names the reason.
        stage = (exists.view(np.int8) + model_ok.view(np.int8) + healthy.view(np.int8)
                 + qos_ok.view(np.int8) + share_ok.view(np.int8) + mem_ok.view(np.int8) + slot_ok.view(np.int8))
        if k > stage.shape[1]:
            kth = np.zeros(m, dtype=np.int8)
        elif k == 1:
            kth = stage.max(axis=1, initial=0)
        else:
            kth = -np.partition(-stage, k - 1, axis=1)[:, k - 1]
        reason = _REASON_BY_STAGE[kth]
    else:
        reason = np.zeros(m, dtype=np.int8)
    # Host checks come before GPU checks in the reason order (as kube-scheduler's own fit).
    reason[mem_host_free < request.memory_mib] = Reason.INSUFFICIENT_MEMORY
    reason[cpu_free < request.cpu_milli] = Reason.INSUFFICIENT_CPU
    if k > 0:
        reason[~state.node_ready[rows]] = Reason.NODE_NOT_READY

    node_total = state.node_gpu_total_milli[rows]
    if terms is None:
        terms = cluster_terms(state)
    return FitContext(
        request=request,
        rows=rows,
        gpu_fits=slot_ok if k > 0 else np.zeros_like(slot_ok),
        node_fits=reason == Reason.FITS,
        reason=reason,
        free_milli=free_milli,
        mem_req_mib=mem_req,
        mem_free_mib=mem_free,
        mem_total_mib=mem_total,
        gpu_exists=exists,
        qos_pods=qos_pods,
        node_used_milli=state.node_gpu_used_milli[rows],
        node_total_milli=node_total,
        cpu_free_milli=cpu_free,
        mem_host_free_mib=mem_host_free,
        cpu_alloc_milli=state.cpu_alloc_milli[rows],
        mem_host_alloc_mib=state.mem_alloc_mib[rows],
        gpu_model=state.gpu_model[rows],
        gpu_healthy=gpu_healthy,
        gpu_mem_free_mib=mem_free if request.qos != QoSClass.GUARANTEED else state.gpu_mem_free_mib[rows],
        tasks=terms.tasks,
        gpus_by_model=state.gpus_by_model,
        gpus_by_kind=state.gpus_by_kind,
        memory_by_kind=state.memory_by_kind,
        whole_node_unseen=terms.whole_node_unseen,
        terms=terms.strategy_terms,
        memo=memo if memo is not None else Memo(),
    )


def fragmented_on(state: ClusterState, request: PodRequest, nodes: NDArray[np.bool_] | None = None) -> int:
    """On how many nodes a pod's request lies free in pieces, when it waits for fragmentation.

    A GPU pod *waits for fragmentation*, not for capacity, when the GPUs it may use (of its
    models, healthy, on ready nodes among ``nodes``) have its ``gpu_count * gpu_milli`` free
    in sum, yet it fits none of those nodes (``fit``: CPU, memory, share, GPU memory, slots,
    QoS): the room is there, in pieces. What the defragmentation plan, starvation protection
    and filter's reason read.

    Parameters
    ----------
    state : ClusterState
        Read only.
    request : PodRequest
    nodes : ndarray of shape (n_nodes,), bool, optional
        The nodes the pod may use (its ``nodeSelector``, its candidates); every node when None.

    Returns
    -------
    int
        The number of those nodes holding some free share the pod may use; 0 when it does not
        wait for fragmentation (a CPU-only pod, too little free in sum, or it fits a node).
    """
    if request.gpu_count == 0:
        return 0
    ready = state.node_ready if nodes is None else state.node_ready & nodes
    usable = state.gpu_healthy & ready[:, None]
    if request.allowed_models is not None:
        usable &= np.isin(state.gpu_model, np.fromiter(request.allowed_models, dtype=np.int64))
    free = np.where(usable, state.gpu_free_milli, 0)  # 0 on GPU columns that do not exist
    if int(free.sum()) < request.gpu_count * request.gpu_milli:
        return 0  # waits for capacity (the cheap test first)
    rows = np.flatnonzero(ready).astype(np.int64)
    if not rows.shape[0] or fit(state, request, rows).node_fits.any():
        return 0
    return int((free.sum(axis=1) > 0).sum())
