"""gpufrac allocates ResourceClaims: the share a claim asks is placed by gpufrac's core to the GPU.

Issue 54, path 2 (decision 0023): with ``gpufrac serve --allocate-claims`` and a kube-scheduler
profile without its ``DynamicResources`` plugin (the chart's with ``extender.allocateClaims``),
kube-scheduler allocates no claim of the pods it schedules; gpufrac does, in ``bind``:

1. **What the pod asks** (``claim_plan``): its claims (``PodIntent.resource_claims``) as the
   claim book read them (``ResourceClaimBook.claims_of``). Every request of the DeviceClass
   ``gpu.gpufrac.io`` not allocated yet becomes the pod's GPU request, as annotations would
   make it: ``count`` GPUs of ``share`` milli-GPU each, ``memory`` MiB each when asked. Claims
   allocated already (shared by several pods) pin the pod to their node and are only reserved
   for it. What gpufrac cannot honour is refused with the reason, so the pod waits with it in
   its FailedScheduling event: a claim not made or not seen yet, requests of other device
   classes (nothing in this profile would allocate them), CEL selectors (not evaluated by
   gpufrac: use ``gpufrac.io/gpu-model``), requests of unequal shares, a share below a whole GPU
   on more than one device, claims allocated on two nodes.
2. **filter and prioritize** evaluate the pod with that request (``ClaimPlacement.shape``),
   and fail every node but the one allocated claims pin it to (``ClaimPlacement.refusals``).
3. **bind** (``extender.cluster.binder``): the core chooses the GPUs on kube-scheduler's node
   and holds them (``GpuCache.assume``); ``ClaimWriter.allocate`` writes each claim: the
   finalizer ``resource.kubernetes.io/delete-protection`` (as kube-scheduler's plugin does, so a
   claim in use is not deleted under its pod), then ``status.allocation`` (one result per
   device: driver, pool = node, device, a ``shareID``, ``consumedCapacity`` share / memory /
   slots, and the node selector) with the pod in ``status.reservedFor``, each write conditioned
   on the claim's ``resourceVersion`` (a claim allocated meanwhile by anyone refuses the bind).
   The pod's hold then moves to the claims under the node's lock (the hold given back, the
   written claims counted in the book: no bind chooses there in between, and the claims are
   never read against the pod's own hold as an over-commit; the watch's older versions of a
   claim, its finalizer's write among them, do not undo it: ``ResourceClaimBook.apply``), then
   the Binding is created with no allocation annotation (the claims are the record; the pod
   counts no GPU of its own). If a write or the Binding fails, what was written is undone
   (allocation and reservation removed) and nothing stays held.

The pod's claims are released as kube-scheduler's are: kube-controller-manager's
resourceclaim controller removes a finished pod from ``reservedFor`` and deallocates a claim no
pod reserves; the claim watch then frees the share.

4. **Fenced** (``--fence-namespace``, several replicas): the bind goes through the node's claim
   ledger as any bind (``extender.fence``: group commit, compare-and-swap), so two replicas
   never choose against the same ledger version. Why another replica B never under-counts the
   share a claim pod P got from replica A: A's fence claim of P (P's UID, the GPUs) is never
   dropped as "shown bound" (P never shows GPUs of its own), so it stays live for its
   ``ttl_s``. While it is live, B counts it at every bind on that node, unless B's claim book
   already counts P's claims on those GPUs (``ClaimBinding.held``: then the book does, and
   the fence claim is left out, not counted twice), or B's pod watch shows P bound without
   GPUs while B's book does not yet show its claims: then the fence claim would count
   nothing (``count_claim``: bound without those GPUs), so B waits for its claim watch and
   refuses the bind if it does not catch up (``ClaimBinding.behind``; kube-scheduler
   retries). Left open: a claim watch more than ``ttl_s`` behind the API server after the
   fence claim expired (the same bound the fence puts on a pod watch when a replica dies
   between its claim and its Binding); a claim B cannot read (quarantined) holds binds on
   its node for up to ``ttl_s``.

Sources: ``k8s.io/api/resource/v1`` (``AllocationResult``, ``DeviceRequestAllocationResult``,
``ResourceClaimConsumerReference``), KEP-4381 (a custom allocator writes the status as the
scheduler does), KEP-5075 (``shareID``, ``consumedCapacity``); RBAC in 1.36: update on
``resourceclaims``, ``resourceclaims/status`` and the synthetic ``resourceclaims/binding``.
"""

