"""kube-scheduler's DRA allocator inside a node, emulated for the replay (issue 54).

Under Dynamic Resource Allocation a scheduler extender still chooses the node, but the devices
on it are chosen by kube-scheduler's own allocator (the ``DynamicResources`` plugin, its
structured allocator in ``k8s.io/dynamic-resource-allocation/structured``): for each request,
the first device, in the order of the driver's ResourceSlice, that matches the request and
has its capacity left (consumable capacity, KEP-5075). The only lever a driver has is that
order. ``FirstFitDevicesClient`` replays this: gpufrac's filter and prioritize choose the node
as they always do; the GPUs on it are the first ``num_gpu`` on which the pod fits, in the
node's inventory order (the order an agent publishes); and the allocation reaches gpufrac the
way every allocation it did not choose does, through the pod watch (the pod bound, with its
allocation record), so gpufrac's book counts it and scores the next pod against it.

"Fits" is gpufrac's own feasibility (``scoring.fit.fit``: share, GPU memory, replica slots,
model, health and QoS isolation). The DRA allocator checks only what the driver publishes as
capacity (share, memory, slots), so the emulation, if anything, spares first fit the
placements that isolation would refuse.

Chosen per policy by a ``+dra-first-fit`` suffix (``default+dra-first-fit``), in process only
(``--in-process``): over HTTP, gpufrac's bind chooses the GPUs.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np

from benchmarks.extender_client import InProcessClient
from extender.admin_config import AdminConfig
from extender.translate import inbound
from podspec.pods import allocation_annotations, pod_intent
from scoring.fit import fit
from scoring.specs import NodeSpec

SUFFIX = "+dra-first-fit"
"""Appended to a preset name: the devices on the chosen node are taken first fit."""

BOUND_AT = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
"""The ``assigned-at`` of every emulated allocation (a replay has no wall clock to record)."""


def split_device_choice(policy: str) -> tuple[str, bool]:
    """``POLICY+dra-first-fit`` -> (``POLICY``, True); any other name -> (it, False)."""
    if policy.endswith(SUFFIX):
        return policy[: -len(SUFFIX)], True
    return policy, False


class FirstFitDevicesClient(InProcessClient):
    """``InProcessClient`` whose bind takes the first GPUs that fit on the chosen node (module notes)."""

    def __init__(self, specs: list[NodeSpec], policy: AdminConfig, decision: str = "filter") -> None:
        super().__init__(specs, policy, decision)
        self.qos_policy = policy.scoring.qos

    def bind(self, pod: dict[str, Any], node: str) -> str:
        """Allocate the first fitting GPUs on ``node`` and report the pod bound with them.

        Returns the ``Error`` string, empty on success, as ``InProcessClient.bind``; a pod
        asking no GPU is bound by gpufrac's own bind (there is no device to choose).
        """
        intent = pod_intent(pod)
        if not intent.gpu_count:
            return super().bind(pod, node)
        state = self.cache.state_copy()
        row = state.node_index.get(node)
        if row is None:
            return f"dra-first-fit: node {node!r} unknown"
        request = inbound.pod_request(intent, state)
        ctx = fit(state, request, np.array([row], dtype=np.int64), self.qos_policy)
        cols = np.flatnonzero(ctx.gpu_fits[0])[: request.gpu_count]
        if not ctx.node_fits[0] or cols.shape[0] < request.gpu_count:
            return f"dra-first-fit: pod {intent.key} fits no {request.gpu_count} GPU(s) of {node}"
        uuids = [state.gpu_uuid[row][int(c)] for c in cols]
        memory_mib = [int(m) for m in ctx.mem_req_mib[0, cols]]
        meta = pod["metadata"]
        bound = {**pod, "metadata": {**meta, "annotations": {
                     **(meta.get("annotations") or {}),
                     **allocation_annotations(uuids, request.gpu_milli, memory_mib, BOUND_AT)}},
                 "spec": {**pod["spec"], "nodeName": node}, "status": {"phase": "Running"}}
        self.pod_events([{"type": "MODIFIED", "object": bound}])
        if not self.cache.shows_bound(intent.uid, node, uuids):
            return f"dra-first-fit: pod {intent.key} on {node} {uuids} was not counted"
        return ""
