"""Bounded reading of a ResourceClaim's allocation (``resource.k8s.io/v1``) for gpufrac's driver.

A claim's status is written by whoever allocated it (kube-scheduler's allocator, gpufrac, or
anyone with the right to its ``status``), so it is read as untrusted input: every field a
result of ``gpu.gpufrac.io`` carries is checked and bounded before it names a GPU or sizes a
share, and the first bad one refuses the whole claim with a ``PodSpecError`` that names the
field. Results of other drivers are skipped (they are not gpufrac's to read).

Per result of the driver (``status.allocation.devices.results[i]``):

- ``request``, ``pool``, ``device``: strings (the request name may be ``<request>/<subrequest>``);
- ``shareID``: optional, a string of at most 64 characters (KEP-5075: set when the device
  allows multiple allocations);
- ``consumedCapacity``: optional; ``share`` in milli-GPU (1 to 1000) and ``memory`` (bytes, at
  most ``MAX_GPU_MEMORY_MIB``, read in MiB rounded up). A result without ``share`` holds the
  device whole (1000): that is what an allocation means where the device cannot be shared
  (``DRAConsumableCapacity`` off). Without ``memory``, no memory limit.

Sources: ``k8s.io/api/resource/v1`` (``ResourceClaimStatus``, ``AllocationResult``,
``DeviceRequestAllocationResult``), KEP-4381, KEP-5075.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from podspec.quantities import (
    MAX_GPU_MEMORY_MIB,
    MAX_GPUS_PER_POD,
    MAX_NAME_CHARS,
    MIB,
    PodSpecError,
    bounded_text,
    quantity,
    quote,
)
from scoring.request import MILLI_PER_GPU

DRIVER = "gpu.gpufrac.io"
"""gpufrac's DRA driver name: a DNS subdomain gpufrac owns (its annotations' domain)."""

DEFAULT_MEMORY_MIB = 1
"""The slice's ``requestPolicy`` default for ``memory`` (``agent.dra.slice``): a claim that asks
no memory is allocated this much. gpufrac reads it as "no memory asked": the share's part of
the GPU's memory counts in the book and bounds the MPS limit, as for a pod without
``gpufrac.io/memory``."""

def asked_memory_mib(memory_mib: int) -> int | None:
    """The GPU memory a claim's request or result holds, MiB; None where it asked none
    (``DEFAULT_MEMORY_MIB`` or less): then the share's part of the GPU's memory is what it
    holds, as for a pod without ``gpufrac.io/memory`` (``scoring.fit.gpu_memory_request_mib``)."""
    return memory_mib if memory_mib > DEFAULT_MEMORY_MIB else None


MAX_RESULTS = 32
"""Results one claim may hold (``resource.k8s.io/v1`` ``AllocationResultsMaxSize``)."""
MAX_SHARE_ID_CHARS = 64

CLAIM_RECORD_PREFIX = "resourceclaim/"
"""The UID of a claim's device share in the extender's book is ``resourceclaim/<claim UID>/<n>``:
never a pod's UID (those are RFC 4122 UUIDs), so a pod list never forgets it."""


def device_names(indices: Sequence[int]) -> list[str]:
    """The DRA device name of each GPU of a node's inventory, given their NVML indices in
    inventory order (sorted by index).

    ``gpu-<index>``; where several GPUs share an index (the MIG devices of one GPU, listed
    under its index), ``gpu-<index>-<k>``, ``k`` counting them from 0 in inventory order.
    Names are DNS labels, unique in the node's pool, and computed over every GPU, healthy or
    not, so a GPU turning unhealthy renames no other. The agent's ResourceSlice, its kubelet
    plugin and the extender's claim book all name devices by this function.
    """
    counts = Counter(indices)
    seen: Counter[int] = Counter()
    names = []
    for index in indices:
        if counts[index] == 1:
            names.append(f"gpu-{index}")
        else:
            names.append(f"gpu-{index}-{seen[index]}")
            seen[index] += 1
    return names


@dataclass(frozen=True, slots=True)
class DeviceShare:
    """One device of the driver allocated to a claim, and how much of it."""

    request: str
    pool: str
    device: str
    gpu_milli: int
    """Share of the GPU, milli-GPU, 1..1000."""
    memory_mib: int
    """GPU memory asked, MiB; 0: no limit."""
    share_id: str | None


@dataclass(frozen=True, slots=True)
class ClaimAllocation:
    """What a claim holds of the driver's devices."""

    namespace: str
    name: str
    uid: str
    devices: tuple[DeviceShare, ...]