from __future__ import annotations

import logging
import urllib.parse
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from extender.cache import BindError, GpuCache
from extender.cluster.resource_claims import ClaimView, ResourceClaimBook
from extender.fence import ClaimFence, ClaimLedger
from podspec.claims import (
    DEFAULT_MEMORY_MIB,
    DRIVER,
    DeviceAsk,
    asked_memory_mib,
    device_names,
    pod_claim_refs,
)
from podspec.kubeio import write_json
from podspec.pods import PodIntent
from podspec.quantities import MAX_GPUS_PER_POD
from scoring.request import MILLI_PER_GPU
from scoring.specs import GpuSpec

log = logging.getLogger(__name__)

FINALIZER = "resource.kubernetes.io/delete-protection"
"""The finalizer kube-scheduler's DRA plugin puts on a claim it allocates (the resourceclaim
controller lifts it once the claim is deallocated)."""

GROUP_VERSION = ("resource.k8s.io", "v1")


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    """What gpufrac allocates and reserves for one pod (``claim_plan``)."""

    claims: tuple[ClaimView, ...]
    """Every claim of the pod of the driver, in ``spec.resourceClaims`` order: each is
    reserved for the pod."""
    asks: tuple[tuple[ClaimView, DeviceAsk], ...]
    """The requests to allocate (claims not allocated yet), in order."""
    gpu_count: int
    gpu_milli: int
    gpu_memory_mib: int | None
    node: str
    """The node allocated claims pin the pod to, ``""`` if none is allocated."""


def _refuse(intent: PodIntent, why: str) -> ValueError:
    return ValueError(f"gpufrac: pod {intent.key}: {why}")


def claim_plan(intent: PodIntent, views: Sequence[ClaimView | None]) -> ClaimPlan | None:
    """The pod's claims of ``DRIVER`` as gpufrac places them (module notes, 1).

    Parameters
    ----------
    intent : PodIntent
        The pod; ``views`` are ``ResourceClaimBook.claims_of(intent.namespace,
        intent.resource_claims)``.

    Returns
    -------
    ClaimPlan or None
        None when no claim of the pod asks or holds a device of the driver.

    Raises
    ------
    ValueError
        What gpufrac cannot allocate, the claim and the reason named.
    """
    ours: list[ClaimView] = []
    asks: list[tuple[ClaimView, DeviceAsk]] = []
    nodes: set[str] = set()
    for ref, view in zip(intent.resource_claims, views, strict=True):
        if not ref:
            raise _refuse(intent, "a claim from a template is not made yet (kube-controller-manager's "
                                  "resourceclaim controller makes it)")
        if view is None:
            raise _refuse(intent, f"claim {ref} not seen by gpufrac yet, or unreadable (gpufrac inspect: quarantine)")
        if isinstance(view.asks, str):
            raise _refuse(intent, f"claim {ref}: {view.asks}")
        if view.other_requests:
            raise _refuse(intent, f"claim {ref} asks devices of another DeviceClass than {DRIVER}; this "
                                  "profile allocates only gpufrac's")
        if view.allocated:
            if view.nodes:
                ours.append(view)
                nodes |= view.nodes
            continue
        if view.asks:
            ours.append(view)
        for ask in view.asks:
            if ask.selectors:
                raise _refuse(intent, f"claim {ref} request {ask.request}: CEL selectors are not evaluated by "
                                      "gpufrac; ask a model with the gpufrac.io/gpu-model annotation")
            asks.append((view, ask))
    if not ours:
        return None
    if len(nodes) > 1:
        raise _refuse(intent, f"its claims are allocated on different nodes: {', '.join(sorted(nodes))}")
    if intent.gpu_count:  # the Binding would carry no record of the annotation GPUs
        raise _refuse(intent, "asks GPUs both by gpufrac.io/gpu and by a ResourceClaim; use one")
    shapes = {(a.gpu_milli, a.memory_mib) for _v, a in asks}
    if len(shapes) > 1:
        raise _refuse(intent, "its requests ask unequal shares or memory (" + ", ".join(
            f"{m} milli-GPU / {b} MiB" for m, b in sorted(shapes)) + "); gpufrac places one size per pod")
    count = sum(a.count for _v, a in asks)
    milli, memory = shapes.pop() if shapes else (MILLI_PER_GPU, DEFAULT_MEMORY_MIB)
    if count > MAX_GPUS_PER_POD or (milli < MILLI_PER_GPU and count > 1):
        raise _refuse(intent, f"asks {count} devices of {milli} milli-GPU; a share below a whole GPU is "
                              f"placed on one device, and at most {MAX_GPUS_PER_POD} devices per pod")
    return ClaimPlan(tuple(ours), tuple(asks), count, milli, asked_memory_mib(memory), next(iter(nodes), ""))


