"""The node's GPUs as a Dynamic Resource Allocation ResourceSlice (``resource.k8s.io/v1``).

One slice per node, one pool per node (named after it), for the driver ``gpu.gpufrac.io``:
each healthy GPU of the inventory is a device that several claims may share
(``allowMultipleAllocations``, consumable capacity: KEP-5075, beta and on by default in
Kubernetes 1.36). A GPU that NVML reports unhealthy leaves the slice, so no new claim is
allocated on it; the claims it holds keep their allocation. Per device:

- ``name``: ``gpu-<index>`` (NVML index), ``gpu-<index>-<k>`` for the MIG devices of one GPU
  (``podspec.claims.device_names``: unique in the pool, a DNS label);
- ``attributes``: ``uuid``, ``model`` (what ``gpufrac.io/gpu-model`` matches), ``index``,
  ``migParent`` for a MIG device;
- ``capacity``: ``share`` in milli-GPU (1000), ``memory`` (the GPU's, MiB) and ``slots`` (its
  time-slicing replicas), each with a ``requestPolicy`` whose range is the pod API's:
  a share of 1 to 1000 milli (``gpufrac.io/fraction`` 0.001 to 1, default a whole GPU), memory
  of 1 MiB to the GPU's (default 1 MiB: memory is what a claim asks for, not implied by its
  share), and one slot per claim.

The pool's ``generation`` is the caller's: bumped by the publisher whenever the devices change,
so a consumer reading slices of two generations keeps the newest (the API's rule).
Sources: ``k8s.io/api/resource/v1`` (``ResourceSliceSpec``, ``Device``, ``DeviceCapacity``,
``CapacityRequestPolicy``), KEP-4381 and KEP-5075.
"""

from __future__ import annotations

from typing import Any

from podspec.annotations import NodeInventory
from podspec.claims import DEFAULT_MEMORY_MIB, DRIVER, device_names

SHARE_MILLI = 1000
"""A GPU's share capacity, milli-GPU (``scoring.request.MILLI_PER_GPU``)."""


def slice_name(node: str) -> str:
    """The one ResourceSlice of ``node`` (object names allow 253 characters; nodes' too, so the
    suffix is kept short and the name cut from the left where it must be)."""
    return f"{node}-gpufrac"[-253:].lstrip("-.")


def devices(inventory: NodeInventory) -> list[dict[str, Any]]:
    """The healthy GPUs of ``inventory`` as ResourceSlice devices (module notes), by index."""
    out = []
    gpus = sorted(inventory.gpus, key=lambda g: g.index)
    for name, gpu in zip(device_names([g.index for g in gpus]), gpus, strict=True):
        if not gpu.healthy:
            continue
        attributes: dict[str, dict[str, Any]] = {
            "uuid": {"string": gpu.uuid}, "model": {"string": gpu.model}, "index": {"int": gpu.index}}
        if gpu.mig_parent:
            attributes["migParent"] = {"string": gpu.mig_parent}
        memory = f"{gpu.memory_mib}Mi"
        out.append({
            "name": name,
            "allowMultipleAllocations": True,
            "attributes": attributes,
            "capacity": {
                "share": {"value": str(SHARE_MILLI), "requestPolicy": {
                    "default": str(SHARE_MILLI), "validRange": {"min": "1", "max": str(SHARE_MILLI), "step": "1"}}},
                "memory": {"value": memory, "requestPolicy": {
                    "default": f"{DEFAULT_MEMORY_MIB}Mi", "validRange": {"min": "1Mi", "max": memory, "step": "1Mi"}}},
                "slots": {"value": str(gpu.replicas), "requestPolicy": {
                    "default": "1", "validRange": {"min": "1", "max": "1"}}},
            },
        })
    return out


def resource_slice(inventory: NodeInventory, generation: int, node_uid: str | None = None) -> dict[str, Any]:
    """The node's ResourceSlice object.

    Parameters
    ----------
    inventory : NodeInventory
        What the agent read through NVML (``agent.inventory.build_inventory``).
    generation : int
        The pool's generation, >= 0 (module notes).
    node_uid : str, optional
        The Node's UID: the slice is owned by it and goes when the node is deleted.

    Returns
    -------
    dict
        A ``resource.k8s.io/v1`` ResourceSlice, ready to create or replace.
    """
    meta: dict[str, Any] = {"name": slice_name(inventory.node),
                            "labels": {"app.kubernetes.io/managed-by": "gpufrac-agent"}}
    if node_uid:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": inventory.node, "uid": node_uid}]
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": meta,
        "spec": {"driver": DRIVER, "nodeName": inventory.node,
                 "pool": {"name": inventory.node, "generation": generation, "resourceSliceCount": 1},
                 "devices": devices(inventory)},
    }
