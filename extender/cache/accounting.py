"""Which recorded allocations gpufrac trusts, and what it counts of the others.

A bound pod's ``gpufrac.io/assigned-*`` annotations are gpufrac's allocation record, read
back after a restart and from every pod watch event. Anyone who may write a pod could write
them too: ``deploy/base/admission-policy.yaml`` lets only gpufrac's service account do so
(see the README's security model). Without that policy, or for a pod bound before it was
installed, the cache still does not take a record on trust. ``account`` reads a bound
pod's record and ``read_back`` checks that it is one gpufrac could have made on the state
as it stands:

- the GPUs are distinct, on the pod's node, as many as the pod asks for (container
  resources cannot change on a running pod);
- on each GPU the recorded share (not the pod's ``gpufrac.io/fraction``, which may be edited
  after bind) fits the pod's QoS class (``scoring.fit.share_room``), the memory
  is free and a time-slicing replica slot is free;
- the pod's tenant admits it (QoS ceiling, quota).

A record that passes is counted as written. One that does not is an **over-commit**: the
pod really runs on those GPUs (the device plugin hands them out), so it is counted, but
never beyond what was free: at most the share its class may still take and the free
memory on each GPU, in a class no better than its tenant's ceiling. The GPU then reads as
full, so gpufrac places nothing more on it, and the pod is flagged (``PodRecord.overcommit_reason``,
the ``gpufrac_overcommitted_pods`` gauge, ``gpufrac inspect``). What the pod really uses on
the GPU reaches the state through the agent's NVML memory reading, which guaranteed pods'
placement already counts.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from extender.cache.records import PodRecord
from extender.cache.tenancy import TenantLedger
from extender.translate.inbound import model_mask_of
from podspec.pods import PodIntent
from scoring.fit import gpu_memory_request_mib, share_room
from scoring.request import MILLI_PER_GPU, QoSClass, QoSPolicy
from scoring.specs import Allocation
from scoring.state import ClusterState

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReadBack:
    """An allocation record as the cache will count it.

    Attributes
    ----------
    allocations : tuple of Allocation
        What to hold: the record itself when trusted; else, per GPU, its part that was free
        (one allocation per GPU, the pod's CPU and memory on the first, none of them learned
        as demand: ``Allocation.in_workload`` is False).
    overcommit_reason : str
        Empty when the record is one gpufrac could have made; else why not (for logs,
        metrics and ``inspect``).
    """

    allocations: tuple[Allocation, ...]
    overcommit_reason: str = ""


def read_back(state: ClusterState, policy: QoSPolicy, intent: PodIntent, cols: tuple[int, ...],
              milli: int, memory_mib: tuple[int, ...], model_mask: int,
              tenant_verdict: str | None, qos: QoSClass) -> ReadBack:
    """Check a recorded allocation against the state; what to count of it.

    Parameters
    ----------
    state : ClusterState
        Read only; the pod's node must be in it.
    policy : QoSPolicy
        The scorer's QoS rules.
    intent : PodIntent
        The bound pod (``node_name`` set).
    cols : tuple of int
        GPU columns of the recorded UUIDs on the node's row (in record order, possibly
        repeated).
    milli : int
        Recorded share per GPU, milli-GPU (1..1000).
    memory_mib : tuple of int
        Recorded memory per GPU, MiB, one per ``cols`` entry.
    model_mask : int
        ``scoring.request.model_mask`` of the pod's allowed models.
    tenant_verdict : str or None
        ``TenantPolicy.admit``'s answer for this pod against its tenant's current usage.
    qos : QoSClass
        The class to count the pod in: its own, but no better than its tenant's ceiling.

    Returns
    -------
    ReadBack
    """
    row = state.node_index[intent.node_name]
    problems: list[str] = []
    distinct = tuple(dict.fromkeys(cols))
    mems = tuple(dict(zip(cols, memory_mib, strict=True))[c] for c in distinct)
    if len(distinct) != len(cols):
        problems.append("a GPU is listed twice")
    if len(distinct) != intent.gpu_count:
        problems.append(f"{len(distinct)} GPU(s) recorded for a pod asking {intent.gpu_count}")
    idx = np.array(distinct, dtype=np.int64)
    mem_need = np.array(mems, dtype=np.int64)
    room = share_room(qos, state.gpu_used_milli[row, idx], state.gpu_best_effort_milli[row, idx],
                      state.gpu_qos_pods[row, idx], policy)
    mem_free = state.gpu_mem_free_mib[row, idx]
    slots = state.gpu_slots_free[row, idx]
    if (room < milli).any():
        problems.append(f"share over what a {qos.wire_name} pod may take")
    if (mem_free < mem_need).any():
        problems.append("memory over what is free")
    if (slots <= 0).any():
        problems.append("no free replica slot")
    if tenant_verdict is not None:
        problems.append(tenant_verdict.removeprefix("gpufrac: "))
    if not problems:
        return ReadBack((Allocation(intent.node_name, distinct, milli, mems, qos, intent.cpu_milli,
                                    intent.memory_mib, model_mask,
                                    gpu_memory_request_mib=intent.gpu_memory_mib or 0),))
    # Over-commit: count on each GPU what was free of it, so the GPU reads as full, never more.
    held_milli = np.clip(np.minimum(milli, room), 0, MILLI_PER_GPU).tolist()
    held_mem = np.clip(np.minimum(mem_need, mem_free), 0, None).tolist()
    allocs = tuple(
        Allocation(intent.node_name, (c,), int(m), (int(b),), qos, intent.cpu_milli if i == 0 else 0,
                   intent.memory_mib if i == 0 else 0, model_mask, in_workload=False)
        for i, (c, m, b) in enumerate(zip(distinct, held_milli, held_mem, strict=True)))
    return ReadBack(allocs, "; ".join(problems))


def cols_for_uuids(state: ClusterState, node: str, uuids: Iterable[str]) -> tuple[int, ...] | None:
    """GPU columns of ``uuids`` on the node's row, in order; None if one is not on the node."""
    row_uuids = state.gpu_uuid[state.node_index[node]]
    try:
        return tuple(row_uuids.index(u) for u in uuids)
    except ValueError:
        return None


