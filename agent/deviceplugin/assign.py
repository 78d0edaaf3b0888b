"""Which pod an ``Allocate`` call is for, and what its container gets.

kubelet's ``Allocate`` names device IDs, not the pod. The match (pure logic, no gRPC):

- Candidates are the pods bound to this node that carry gpufrac's allocation record
  (``gpufrac.io/assigned-gpus``), are not finished and have no container started yet, in
  the order kubelet admits new pods: ``metadata.creationTimestamp``, then namespace/name
  (``HandlePodAdditions`` sorts by creation time; kubelet allocates devices during
  admission, one pod at a time, its containers in spec order).
- A pod whose containers are being allocated is continued first: its next GPU container
  must ask for exactly the number of devices in the call. Otherwise the first candidate
  not yet allocated whose first GPU container asks for that number is taken.
- Each pod's record is consumed once per container: two pods with identical requests never
  receive the same assignment, and the containers of one pod receive consecutive slices of
  its assigned GPUs (container i gets the GPUs after those of containers 0..i-1).

The one case the order cannot settle is two candidates created in the same second, which
kubelet may admit in either order; their requests are then identical in size, and gpufrac
writes nothing back, so at worst they exchange GPUs whose share and memory gpufrac counted
for the other (docs/agent.md, "Device plugin").
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from podspec import annotations as ann
from podspec.pods import pod_intent


@dataclass(frozen=True, slots=True)
class PodAssignment:
    """One pod's allocation record, as needed to answer ``Allocate`` for its containers."""

    uid: str
    key: str
    order: tuple[str, str]
    """(creationTimestamp, namespace/name): kubelet's admission order."""
    container_gpus: tuple[int, ...]
    """``gpufrac.io/gpu`` per container that asks for it, in spec order."""
    gpu_uuids: tuple[str, ...]
    gpu_milli: int
    gpu_memory_mib: tuple[int, ...]

    def slice_for(self, container: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """UUIDs and memory (MiB) of the ``container``-th GPU container."""
        start = sum(self.container_gpus[:container])
        end = start + self.container_gpus[container]
        mem = self.gpu_memory_mib or (0,) * len(self.gpu_uuids)
        return self.gpu_uuids[start:end], mem[start:end]


def candidates(pods: Iterable[Mapping[str, Any]], node: str) -> list[PodAssignment]:
    """Pods on ``node`` waiting for their GPU containers to be allocated, in admission order."""
    out = []
    for pod in pods:
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        if spec.get("nodeName") != node or status.get("containerStatuses"):
            continue
        try:
            intent = pod_intent(pod)
        except ValueError:
            continue
        if intent.finished or not intent.assigned_gpus:
            continue
        per_container = tuple(
            int(str(((c.get("resources") or {}).get("limits") or {}).get(ann.RESOURCE_GPU, "0")))
            for c in spec.get("containers") or [])
        per_container = tuple(n for n in per_container if n > 0)
        if sum(per_container) != len(intent.assigned_gpus):
            continue  # record does not match the request: not something gpufrac wrote
        created = str((pod.get("metadata") or {}).get("creationTimestamp") or "")
        out.append(PodAssignment(intent.uid, intent.key, (created, intent.key), per_container,
                                 intent.assigned_gpus, intent.assigned_gpu_milli or intent.gpu_milli,
                                 intent.assigned_memory_mib))
    return sorted(out, key=lambda a: a.order)


def pick(n_devices: int, pods: Sequence[PodAssignment], done: Mapping[str, int]) -> tuple[PodAssignment, int] | None:
    """The pod and GPU container an ``n_devices`` request is for, given the containers already
    allocated (``done``: pod UID -> count); None when no candidate matches (module notes)."""
    for a in pods:  # a pod in progress first
        i = done.get(a.uid, 0)
        if 0 < i < len(a.container_gpus) and a.container_gpus[i] == n_devices:
            return a, i
    for a in pods:
        if a.uid not in done and a.container_gpus[0] == n_devices:
            return a, 0
    return None


class Matcher:
    """Consumes pod assignments container by container (kubelet's Allocate sequence).

    Not thread-safe: the plugin holds ``lock`` around ``take_all`` and ``snapshot`` (one lock
    per matcher, so servers that share a matcher share it).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._done: dict[str, int] = {}
        """Pod UID -> GPU containers already allocated."""

    def snapshot(self) -> dict[str, int]:
        """The containers allocated so far, per pod UID (a copy: ``pick`` reads it outside the lock)."""
        return dict(self._done)

    def take_all(self, sizes: Sequence[int], pods: Sequence[PodAssignment]) -> list[tuple[PodAssignment, int]] | None:
        """Match one Allocate call's containers (``sizes``: devices each) and consume them, all
        or nothing: None, and nothing consumed, when any container matches no candidate (a
        failed call must not use up the records of the pods waiting for their real Allocate).

        Entries of pods no longer among ``pods`` (started, finished, gone) are dropped first,
        so the record of consumed containers stays as small as the node's waiting pods.
        """
        live = {a.uid for a in pods}
        for uid in [u for u in self._done if u not in live]:
            del self._done[uid]
        scratch = dict(self._done)
        found: list[tuple[PodAssignment, int]] = []
        for n in sizes:
            match = pick(n, pods, scratch)
            if match is None:
                return None
            scratch[match[0].uid] = match[1] + 1
            found.append(match)
        self._done = scratch
        return found


def container_env(uuids: Sequence[str], gpu_milli: int, memory_mib: Sequence[int]) -> dict[str, str]:
    """Environment for a container given ``uuids`` at ``gpu_milli`` share.

    ``NVIDIA_VISIBLE_DEVICES`` selects the GPUs (NVIDIA container runtime). Below a whole
    GPU the MPS client limits apply (NVIDIA MPS documentation, "Environment variables"):
    ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` = share in percent (at least 1), and
    ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` = ``<visible index>=<MiB>M`` per GPU.
    """
    env = {"NVIDIA_VISIBLE_DEVICES": ",".join(uuids), "GPUFRAC_ASSIGNED_GPUS": ",".join(uuids)}
    if gpu_milli < 1000:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, gpu_milli // 10))
        if any(memory_mib):
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(f"{i}={m}M" for i, m in enumerate(memory_mib))
    return env


MPS_CONTAINER_DIR = "/run/gpufrac/mps"
"""Where a container below a whole GPU finds the MPS control daemon's pipe directory."""


def container_mps(gpu_milli: int, pipe_dir: str | None) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """What connects a container below a whole GPU to the node's MPS control daemon.

    The daemon and its clients meet in the daemon's pipe directory
    (``CUDA_MPS_PIPE_DIRECTORY``, NVIDIA MPS documentation, "Environment variables"); the
    plugin mounts the host's directory into the container and points the variable at it, as
    NVIDIA's k8s-device-plugin does for its MPS sharing.

    Parameters
    ----------
    gpu_milli : int
        The container's share per GPU, milli-GPU.
    pipe_dir : str or None
        The daemon's pipe directory on the host; None when the node runs no daemon.

    Returns
    -------
    env : dict of str to str
    mounts : list of (container path, host path)
        Both empty for a whole GPU or without a daemon.
    """
    if pipe_dir is None or gpu_milli >= 1000:
        return {}, []
    return {"CUDA_MPS_PIPE_DIRECTORY": MPS_CONTAINER_DIR}, [(MPS_CONTAINER_DIR, pipe_dir)]