def shaped(intent: PodIntent, plan: ClaimPlan) -> PodIntent:
    """``intent`` asking what its claims ask (the request filter, prioritize and bind place)."""
    if not plan.gpu_count:
        return intent
    return replace(intent, gpu_count=plan.gpu_count, gpu_milli=plan.gpu_milli, gpu_memory_mib=plan.gpu_memory_mib)


class ClaimPlacement:
    """The claims' part of ``filter`` and ``prioritize`` (module notes, 2)."""

    def __init__(self, book: ResourceClaimBook) -> None:
        self._book = book

    def plan(self, intent: PodIntent) -> ClaimPlan | None:
        """``claim_plan`` on the book's view; raises ``ValueError`` as it."""
        if not intent.resource_claims:
            return None
        return claim_plan(intent, self._book.claims_of(intent.namespace, intent.resource_claims))

    def shape(self, intent: PodIntent) -> PodIntent:
        """The pod as gpufrac places it; raises ``ValueError`` (the filter's ``Error``). A pod
        that asks share is remembered for the requeue after share is freed
        (``ResourceClaimBook.refused_pods``: the cache does not count it as a pending GPU pod)."""
        plan = self.plan(intent)
        if plan is None:
            return intent
        if plan.gpu_count:
            self._book.note_waiting(intent.uid, intent.namespace, intent.name)
        return shaped(intent, plan)

    def refusals(self, pod: Mapping[str, Any], nodes: Sequence[str]) -> dict[str, str]:
        """The candidate nodes other than the one the pod's allocated claims pin it to."""
        refs = pod_claim_refs(pod)
        if not refs:
            return {}
        meta = pod.get("metadata")
        ns = meta.get("namespace") if isinstance(meta, Mapping) else None
        views = self._book.claims_of(ns if isinstance(ns, str) else "", refs)
        pinned = {n for v in views if v is not None and v.allocated for n in v.nodes}
        if len(pinned) != 1:
            return {}  # none, or a conflict the shape already refused
        (node,) = pinned
        return {n: f"gpufrac: the pod's claims are allocated on node {node}" for n in nodes if n != node}