def _mapping(value: object, field: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise PodSpecError(f"{field}: {quote(value)} must be an object")
    return value


def device_share(result: Mapping[str, Any], field: str) -> DeviceShare:
    """One allocation result of the driver (module notes).

    Raises
    ------
    PodSpecError
        A field is missing, of the wrong type, too long or out of range.
    """
    request = bounded_text(result.get("request"), f"{field}.request", 2 * 63 + 1)
    pool = bounded_text(result.get("pool"), f"{field}.pool")
    device = bounded_text(result.get("device"), f"{field}.device", 63)
    share_id = result.get("shareID")
    if share_id is not None:
        share_id = bounded_text(share_id, f"{field}.shareID", MAX_SHARE_ID_CHARS)
    consumed = _mapping(result.get("consumedCapacity"), f"{field}.consumedCapacity")
    gpu_milli = MILLI_PER_GPU
    if "share" in consumed:
        q = quantity(consumed["share"], f"{field}.consumedCapacity.share", maximum=MILLI_PER_GPU, positive=True)
        if q != q.to_integral_value():
            raise PodSpecError(f"{field}.consumedCapacity.share: {quote(consumed['share'])} must be whole milli-GPU")
        gpu_milli = int(q)
    memory_mib = 0
    if "memory" in consumed:
        q = quantity(consumed["memory"], f"{field}.consumedCapacity.memory", maximum=MAX_GPU_MEMORY_MIB * MIB)
        memory_mib = int(-(-q // MIB))
    return DeviceShare(request, pool, device, gpu_milli, memory_mib, share_id)


def claim_allocation(claim: Mapping[str, Any], driver: str) -> ClaimAllocation:
    """The devices of ``driver`` that ``claim`` (a ResourceClaim object) is allocated.

    Parameters
    ----------
    claim : mapping
        The object as the API server returns it (JSON).
    driver : str
        The DRA driver whose results are read; others are skipped.

    Returns
    -------
    ClaimAllocation
        ``devices`` empty when the claim is not allocated or holds none of the driver's.

    Raises
    ------
    PodSpecError
        The metadata or a result of ``driver`` is malformed, or more than ``MAX_RESULTS``.
    """
    meta = _mapping(claim.get("metadata"), "metadata")
    namespace = bounded_text(meta.get("namespace"), "metadata.namespace", 63)
    name = bounded_text(meta.get("name"), "metadata.name")
    uid = bounded_text(meta.get("uid"), "metadata.uid", 64)
    status = _mapping(claim.get("status"), "status")
    allocation = _mapping(status.get("allocation"), "status.allocation")
    results = _mapping(allocation.get("devices"), "status.allocation.devices").get("results") or []
    field = "status.allocation.devices.results"
    if not isinstance(results, list):
        raise PodSpecError(f"{field}: must be a list")
    if len(results) > MAX_RESULTS:
        raise PodSpecError(f"{field}: {len(results)} results, more than the API's {MAX_RESULTS}")
    shares = []
    for i, result in enumerate(results):
        result = _mapping(result, f"{field}[{i}]")
        if result.get("driver") == driver:
            shares.append(device_share(result, f"{field}[{i}]"))
    return ClaimAllocation(namespace, name, uid, tuple(shares))


DEVICE_CLASS = DRIVER
"""The DeviceClass the chart ships for the driver (``templates/dra.yaml``): a request naming it
asks for devices of ``DRIVER``."""

MAX_POD_CLAIMS = 32
"""Claims one pod may name (``core/v1`` ``MaxPodResourceClaims``)."""


@dataclass(frozen=True, slots=True)
class DeviceAsk:
    """One request (or ``firstAvailable`` subrequest) of a claim for ``DEVICE_CLASS``, as
    kube-scheduler's allocator reads it."""

    request: str
    count: int
    """Devices asked, 1..``MAX_GPUS_PER_POD`` (``allocationMode: ExactCount``)."""
    gpu_milli: int
    """Share asked per device, milli-GPU (the capacity's default, a whole GPU, when absent)."""
    memory_mib: int
    """Memory asked per device, MiB rounded up (the default, 1 MiB, when absent)."""
    selectors: bool
    """The request narrows devices with CEL selectors gpufrac does not evaluate."""
    subrequest: str = ""
    """The ``firstAvailable`` subrequest it is, ``""`` for an ``exactly`` request (an
    allocation result names ``<request>/<subrequest>``)."""


def _ask(ask: Mapping[str, Any], request: str, field: str) -> DeviceAsk:
    mode = ask.get("allocationMode", "ExactCount")
    if mode != "ExactCount":
        raise PodSpecError(f"{field}.allocationMode: {quote(mode)}: gpufrac's GPUs are asked by count")
    count = ask.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_GPUS_PER_POD:
        raise PodSpecError(f"{field}.count: {quote(count)} must be 1 to {MAX_GPUS_PER_POD}")
    capacity = _mapping(_mapping(ask.get("capacity"), f"{field}.capacity").get("requests"),
                        f"{field}.capacity.requests")
    gpu_milli = MILLI_PER_GPU
    if "share" in capacity:
        q = quantity(capacity["share"], f"{field}.capacity.requests.share", maximum=MILLI_PER_GPU, positive=True)
        gpu_milli = int(-(-q // 1))
    memory_mib = DEFAULT_MEMORY_MIB
    if "memory" in capacity:
        q = quantity(capacity["memory"], f"{field}.capacity.requests.memory", maximum=MAX_GPU_MEMORY_MIB * MIB)
        memory_mib = max(1, int(-(-q // MIB)))
    return DeviceAsk(request, count, gpu_milli, memory_mib, bool(ask.get("selectors")))


def device_asks(claim: Mapping[str, Any]) -> tuple[DeviceAsk, ...]:
    """What a ResourceClaim (or a template's ``spec``, wrapped as a claim) asks of
    ``DEVICE_CLASS``: one ``DeviceAsk`` per request naming it; a ``firstAvailable`` request
    counts by its first subrequest naming it (the allocator tries that one first).

    Raises
    ------
    PodSpecError
        A request of the class is malformed or out of range (the field named).
    """
    spec = _mapping(claim.get("spec"), "spec")
    requests = _mapping(spec.get("devices"), "spec.devices").get("requests") or []
    if not isinstance(requests, list) or len(requests) > MAX_RESULTS:
        raise PodSpecError(f"spec.devices.requests: must be a list of at most {MAX_RESULTS}")
    asks = []
    for i, raw in enumerate(requests):
        field = f"spec.devices.requests[{i}]"
        req = _mapping(raw, field)
        name = bounded_text(req.get("name"), f"{field}.name", 63)
        subs = req.get("firstAvailable")
        if subs is not None:
            if not isinstance(subs, list) or len(subs) > MAX_RESULTS:
                raise PodSpecError(f"{field}.firstAvailable: must be a list of at most {MAX_RESULTS}")
            for j, sub in enumerate(subs):
                sub = _mapping(sub, f"{field}.firstAvailable[{j}]")
                if sub.get("deviceClassName") == DEVICE_CLASS:
                    got = _ask(sub, name, f"{field}.firstAvailable[{j}]")
                    sub_name = bounded_text(sub.get("name"), f"{field}.firstAvailable[{j}].name", 63)
                    asks.append(replace(got, subrequest=sub_name))
                    break
            continue
        exactly = _mapping(req.get("exactly"), f"{field}.exactly")
        if exactly.get("deviceClassName") == DEVICE_CLASS:
            asks.append(_ask(exactly, name, f"{field}.exactly"))
    return tuple(asks)


def pod_claim_refs(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """The ResourceClaims a Pod uses, by name, one per readable ``spec.resourceClaims`` entry:
    its ``resourceClaimName``, or for a claim made from a template the name in
    ``status.resourceClaimStatuses``, ``""`` until kube-controller-manager made it. Unreadable
    entries are skipped; at most ``MAX_POD_CLAIMS``."""
    spec = pod.get("spec")
    entries = spec.get("resourceClaims") if isinstance(spec, Mapping) else None
    if not isinstance(entries, list):
        return ()
    status = pod.get("status")
    made = status.get("resourceClaimStatuses") if isinstance(status, Mapping) else None
    generated = {s.get("name"): s.get("resourceClaimName") for s in (made if isinstance(made, list) else [])
                 [:MAX_POD_CLAIMS] if isinstance(s, Mapping)}
    names = []
    for entry in entries[:MAX_POD_CLAIMS]:
        if not isinstance(entry, Mapping):
            continue
        name = entry.get("resourceClaimName") or generated.get(entry.get("name")) or ""
        if isinstance(name, str) and len(name) <= MAX_NAME_CHARS:
            names.append(name)
    return tuple(names)


def pod_claim_names(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """``pod_claim_refs`` without the claims not made yet."""
    return tuple(n for n in pod_claim_refs(pod) if n)


def other_requests(claim: Mapping[str, Any]) -> int:
    """How many requests of a ResourceClaim ask for devices of another class than
    ``DEVICE_CLASS`` (no subrequest of it names the class); 0 when unreadable (``device_asks``
    then says why)."""
    spec = claim.get("spec")
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    if not isinstance(requests, list):
        return 0
    other = 0
    for req in requests[:MAX_RESULTS]:
        if not isinstance(req, Mapping):
            continue
        subs = req.get("firstAvailable")
        options = subs if isinstance(subs, list) else [req.get("exactly")]
        other += not any(isinstance(o, Mapping) and o.get("deviceClassName") == DEVICE_CLASS for o in options)
    return other
