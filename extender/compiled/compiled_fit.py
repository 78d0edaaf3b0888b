"""Feasibility (``scoring.fit.fit``) in one compiled pass over the candidate rows.

The same ``FitContext``, field for field: the GPU checks in ``scoring.fit.Reason`` order
(exists, model, healthy, QoS isolation, share by QoS class, GPU memory, a replica slot), the
stage the node's ``k``-th best GPU reached, the host checks, and the rows' arrays the
strategies read. The reference gathers some twenty arrays and combines them in about
seventy numpy calls; here one loop fills blocks allocated once (decision record 0032).
``scoring.fit``'s notes and ``scoring.request.QoSPolicy`` give the rules.

``tests/extender/compiled/test_compiled_fit.py`` holds it to the reference.
"""

from __future__ import annotations

import functools

import numba
import numpy as np
from numpy.typing import NDArray

from extender.compiled.jit import kernel
from scoring.fit import DEFAULT_QOS_POLICY, ClusterTerms, FitContext, Reason, cluster_terms
from scoring.fit import fit as reference
from scoring.memo import Memo
from scoring.request import MILLI_PER_GPU, PodRequest, QoSClass, QoSPolicy
from scoring.state import ClusterState

_I1, _I2, _I3, _B1, _B2 = numba.int64[:], numba.int64[:, :], numba.int64[:, :, :], numba.boolean[:], numba.boolean[:, :]
_STATE = (_B2, _B2, _I2, _I2, _I2, _I2, _I2, _I2, _I2, _I2, _I3, _I1, _I1, _I1, _I1, _B1, _I1, _I1)
"""The state's arrays the checks read, whole: GPU exists, healthy (n, G) bool; model id, total
memory, free memory, NVML-used memory, free share, used share, best-effort share, free
replica slots (n, G); pods per QoS class (n, G, 3); allocatable and used CPU, allocatable and
used host memory (n,); node ready (n,) bool; GPU share total and used (n,)."""
_REQUEST = (_I1, numba.int64, numba.int64, numba.int64, numba.int64, numba.int64, numba.int64,
            numba.boolean, _B1, numba.boolean, numba.int64)
"""The candidate rows (m,); the pod's GPU count, share, explicit GPU memory (-1: its share's
proportion), QoS class, CPU and host memory; whether its models are restricted, and the
allowed-model lookup (model id -> bool); the policy's ``isolate_guaranteed`` and
``best_effort_cap_milli``."""
_OUT = (_B2, _B2, _B2, _I2, _I2, _I2, _I2, _I2, _I2, _I3, numba.int8[:], _B1, _I1, _I1, _I1, _I1, _I1, _I1)
"""Exists, healthy, GPU fits (m, G) bool; free share, GPU memory asked, free memory (as the
class sees it), total memory, model id, free memory (as allocations leave it) (m, G); pods per
QoS class (m, G, 3); reason (m,) int8; node fits (m,) bool; GPU share used and total, free CPU,
free host memory, allocatable CPU and host memory (m,)."""

_GUARANTEED, _BURSTABLE, _BEST_EFFORT = int(QoSClass.GUARANTEED), int(QoSClass.BURSTABLE), int(QoSClass.BEST_EFFORT)
_NOT_READY, _NO_CPU, _NO_MEMORY = int(Reason.NODE_NOT_READY), int(Reason.INSUFFICIENT_CPU), int(Reason.INSUFFICIENT_MEMORY)
_REASON_BY_STAGE = (4, 5, 6, 10, 7, 8, 9, 0)
"""``scoring.fit._REASON_BY_STAGE``: the reason of a node whose ``k``-th best GPU passed this
many nested GPU checks (``tests/extender/compiled/test_compiled_fit.py`` compares the two)."""