def account(state: ClusterState, policy: QoSPolicy, tenancy: TenantLedger, intent: PodIntent) -> PodRecord:
    """The record to hold for a bound pod gpufrac did not just bind, from its allocation record.

    CPU and memory always count. Its GPUs count as recorded when the record is one gpufrac
    could have made (``read_back``), else only what was free of them (an over-commit). The
    caller holds the record (``Ledger.apply_record``).

    Parameters
    ----------
    state : ClusterState
        Read only; ``intent.node_name`` must be in it.
    policy : QoSPolicy
    tenancy : TenantLedger
        For the tenant's QoS ceiling and quota.
    intent : PodIntent
        The bound pod.

    Returns
    -------
    PodRecord
    """
    node = intent.node_name
    tenant = tenancy.tenant(intent.namespace)
    ceiling = None if tenant is None else tenant.qos_ceiling
    qos = intent.qos if ceiling is None else max(intent.qos, ceiling)  # never better than allowed
    cols = (cols_for_uuids(state, node, intent.assigned_gpus)
            if intent.gpu_count and intent.assigned_gpus else ())
    if not cols:  # no record, or its GPUs are not on the node: CPU and memory only
        problem = "" if cols is not None else "assigned GPUs not on the node"
        if problem:
            log.warning("assigned GPUs not on node; counting CPU and memory only",
                        extra={"pod": intent.key, "node": node})
        alloc = Allocation(node, (), 0, (), qos, intent.cpu_milli, intent.memory_mib,
                           model_mask_of(intent, state))
        return PodRecord(intent, alloc, overcommit_reason=problem)
    milli = intent.assigned_gpu_milli or intent.gpu_milli
    if intent.assigned_memory_mib and len(intent.assigned_memory_mib) == len(cols):
        mem = intent.assigned_memory_mib
    else:  # what a pod of the recorded share takes of each GPU
        totals = state.gpu_mem_total_mib[state.node_index[node], list(cols)]
        mem = tuple(gpu_memory_request_mib(milli, intent.gpu_memory_mib, totals).tolist())
    verdict = tenancy.admission(intent, sum(dict(zip(cols, mem, strict=True)).values()),
                                gpu_milli_total=milli * len(set(cols)))
    got = read_back(state, policy, intent, cols, milli, mem, model_mask_of(intent, state), verdict, qos)
    if got.overcommit_reason:
        log.warning("pod %s on %s: allocation record not one gpufrac could have made (%s); "
                    "counting only what was free", intent.key, node, got.overcommit_reason)
    return PodRecord(intent, got.allocations[0], intent.assigned_gpus, None, got.allocations[1:],
                     got.overcommit_reason)
