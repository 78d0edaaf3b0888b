"""``ResourceClaimBook``: the shares ResourceClaims hold of gpufrac's DRA driver, in the cache's book.

One book (issue 54): a GPU that annotation pods and claims share is counted once, in the same
arrays, whoever allocated the claim (kube-scheduler's DRA allocator, gpufrac, or anyone with
the right to a claim's ``status``). Each device share of an allocated claim
(``podspec.claims.DeviceShare``) becomes a bound record in the cache: a ``PodIntent`` with
UID ``resourceclaim/<claim UID>/<n>`` (``podspec.claims.CLAIM_RECORD_PREFIX``) on the GPU
the share names, one GPU, the claim's share and memory (without a memory in the claim, what a
pod of that share takes). It is then accounted exactly as a bound pod's allocation record is
(``extender.cache.accounting``): counted as written when gpufrac could have made it; else only
what was free of the GPU (an over-commit: the GPU reads full, so nothing more is placed on
it, and the record is flagged in ``gpufrac inspect`` and ``gpufrac_overcommitted_pods``). It
is never a preemption victim (its priority is above any pod's: a claim is not evicted
through a pod here) and never moved by the defragmentation plan (no controller).

Where a share is: the driver's pool is the node (``agent.dra.slice``), its device a GPU of
the node's inventory named by ``podspec.claims.device_names``. A claim's status is untrusted:
``podspec.claims.claim_allocation`` bounds it, and a claim that cannot be read is
quarantined (kind ``resourceclaim``) with what was counted of it kept: the agent may still
have prepared it, and a bad update never frees a GPU that is in use. A share on a node or
device not (yet) known is counted once it is (``retry``, from housekeeping); until then the
claim is quarantined with the reason.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extender.cache import GpuCache, GpuRoom
from extender.cluster import claim_safety
from extender.cluster.objects import object_key, revision
from extender.quarantine import Quarantine
from podspec.claims import (
    CLAIM_RECORD_PREFIX,
    DRIVER,
    ClaimAllocation,
    DeviceAsk,
    asked_memory_mib,
    claim_allocation,
    device_asks,
    device_names,
    other_requests,
    pod_claim_names,
)
from podspec.pods import PodIntent
from podspec.quantities import INT32, PodSpecError, quote
from scoring.request import QoSClass
from scoring.specs import GpuSpec

log = logging.getLogger(__name__)

KIND = "resourceclaim"
"""The quarantine kind of a claim that cannot be read or placed."""

CLAIM_PRIORITY = INT32[1]
"""A claim record's priority: above any pod's (2,000,001,000 at most), so never a victim."""

MAX_REFUSED_PODS = 1000
"""Pods remembered for a requeue (``refused_pods``); more are left to kube-scheduler's own
retries."""


@dataclass(frozen=True, slots=True)
class ClaimView:
    """What the book read of one claim (``ResourceClaimBook.claims_of``)."""

    name: str
    uid: str
    asks: tuple[DeviceAsk, ...] | str
    """Its requests of ``DEVICE_CLASS``, or why they cannot be read."""
    other_requests: int
    """Requests of other device classes (``podspec.claims.other_requests``)."""
    allocated: bool
    """``status.allocation`` is set (by anyone, for any driver)."""
    nodes: frozenset[str]
    """The nodes (pools) of its shares of the driver."""
    gpus: tuple[str, ...] = ()
    """The UUIDs of the GPUs its shares are counted on in the book."""


@dataclass(frozen=True, slots=True)
class RefusedPod:
    """A pod whose claims some node was refused for (what a requeue needs of it)."""

    uid: str
    namespace: str
    name: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def claim_intents(alloc: ClaimAllocation, node_gpus: Callable[[str], Sequence[GpuSpec] | None],
                  created_at: str = "") -> tuple[list[PodIntent], list[str]]:
    """The cache records of a claim's device shares, and why any share could not be placed.

    Parameters
    ----------
    alloc : ClaimAllocation
        The claim's shares of ``DRIVER`` (bounded by ``podspec.claims``).
    node_gpus : callable (node name) -> sequence of GpuSpec or None
        A node's GPUs in inventory order (``NodeReader.gpus``); None for a node not known.
    created_at : str
        The claim's ``creationTimestamp`` (orders it among arrivals).

    Returns
    -------
    intents : list of PodIntent
        One per share that names a GPU of a known node, UID ``resourceclaim/<uid>/<n>``.
    problems : list of str
        One per share that does not (node or device unknown), naming it.
    """
    intents, problems = [], []
    for n, share in enumerate(alloc.devices):
        gpus = node_gpus(share.pool)
        if gpus is None:
            problems.append(f"device {share.device}: pool {quote(share.pool)} is no node gpufrac knows")
            continue
        by_name = dict(zip(device_names([g.index for g in gpus]), gpus, strict=True))
        gpu = by_name.get(share.device)
        if gpu is None:
            problems.append(f"device {share.device}: not in node {share.pool}'s inventory")
            continue
        memory = asked_memory_mib(share.memory_mib)  # None: the share's part of the GPU's memory
        intents.append(PodIntent(
            uid=f"{CLAIM_RECORD_PREFIX}{alloc.uid}/{n}", namespace=alloc.namespace,
            name=f"{CLAIM_RECORD_PREFIX}{alloc.name}/{share.request}", node_name=share.pool, phase="Running",
            gpu_count=1, gpu_milli=share.gpu_milli, gpu_memory_mib=memory, gpu_models=None,
            qos=QoSClass.BURSTABLE, cpu_milli=0, memory_mib=0, assigned_gpus=(gpu.uuid,),
            assigned_gpu_milli=share.gpu_milli, assigned_memory_mib=(memory,) if memory else (),
            priority=CLAIM_PRIORITY, created_at=created_at))
    return intents, problems


class ResourceClaimBook:
    """Keep the cache's claim records equal to the API's ResourceClaims (module notes).

    Parameters
    ----------
    cache : GpuCache
    quarantine : Quarantine
    node_gpus : callable (node name) -> sequence of GpuSpec or None
        ``NodeReader.gpus``.
    """

    def __init__(self, cache: GpuCache, quarantine: Quarantine,
                 node_gpus: Callable[[str], Sequence[GpuSpec] | None]) -> None:
        self._cache = cache
        self._quarantine = quarantine
        self._node_gpus = node_gpus
        self._held: dict[str, dict[str, PodIntent]] = {}  # claim key -> {record UID: record}
        self._unplaced: dict[str, Mapping[str, Any]] = {}  # claim key -> object, tried again
        self._asks: dict[str, tuple[DeviceAsk, ...] | str] = {}  # claim key -> its asks, or why unreadable
        self._shares: dict[str, tuple[tuple[str, str, int, int], ...]] = {}  # claim key -> (node, device, milli, MiB)
        self._consumed: dict[str, dict[str, tuple[int, int, int]]] = {}  # node -> device -> claims' totals
        self._refused: dict[str, RefusedPod] = {}  # pod UID -> the pod, refused a node since the last requeue
        self._views: dict[str, ClaimView] = {}  # claim key -> what gpufrac's allocation reads of it
        self._revisions: dict[str, int] = {}  # claim key -> resourceVersion applied last
        self._lock = threading.Lock()

    def node_gpus(self, node: str) -> Sequence[GpuSpec] | None:
        """A node's GPUs in inventory order (the ``node_gpus`` given); None for a node not known."""
        return self._node_gpus(node)

    def held(self) -> dict[str, tuple[str, ...]]:
        """Each claim counted (``namespace/name``) and the UIDs of its records."""
        with self._lock:
            return {key: tuple(recs) for key, recs in self._held.items()}

    def apply(self, kind: str, obj: Mapping[str, Any]) -> bool:
        """One claim watch event (``ADDED``, ``MODIFIED``, ``DELETED``), or a claim as a bind
        wrote it. A version older than the last one applied is ignored. Never raises.

        Returns
        -------
        bool
            True if GPU share was freed (the claim was deleted or deallocated).
        """
        key = object_key(obj)
        rv = revision(obj)
        with self._lock:
            # A watch event older than what the book applied (bind's own write, read back
            # before the watch delivers it) must not undo it: the finalizer's write, one
            # revision before the allocation, would free the share for a moment, and a bind
            # on the node in that moment over-commits the GPU.
            if kind != "DELETED" and rv is not None and rv < self._revisions.get(key, -1):
                return False
            try:
                if kind == "DELETED" or rv is None:
                    self._revisions.pop(key, None)
                else:
                    self._revisions[key] = rv
                return self._apply(key, kind, obj)
            except Exception as exc:  # noqa: BLE001 - one claim must never stop the watch
                log.exception("resource claim %s: cache update failed", key)
                self._quarantine.reject(KIND, key, f"internal: {type(exc).__name__}: {exc}")
                return False

    def relist(self, items: Iterable[Mapping[str, Any]]) -> bool:
        """A full claim list: claims not in it are forgotten (deleted while no watch ran).

        Returns
        -------
        bool
            True if GPU share was freed.
        """
        items = list(items)
        listed = {object_key(obj) for obj in items}
        freed = False
        with self._lock:
            for key in (set(self._held) | set(self._asks) | set(self._shares) | set(self._unplaced)) - listed:
                self._unplaced.pop(key, None)
                freed |= self._drop(key)
        self._quarantine.retain(KIND, listed)
        for obj in items:
            freed |= self.apply("ADDED", obj)
        return freed

    def retry(self) -> None:
        """Place again the claims whose node or device was not known (housekeeping)."""
        with self._lock:
            waiting = list(self._unplaced.values())
        for obj in waiting:
            self.apply("MODIFIED", obj)

    def claims_of(self, namespace: str, names: Iterable[str]) -> list[ClaimView | None]:
        """The book's view of each named claim of ``namespace``; None for one not seen (not
        made yet, or the watch has not delivered it)."""
        with self._lock:
            return [self._views.get(f"{namespace}/{name}") if name else None for name in names]

    def refusals(self, pod: Mapping[str, Any], nodes: Sequence[str],
                 gpu_rooms: Callable[[Sequence[str]], Mapping[str, Sequence[GpuRoom]]]) -> dict[str, str]:
        """The candidate ``nodes`` where kube-scheduler's DRA allocator would over-commit a GPU
        for the pod's claims not allocated yet (``extender.cluster.claim_safety``), with the
        reason; every node when one of its claims cannot be read. Empty for a pod without such
        claims. ``gpu_rooms`` (``GpuCache.gpu_rooms``) is read only when there is one."""
        names = pod_claim_names(pod)
        if not names:  # most pods: no lock taken
            return {}
        raw_meta = pod.get("metadata")
        meta: Mapping[str, Any] = raw_meta if isinstance(raw_meta, Mapping) else {}
        ns = meta.get("namespace")
        asks: list[DeviceAsk] = []
        with self._lock:
            for name in names:
                key = f"{ns}/{name}"
                got = self._asks.get(key)
                if isinstance(got, str):
                    return dict.fromkeys(nodes, f"gpufrac: claim {name}: {got}")
                if got is not None and key not in self._shares:
                    asks.extend(got)
            if not asks:
                return {}
            consumed = {node: dict(self._consumed.get(node, {})) for node in nodes}
        out = {}
        for node, gpus in gpu_rooms(nodes).items():
            why = claim_safety.refusal(asks, gpus, consumed[node])
            if why:
                out[node] = why
        uid, pod_name = meta.get("uid"), meta.get("name")
        if out and isinstance(uid, str) and isinstance(pod_name, str) and isinstance(ns, str):
            self.note_waiting(uid, ns, pod_name)
        return out

    def note_waiting(self, uid: str, namespace: str, name: str) -> None:
        """Remember a pod refused a node for its claims, or whose claims gpufrac is asked to
        place (``--allocate-claims``), for ``refused_pods`` (bounded by ``MAX_REFUSED_PODS``)."""
        with self._lock:
            if uid in self._refused or len(self._refused) < MAX_REFUSED_PODS:
                self._refused[uid] = RefusedPod(uid, namespace, name)

    def refused_pods(self) -> list[RefusedPod]:
        """The pods refused a node (or, allocating claims, filtered) since the last call, then
        forgotten, but those the cache shows bound: when GPU share is freed they are
        requeued as pending GPU pods are (``ClusterSync``), since gpufrac does not count a
        claim pod as one."""
        with self._lock:
            got, self._refused = list(self._refused.values()), {}
        return [p for p in got if (i := self._cache.pod_intent(p.uid)) is None or not i.node_name]

    def _set_shares(self, key: str, shares: tuple[tuple[str, str, int, int], ...]) -> None:
        """Replace what claim ``key`` consumes of the devices, as the allocator counts it."""
        for sign, entries in ((-1, self._shares.pop(key, ())), (1, shares)):
            for node, device, milli, mem in entries:
                by_device = self._consumed.setdefault(node, {})
                m, b, c = by_device.get(device, (0, 0, 0))
                total = (m + sign * milli, b + sign * mem, c + sign)
                if total[2] > 0:
                    by_device[device] = total
                else:
                    by_device.pop(device, None)
                    if not by_device:
                        del self._consumed[node]
        if shares:
            self._shares[key] = shares

    def _drop(self, key: str) -> bool:
        self._revisions.pop(key, None)
        self._asks.pop(key, None)
        self._views.pop(key, None)
        self._set_shares(key, ())
        freed = False
        for uid in self._held.pop(key, {}):
            freed |= self._cache.remove_pod(uid)
        return freed

    def _apply(self, key: str, kind: str, obj: Mapping[str, Any]) -> bool:
        self._unplaced.pop(key, None)
        if kind == "DELETED":
            self._quarantine.clear(KIND, key)
            return self._drop(key)
        try:
            self._asks[key] = device_asks(obj)
        except PodSpecError as exc:
            self._asks[key] = str(exc)
        try:
            alloc = claim_allocation(obj, DRIVER)
        except PodSpecError as exc:
            self._views.pop(key, None)  # never allocated to, nor bound by, while unreadable
            self._quarantine.reject(KIND, key, f"{exc}; what was counted of it is kept")
            return False
        self._set_shares(key, tuple((d.pool, d.device, d.gpu_milli, d.memory_mib) for d in alloc.devices))
        meta = obj.get("metadata")
        created = meta.get("creationTimestamp") if isinstance(meta, Mapping) else None
        intents, problems = claim_intents(alloc, self._node_gpus, created if isinstance(created, str) else "")
        status = obj.get("status")
        self._views[key] = ClaimView(alloc.name, alloc.uid, self._asks[key], other_requests(obj),
                                     isinstance(status, Mapping) and bool(status.get("allocation")),
                                     frozenset(d.pool for d in alloc.devices),
                                     tuple(g for i in intents for g in i.assigned_gpus))
        old = self._held.get(key, {})
        new = {i.uid: i for i in intents}
        freed = False
        for uid, intent in old.items():
            if new.get(uid) != intent:  # gone, or changed (an allocation is immutable; untrusted)
                freed |= self._cache.remove_pod(uid)
        for uid, intent in new.items():
            if old.get(uid) != intent:
                self._cache.apply_pod_event("ADDED", intent)
        if new:
            self._held[key] = new
        else:
            self._held.pop(key, None)
        if problems:
            self._unplaced[key] = obj
            self._quarantine.reject(KIND, key, "; ".join(problems))
        else:
            self._quarantine.clear(KIND, key)
        return freed
