"""Which nodes kube-scheduler's DRA allocator would over-commit for a pod's claims.

kube-scheduler allocates a claim of ``gpu.gpufrac.io`` on the node it chose (gpufrac's
filter among them) with its own allocator: per request, the first device in the slice's order
(``podspec.claims.device_names``: index order) that matches and whose capacity left, counting
*claims only*, fits the request (KEP-5075). It does not see annotation pods. gpufrac's book
holds both, so for a pod whose claims are not allocated yet it can replay that choice on each
candidate node and refuse the nodes where the device the allocator would take has no real
room: a GPU annotation pods fill would otherwise be given to the claim.

- A request without selectors takes ``count`` distinct devices first-fit, in slice order, on
  the claims-only capacity left (share, memory, one slot each), the pod's earlier requests
  included; each device it takes must have the real room (``GpuRoom``) for all the pod put
  there.
- A request with CEL selectors (gpufrac does not evaluate them) may take any device with the
  claims-only capacity: each such device must have the real room for it.
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
    """Why the allocator would over-commit one node for ``asks`` (``""``: it would not).

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
    devices = [(n, g) for n, g in zip(names, gpus, strict=True) if g.healthy]
    left = {}
    for n, g in devices:
        milli, mem, count = consumed.get(n, (0, 0, 0))
        left[n] = [MILLI_PER_GPU - milli, g.memory_mib - mem, g.replicas - count]
    put: dict[str, list[int]] = {}

    def fits(n: str, ask: DeviceAsk) -> bool:
        room = left[n]
        return room[0] >= ask.gpu_milli and room[1] >= ask.memory_mib and room[2] >= 1

    def with_ask(n: str, ask: DeviceAsk) -> list[int]:
        """What the pod would have put on device ``n`` with one device of ``ask`` more."""
        got = put.get(n, [0, 0, 0])
        return [got[0] + ask.gpu_milli, got[1] + ask.memory_mib, got[2] + 1]

    def take(n: str, ask: DeviceAsk) -> None:
        put[n] = with_ask(n, ask)
        for i, v in enumerate((ask.gpu_milli, ask.memory_mib, 1)):
            left[n][i] -= v

    for ask in asks:
        if ask.selectors:
            for n, g in devices:
                if fits(n, ask) and not _room(g, with_ask(n, ask)):
                    return _message(n, g, ask.gpu_milli, "its selectors may take")
            continue
        taken: set[str] = set()
        for _ in range(ask.count):
            pick = next((n for n, _g in devices if n not in taken and fits(n, ask)), None)
            if pick is None:
                break  # the allocator cannot serve it here: kube-scheduler's own filter says so
            taken.add(pick)
            take(pick, ask)
    for n, g in devices:
        if n in put and not _room(g, put[n]):
            return _message(n, g, put[n][0], "would take")
    return ""


def _room(gpu: GpuRoom, need: Sequence[int]) -> bool:
    return gpu.free_milli >= need[0] and gpu.memory_free_mib >= need[1] and gpu.slots_free >= need[2]


def _message(device: str, gpu: GpuRoom, milli: int, verb: str) -> str:
    return (f"gpufrac: kube-scheduler's DRA allocator {verb} device {device} (GPU {gpu.uuid}) for this pod's "
            f"claim, {milli} milli, where annotation pods leave {gpu.free_milli} milli, "
            f"{gpu.memory_free_mib} MiB and {gpu.slots_free} slot(s) free")
