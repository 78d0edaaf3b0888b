"""What the cache stores per pod, and the small facts about a record every part needs."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from extender.translate.inbound import model_mask_of
from podspec.pods import PodIntent
from scoring.evaluated import Evaluation
from scoring.specs import Allocation
from scoring.state import ClusterState

EventType = Literal["ADDED", "MODIFIED", "DELETED"]


class BindError(Exception):
    """Bind refused; the message goes to kube-scheduler in ``ExtenderBindingResult.Error``.

    Parameters
    ----------
    message : str
    reason : str
        For ``gpufrac_bind_total``'s ``result`` label: ``conflict`` (another instance bound
        there first), ``no_fit`` (the node no longer fits the pod at bind), ``quota`` (the tenant's
        quota refuses it at bind), ``error``.
    """

    def __init__(self, message: str, reason: str = "error") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ClaimedAllocation:
    """Another gpufrac instance's claim (``extender.fence.Claim``), as the cache counts it.

    Attributes
    ----------
    uid, namespace, name : str
        The pod.
    node : str
    gpu_uuids : tuple of str
    gpu_milli : int
        Share per GPU, milli-GPU.
    gpu_memory_mib : tuple of int
        Memory per GPU, MiB.
    owner : str
        The instance that claimed it (for messages).
    ttl_s : float
        Seconds the claim has left to live.
    """

    uid: str
    namespace: str
    name: str
    node: str
    gpu_uuids: tuple[str, ...]
    gpu_milli: int
    gpu_memory_mib: tuple[int, ...]
    owner: str
    ttl_s: float


class Receipt(enum.Enum):
    """What ``GpuCache.assume`` does with a fenced bind's hold taken on receipt
    (``KubeBinder.hold_on_receipt``), chosen before the node's claim ledger was read.

    - ``NONE``: a plain assume.
    - ``HOLD``: the hold on receipt; the cache remembers the node's row version it was
      chosen at.
    - ``AGAIN``: the group commit's choice against the ledger: the hold is kept when every
      change to the node since it (claims counted just before included) was this
      instance's own choice or a hold given back, which all counted it; else it is given
      back and the pod chosen again (``extender.cache.assume``, notes).
    """

    NONE = "none"
    HOLD = "hold"
    AGAIN = "again"


class ClaimCount(enum.Enum):
    """What ``GpuCache.count_claim`` made of another instance's claim."""

    COUNTED = "counted"
    VOID = "void"
    UNKNOWN = "unknown"
    BUSY = "busy"


@dataclass(frozen=True, slots=True)
class PodRecord:
    """A pod the cache knows, and what it holds (``allocation`` is None while pending).

    ``assumed_until`` is set while a bind is in flight in cluster mode: the allocation is
    held (counted, so no other bind can take it) but the pod watch has not yet shown the
    pod bound to that node. It is a ``time.monotonic()`` deadline after which
    ``expire_assumed`` gives the allocation back.

    ``overcommit_reason`` is set for a bound pod whose recorded allocation gpufrac could not have
    made (``extender.cache.accounting``): ``allocation`` and ``extra`` then hold, per GPU, only
    what was free of it.
    """

    intent: PodIntent
    allocation: Allocation | None = None
    gpu_uuids: tuple[str, ...] = ()
    assumed_until: float | None = None
    extra: tuple[Allocation, ...] = ()
    overcommit_reason: str = ""

    @property
    def held(self) -> tuple[Allocation, ...]:
        """Every allocation the record holds (none while pending)."""
        return () if self.allocation is None else (self.allocation, *self.extra)

    @property
    def gpu_milli_held(self) -> int:
        """Total share held, milli-GPU (victim ordering)."""
        return sum(a.gpu_milli * len(a.gpu_cols) for a in self.held)


@dataclass(frozen=True, slots=True)
class CandidateEvaluation:
    """Evaluation of one pod on the known candidates, plus the names the cache lacks."""

    names: list[str]
    """Known candidate names, aligned with ``evaluation`` rows."""
    unknown: list[str]
    evaluation: Evaluation
    rejection: str | None = None
    """Why the pod's tenant may not place it (QoS ceiling, quota); None when admitted."""
    names_array: np.ndarray | None = None
    """``names`` as an object array, when the cache keeps one for this candidate list."""
    reserved: Mapping[str, str] = field(default_factory=dict)
    """Candidates left out because they are reserved for another pod, each with the reason
    (``extender.cache.reservations``); filter fails them with it."""
    pieces: int = 0
    """When no candidate fits a GPU pod whose request is free in sum on them: the candidates
    holding pieces of it (``scoring.fit.fragmented_on``); filter's reason says so. 0 otherwise."""


def is_pending(rec: PodRecord) -> bool:
    """A GPU pod waiting for a node (what ``pending_gpu_pods`` lists)."""
    i = rec.intent
    return rec.allocation is None and bool(i.gpu_count) and not i.node_name and not i.finished


def task_key(intent: PodIntent, state: ClusterState) -> tuple[int, int, int, int, int, int]:
    """The pod's task type, as ``ClusterState.apply`` counts an allocation."""
    return (intent.gpu_count, intent.gpu_milli, intent.cpu_milli, intent.memory_mib,
            model_mask_of(intent, state), intent.gpu_memory_mib or 0)


@dataclass(frozen=True, slots=True)
class MetricsView:
    """The cache as ``/metrics`` exposes it, copied at one instant (``GpuCache.metrics_view``).

    Attributes
    ----------
    gpus : list of tuple
        One per GPU: ``(node, uuid, model, allocated_milli, allocated_memory_mib,
        memory_total_mib, replicas, pods, healthy, node_ready)``; milli-GPU and MiB.
    tenants : list of tuple
        One per tenant: ``(name, gpu_milli, gpu_memory_mib, quota_gpu_milli,
        quota_gpu_memory_mib)``; a quota is None when the tenant has none.
    """

    gpus: list[tuple[str, str, str, int, int, int, int, int, bool, bool]]
    tenants: list[tuple[str, int, int, int | None, int | None]]
    waiting_for_fragmentation: int | None = None
    """Of the oldest ``WAITING_EXAMINED`` pending GPU pods, those waiting for fragmentation
    (``scoring.fit.fragmented_on``, on every node); None where the defragmentation plan
    counts them instead (cluster mode: with the nodes' labels, ``GpuCache.count_waiting``)."""


WAITING_EXAMINED = 64
"""Pending GPU pods, oldest event first, that the defragmentation plan and the
waiting-for-fragmentation count examine."""

EMPTY_VIEW = MetricsView([], [])