class ClaimBinding:
    """What ``KubeBinder`` needs to bind pods whose claims gpufrac allocates (module notes, 3),
    and to count, fenced, the claims of other instances' such binds (module notes, 4)."""

    def __init__(self, placement: ClaimPlacement, writer: ClaimWriter, book: ResourceClaimBook,
                 cache: GpuCache) -> None:
        self.placement, self.writer, self.book = placement, writer, book
        self._cache = cache

    def held(self, uid: str, gpu_uuids: Sequence[str]) -> bool | None:
        """For a pod with ResourceClaims: True when the claim book counts its claims' shares on
        ``gpu_uuids`` (a fence claim of its bind is then not counted twice), else False; None
        for a pod without claims."""
        intent = self._cache.pod_intent(uid)
        if intent is None or not intent.resource_claims:
            return None
        views = self.book.claims_of(intent.namespace, intent.resource_claims)
        return set(gpu_uuids) <= {g for v in views if v is not None and v.allocated for g in v.gpus}

    def behind(self, ledger: ClaimLedger, fence: ClaimFence) -> str | None:
        """A pod another instance claimed on the ledger's node that the pod watch shows bound
        there, holding no GPU of its own (its claims do), whose claims' shares the claim book
        does not count yet: its fence claim then counts nothing (``count_claim``: bound
        without those GPUs), so binds there wait for the claim watch. Its ``namespace/name``,
        or None."""
        for c, _left in fence.live(ledger):
            if c.owner != fence.identity and self.held(c.uid, c.gpu_uuids) is False:
                intent = self._cache.pod_intent(c.uid)
                if intent is not None and intent.node_name == ledger.node:
                    return intent.key
        return None