@kernel(numba.void(*_STATE, *_REQUEST, *_OUT))
def _fit(exists, healthy, model, mem_total, mem_free, nvml_used, free_milli, used_milli, best_effort,  # type: ignore[no-untyped-def]
         slots_free, qos_pods, cpu_alloc, cpu_used, mem_alloc, mem_used, ready, node_total, node_used,
         rows, k, milli, gpu_memory, qos, cpu, memory, restricted, allowed, isolate, cap,
         o_exists, o_healthy, o_fits, o_free, o_mem_req, o_mem_free, o_mem_total, o_model, o_mem_free_all,
         o_qos_pods, o_reason, o_node_fits, o_used, o_total, o_cpu_free, o_mem_host_free, o_cpu_alloc, o_mem_alloc):
    n_gpus = exists.shape[1]
    n_allowed = allowed.shape[0]
    reasons = np.array(_REASON_BY_STAGE, dtype=np.int8)
    per_stage = np.zeros(8, dtype=np.int64)
    for i in range(rows.shape[0]):
        r = rows[i]
        per_stage[:] = 0
        for g in range(n_gpus):
            e = exists[r, g]
            total = mem_total[r, g]
            free_mem = mem_free[r, g]
            o_mem_free_all[i, g] = free_mem
            if qos == _GUARANTEED:  # NVML-used memory counts when it is larger
                free_mem = min(free_mem, total - nvml_used[r, g])
            asked = gpu_memory if gpu_memory >= 0 else (milli * total) // MILLI_PER_GPU
            guaranteed_here = qos_pods[r, g, _GUARANTEED] > 0
            used = used_milli[r, g]
            if qos == _GUARANTEED:  # scoring.fit.share_room
                room = MILLI_PER_GPU - used
            elif qos == _BURSTABLE:
                room = MILLI_PER_GPU - used + best_effort[r, g]
                if guaranteed_here:
                    room = min(room, MILLI_PER_GPU - used)
            else:
                room = (MILLI_PER_GPU if guaranteed_here else cap) - used
            model_ok = e
            if restricted:
                m_id = model[r, g]
                model_ok = e and 0 <= m_id < n_allowed and allowed[m_id]
            healthy_ok = model_ok and healthy[r, g]
            qos_ok = healthy_ok
            if isolate and qos != _BURSTABLE:  # scoring.fit.isolation_ok
                other = _BEST_EFFORT if qos == _GUARANTEED else _GUARANTEED
                qos_ok = healthy_ok and qos_pods[r, g, other] == 0
            share_ok = qos_ok and milli <= room
            mem_ok = share_ok and free_mem >= asked
            slot_ok = mem_ok and slots_free[r, g] > 0
            per_stage[int(e) + int(model_ok) + int(healthy_ok) + int(qos_ok) + int(share_ok) + int(mem_ok)
                      + int(slot_ok)] += 1
            o_exists[i, g] = e
            o_healthy[i, g] = healthy[r, g]
            o_fits[i, g] = slot_ok and k > 0
            o_free[i, g] = free_milli[r, g]
            o_mem_req[i, g] = asked
            o_mem_free[i, g] = free_mem
            o_mem_total[i, g] = total
            o_model[i, g] = model[r, g]
            for q in range(qos_pods.shape[2]):
                o_qos_pods[i, g, q] = qos_pods[r, g, q]
        reason = 0
        if k > 0:
            kth = 0  # fewer than k GPU columns: TOO_FEW_GPUS
            if k <= n_gpus:
                seen = 0
                for stage in range(per_stage.shape[0] - 1, -1, -1):  # the k-th largest stage
                    seen += per_stage[stage]
                    if seen >= k:
                        kth = stage
                        break
            reason = reasons[kth]
        cpu_free = cpu_alloc[r] - cpu_used[r]
        host_free = mem_alloc[r] - mem_used[r]
        if host_free < memory:  # the host checks come before the GPU checks, as in the reference
            reason = _NO_MEMORY
        if cpu_free < cpu:
            reason = _NO_CPU
        if k > 0 and not ready[r]:
            reason = _NOT_READY
        o_reason[i] = reason
        o_node_fits[i] = reason == 0
        o_used[i] = node_used[r]
        o_total[i] = node_total[r]
        o_cpu_free[i] = cpu_free
        o_mem_host_free[i] = host_free
        o_cpu_alloc[i] = cpu_alloc[r]
        o_mem_alloc[i] = mem_alloc[r]


