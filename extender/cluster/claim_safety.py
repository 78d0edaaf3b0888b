"""Which nodes kube-scheduler's DRA allocator would over-commit for a pod's claims.

kube-scheduler allocates a claim of ``gpu.gpufrac.io`` on the node it chose (gpufrac's
filter among them) with its own allocator: per request, the first device in the slice's order
(``podspec.claims.device_names``: index order) that matches and whose capacity left, counting
*claims only*, fits the request (KEP-5075). It does not see annotation pods. gpufrac's book
holds both, so for a pod whose claims are not allocated yet it can replay that choice on each
candidate node and refuse the nodes where a device the allocator may take has no real room:
a GPU annotation pods fill would otherwise be given to the claim.

- Any healthy device whose claims-only capacity left (share, memory, a slot) fits a request
  may be taken, not only the first: kube-scheduler's view of the claims may lag gpufrac's (a
  deallocation gpufrac has seen and it has not makes it skip the device gpufrac would predict;
  the real node e2e caught exactly that when first fit was replayed), and CEL selectors, which
  gpufrac does not evaluate, narrow the devices. Each such device must have the real room
  (``GpuRoom``) for what the pod's requests could put there, up to that capacity.
- Unhealthy GPUs are not in the slice: never taken.

What this cannot see: a claim kube-scheduler allocated whose status the claim watch has not
delivered yet (the window is the watch's lag), and annotation pods bound by another gpufrac
replica not yet in this one's book.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from extender.cache import GpuRoom
from podspec.claims import DeviceAsk, device_names
from scoring.request import MILLI_PER_GPU

Consumed = Mapping[str, tuple[int, int, int]]
"""Device name -> (milli, memory MiB, claims) the claims allocated on a node's devices hold, as
the allocator counts them (their ``consumedCapacity``)."""


def refusal(asks: Sequence[DeviceAsk], gpus: Sequence[GpuRoom], consumed: Consumed) -> str:
    """Why the allocator could over-commit one node for ``asks`` (``""``: it could not).

    Every healthy device with the claims-only capacity left for one of the asks is one the
    allocator may take (module notes: its view of the claims may lag gpufrac's, so its first
    fit is not predicted); each must have the real room for all the asks it could take, up to
    its claims-only capacity.

    Parameters
    ----------
    asks : sequence of DeviceAsk
        The pod's unallocated claims' requests of the driver, in order.
    gpus : sequence of GpuRoom
        The node's GPUs in index order (``GpuCache.gpu_rooms``).
    consumed : mapping
        The claims' consumption on the node's devices (``Consumed``).

    Returns
    -------
    str
        The reason, naming the device and the GPU, for kube-scheduler's FailedNodes.
    """
    names = device_names([g.index for g in gpus])
    for n, g in zip(names, gpus, strict=True):
        if not g.healthy:
            continue
        milli, mem, count = consumed.get(n, (0, 0, 0))
        left = (MILLI_PER_GPU - milli, g.memory_mib - mem, g.replicas - count)
        could = [a for a in asks if a.gpu_milli <= left[0] and a.memory_mib <= left[1] and left[2] >= 1]
        if not could:
            continue
        need = (min(left[0], sum(a.gpu_milli for a in could)), min(left[1], sum(a.memory_mib for a in could)),
                min(left[2], len(could)))
        if not _room(g, need):
            return _message(n, g, max(a.gpu_milli for a in could))
    return ""


def _room(gpu: GpuRoom, need: Sequence[int]) -> bool:
    return gpu.free_milli >= need[0] and gpu.memory_free_mib >= need[1] and gpu.slots_free >= need[2]


def _message(device: str, gpu: GpuRoom, milli: int) -> str:
    return (f"gpufrac: kube-scheduler's DRA allocator may take device {device} (GPU {gpu.uuid}) for this pod's "
            f"claim, {milli} milli, where annotation pods leave {gpu.free_milli} milli, "
            f"{gpu.memory_free_mib} MiB and {gpu.slots_free} slot(s) free")