def allocation_results(plan: ClaimPlan, node: str, devices: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """Claim UID -> the allocation results of its requests on ``devices`` (one device name
    per GPU the core chose, in order), ``consumedCapacity`` as kube-scheduler's allocator
    writes it: every capacity of the device with its request or its policy's default."""
    out: dict[str, list[dict[str, Any]]] = {}
    it = iter(devices)
    for view, ask in plan.asks:
        request = f"{ask.request}/{ask.subrequest}" if ask.subrequest else ask.request
        for _ in range(ask.count):
            out.setdefault(view.uid, []).append({
                "request": request, "driver": DRIVER, "pool": node, "device": next(it),
                "shareID": str(uuid.uuid4()),
                "consumedCapacity": {"share": str(ask.gpu_milli), "memory": f"{ask.memory_mib}Mi", "slots": "1"}})
    return out


class ClaimWriter:
    """Writes and undoes the claims of one bind (module notes, 3).

    Parameters
    ----------
    api : kubernetes.client.CoreV1Api
        Its connection pool and credentials (``podspec.kubeio.write_json``).
    node_gpus : callable (node name) -> sequence of GpuSpec or None
        ``NodeReader.gpus``: the device name of each GPU UUID.
    api_timeout_s : float
        Limit of each API call, seconds.
    """

    def __init__(self, api: client.CoreV1Api, node_gpus: Callable[[str], Sequence[GpuSpec] | None],
                 api_timeout_s: float) -> None:
        self._api = api
        self._objects = client.CustomObjectsApi(api.api_client)
        self._node_gpus = node_gpus
        self._timeout_s = api_timeout_s

    def _path(self, namespace: str, name: str, sub: str = "") -> str:
        base = "/apis/{}/{}/namespaces/{}/resourceclaims/{}".format(
            *GROUP_VERSION, urllib.parse.quote(namespace, safe=""), urllib.parse.quote(name, safe=""))
        return base + sub

    def _read(self, namespace: str, view: ClaimView) -> dict[str, Any]:
        got: dict[str, Any] = self._objects.get_namespaced_custom_object(
            *GROUP_VERSION, namespace, "resourceclaims", view.name, _request_timeout=self._timeout_s)
        if got.get("metadata", {}).get("uid") != view.uid:
            raise BindError(f"gpufrac: claim {namespace}/{view.name} was recreated; kube-scheduler retries", "conflict")
        return got

    def allocate(self, plan: ClaimPlan, pod: PodIntent, node: str, gpu_uuids: Sequence[str]) -> list[dict[str, Any]]:
        """Allocate the plan's requests on ``gpu_uuids`` of ``node`` and reserve every claim of
        the plan for the pod. Returns the claims as written (for the book and ``undo``).

        Raises
        ------
        BindError
            A claim cannot be read or written, was allocated meanwhile, or a GPU is not in
            the node's inventory; what was written before is undone.
        """
        gpus = self._node_gpus(node) or ()
        names = dict(zip((g.uuid for g in gpus), device_names([g.index for g in gpus]), strict=True))
        if any(u not in names for u in gpu_uuids):
            raise BindError(f"gpufrac: node {node}'s inventory changed under the bind; kube-scheduler retries")
        results = allocation_results(plan, node, [names[u] for u in gpu_uuids])
        written: list[dict[str, Any]] = []
        try:
            for view in plan.claims:
                obj = self._read(pod.namespace, view)
                status = dict(obj.get("status") or {})
                if view.uid in results:
                    if status.get("allocation"):
                        raise BindError(f"gpufrac: claim {pod.namespace}/{view.name} was allocated meanwhile; "
                                        "kube-scheduler retries", "conflict")
                    status["allocation"] = {"devices": {"results": results[view.uid]}, "nodeSelector": {
                        "nodeSelectorTerms": [{"matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}
                reserved = [r for r in status.get("reservedFor") or [] if isinstance(r, Mapping)]
                if any(r.get("uid") == pod.uid for r in reserved) and view.uid not in results:
                    continue
                status["reservedFor"] = [*reserved, {"resource": "pods", "name": pod.name, "uid": pod.uid}]
                finalizers = list(obj.get("metadata", {}).get("finalizers") or [])
                if FINALIZER not in finalizers:
                    obj = write_json(self._api, "PUT", self._path(pod.namespace, view.name), {
                        **obj, "metadata": {**obj["metadata"], "finalizers": [*finalizers, FINALIZER]}},
                        timeout_s=self._timeout_s)
                written.append(write_json(self._api, "PUT", self._path(pod.namespace, view.name, "/status"),
                                          {**obj, "status": status}, timeout_s=self._timeout_s))
        except ApiException as exc:
            self.undo(written, pod, set(results))
            reason = "conflict" if exc.status == 409 else "error"
            raise BindError(f"gpufrac: writing claim of pod {pod.key}: {exc.status} {exc.reason}", reason) from None
        except (BindError, OSError, ValueError, urllib3.exceptions.HTTPError) as exc:
            self.undo(written, pod, set(results))
            if isinstance(exc, BindError):
                raise
            raise BindError(f"gpufrac: writing claim of pod {pod.key}: {type(exc).__name__}") from None
        return written

    def undo(self, written: Sequence[Mapping[str, Any]], pod: PodIntent, ours: set[str]) -> list[dict[str, Any]]:
        """Remove the pod's reservation from each claim written, and the allocation of those
        gpufrac allocated for it (UIDs in ``ours``); the claims as they are left (the book
        applies them). A claim that cannot be undone is logged: the pod's next bind finds it
        allocated and reserved for it, and binds it there."""
        left = []
        for obj in written:
            status = dict(obj.get("status") or {})
            reserved = [r for r in status.get("reservedFor") or [] if r.get("uid") != pod.uid]
            status["reservedFor"] = reserved or None
            meta = obj.get("metadata", {})
            if meta.get("uid") in ours:
                status.pop("allocation", None)
            try:
                left.append(write_json(self._api, "PUT", self._path(pod.namespace, meta.get("name", ""), "/status"),
                                       {**obj, "status": status}, timeout_s=self._timeout_s))
            except (ApiException, OSError, ValueError, urllib3.exceptions.HTTPError) as exc:
                log.warning("claim %s/%s: undoing pod %s's allocation failed (%s); it stays until the pod's "
                            "next bind or its deletion", pod.namespace, meta.get("name"), pod.key, exc)
        return left
