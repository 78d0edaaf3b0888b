"""From NVML readings to the ``gpufrac.io/inventory`` the extender reads.

Pure functions plus one small stateful tracker (XID health): no API calls, no NVML calls,
so all of it is tested on ``FakeNvml`` readings.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path

from agent.nvml import GpuReading, XidEvent
from podspec.annotations import GpuInventory, NodeInventory, PodGpuUsage

GFD_REPLICAS_LABEL = "nvidia.com/gpu.replicas"
"""Label set by NVIDIA GPU Feature Discovery when time-slicing is configured."""

_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


def pod_uid_of_pid(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """The UID of the pod a process runs in, from its cgroup path; None if not in a pod.

    Both kubelet cgroup drivers are understood: cgroupfs
    (``/kubepods/burstable/pod<uid>/<container>``) and systemd
    (``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with _>.slice/...``).
    """
    try:
        text = (proc_root / str(pid) / "cgroup").read_text()
    except OSError:
        return None  # gone, or not visible from this PID namespace
    match = _POD_UID.search(text)
    return match.group(1).replace("_", "-") if match else None


def replicas_for(node_labels: Mapping[str, str], configured: int) -> int:
    """Time-slicing replicas per GPU: GFD's ``nvidia.com/gpu.replicas`` label if valid, else the config."""
    raw = node_labels.get(GFD_REPLICAS_LABEL, "")
    return int(raw) if raw.isdigit() and 1 <= int(raw) <= 1000 else configured


class HealthTracker:
    """GPU health from XID events: a fatal XID marks the GPU unhealthy until the agent restarts.

    Sticky, like NVIDIA's device plugin: a GPU that raised a fatal XID needs a reset (and an
    agent restart) before it is trusted again.
    """

    def __init__(self) -> None:
        self._reasons: dict[str, str] = {}

    def observe(self, event: XidEvent) -> bool:
        """Record an event; True if it changed a GPU's health."""
        if not event.fatal or event.uuid in self._reasons:
            return False
        self._reasons[event.uuid] = f"XID {event.xid}"
        return True

    def reason(self, uuid: str) -> str:
        """Why the GPU is unhealthy; ``""`` when healthy."""
        return self._reasons.get(uuid, "")

    def unhealthy(self) -> frozenset[str]:
        """UUIDs of the GPUs marked unhealthy."""
        return frozenset(self._reasons)


def _pod_usage(reading_processes: Iterable[tuple[int, int]],
               pod_of: Callable[[int], str | None]) -> list[PodGpuUsage]:
    per_pod: dict[str, int] = {}
    for pid, used in reading_processes:
        uid = pod_of(pid)
        if uid:
            per_pod[uid] = per_pod.get(uid, 0) + used
    return [PodGpuUsage(uid=u, memory_used_mib=m) for u, m in sorted(per_pod.items())]


def build_inventory(node: str, readings: Sequence[GpuReading], health: HealthTracker, replicas: int,
                    now: datetime, pod_of: Callable[[int], str | None] = pod_uid_of_pid) -> NodeInventory:
    """The node's inventory: one placement unit per GPU, or per MIG device in MIG mode.

    Parameters
    ----------
    node : str
    readings : sequence of GpuReading
    health : HealthTracker
    replicas : int
        Time-slicing replica slots per whole GPU (a MIG device gets 1: it is a hardware
        partition, shared only through MPS, which gpufrac does not configure per MIG device).
    now : datetime
        The heartbeat (timezone-aware).
    pod_of : callable, optional
        PID -> pod UID (default: ``pod_uid_of_pid``; injected by tests).
    """
    gpus: list[GpuInventory] = []
    for g in readings:
        reason = health.reason(g.uuid)
        if g.mig_enabled:
            for m in g.mig_devices:
                gpus.append(GpuInventory(
                    index=g.index, uuid=m.uuid, model=f"{g.name} MIG {m.profile}",
                    memory_mib=max(m.memory_total_mib, 1), memory_used_mib=m.memory_used_mib,
                    replicas=1, healthy=not reason, health_reason=reason, mig_parent=g.uuid))
            continue
        gpus.append(GpuInventory(
            index=g.index, uuid=g.uuid, model=g.name, memory_mib=max(g.memory_total_mib, 1),
            memory_used_mib=g.memory_used_mib, replicas=replicas, healthy=not reason,
            health_reason=reason, utilization_pct=min(max(g.utilization_pct, 0), 100),
            pods=_pod_usage(((p.pid, p.memory_used_mib) for p in g.processes), pod_of)))
    return NodeInventory(node=node, heartbeat=now, gpus=gpus)


def same_content(a: NodeInventory | None, b: NodeInventory) -> bool:
    """True when two inventories differ at most in the heartbeat (no need to publish early)."""
    return a is not None and a.model_copy(update={"heartbeat": b.heartbeat}) == b