def _allowed(request: PodRequest) -> NDArray[np.bool_]:
    """The allowed-model lookup: ``out[id]`` for every id in ``request.allowed_models``."""
    return _allowed_ids(request.allowed_models)


@functools.lru_cache(maxsize=1024)
def _allowed_ids(models: frozenset[int] | None) -> NDArray[np.bool_]:
    """``_allowed``, made once per set of model ids and shared (the kernel only reads it; kept
    writable, since a read-only array is another numba type, refused with TypeError)."""
    ids = [i for i in models or () if i >= 0]
    out = np.zeros(max(ids, default=-1) + 1, dtype=bool)
    out[ids] = True
    return out


def fit(state: ClusterState, request: PodRequest, rows: NDArray[np.int64],
        policy: QoSPolicy = DEFAULT_QOS_POLICY, terms: ClusterTerms | None = None,
        memo: Memo | None = None) -> FitContext:
    """``scoring.fit.fit``, the same ``FitContext`` (parameters, returns: the reference's).

    A state whose arrays are not of the kernel's dtypes (none is built so today) is checked
    by the reference, never compiled on a request.
    """
    rows = np.asarray(rows, dtype=np.int64)
    m, n_gpus = rows.shape[0], state.gpu_exists.shape[1]
    bools = np.empty((3, m, n_gpus), dtype=bool)
    ints = np.empty((6, m, n_gpus), dtype=np.int64)
    per_row = np.empty((6, m), dtype=np.int64)
    qos_pods = np.empty((m, n_gpus, state.gpu_qos_pods.shape[2]), dtype=np.int64)
    reason = np.empty(m, dtype=np.int8)
    node_fits = np.empty(m, dtype=bool)
    explicit = -1 if request.gpu_memory_mib is None else request.gpu_memory_mib
    try:
        _fit(state.gpu_exists, state.gpu_healthy, state.gpu_model, state.gpu_mem_total_mib, state.gpu_mem_free_mib,
             state.gpu_mem_nvml_used_mib, state.gpu_free_milli, state.gpu_used_milli, state.gpu_best_effort_milli,
             state.gpu_slots_free, state.gpu_qos_pods, state.cpu_alloc_milli, state.cpu_used_milli,
             state.mem_alloc_mib, state.mem_used_mib, state.node_ready, state.node_gpu_total_milli,
             state.node_gpu_used_milli,
             rows, request.gpu_count, request.gpu_milli, explicit, int(request.qos), request.cpu_milli,
             request.memory_mib, request.allowed_models is not None, _allowed(request),
             policy.isolate_guaranteed, policy.best_effort_cap_milli,
             *bools, *ints, qos_pods, reason, node_fits, *per_row)
    except TypeError:  # arrays of other dtypes: no compile on the hot path
        return reference(state, request, rows, policy, terms, memo)
    exists, healthy, fits = bools
    free, mem_req, mem_free, mem_total, model, mem_free_all = ints
    used, total, cpu_free, host_free, cpu_alloc, mem_alloc = per_row
    if terms is None:
        terms = cluster_terms(state)
    return FitContext(
        request=request, rows=rows, gpu_fits=fits, node_fits=node_fits, reason=reason, free_milli=free,
        mem_req_mib=mem_req, mem_free_mib=mem_free, mem_total_mib=mem_total, gpu_exists=exists,
        qos_pods=qos_pods, node_used_milli=used, node_total_milli=total, cpu_free_milli=cpu_free,
        mem_host_free_mib=host_free, cpu_alloc_milli=cpu_alloc, mem_host_alloc_mib=mem_alloc, gpu_model=model,
        gpu_healthy=healthy, gpu_mem_free_mib=mem_free if request.qos != QoSClass.GUARANTEED else mem_free_all,
        tasks=terms.tasks, gpus_by_model=state.gpus_by_model, gpus_by_kind=state.gpus_by_kind,
        memory_by_kind=state.memory_by_kind, whole_node_unseen=terms.whole_node_unseen,
        terms=terms.strategy_terms,
        memo=memo if memo is not None else Memo(),
    )

