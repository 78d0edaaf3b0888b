"""Publish the node's inventory as the ``gpufrac.io/inventory`` annotation, with a heartbeat.

Writes when something changed (at most every ``min_interval_s``; a health change at once)
and at least every ``heartbeat_s`` so the extender can tell a live agent from a dead one
(``--inventory-stale-after-s`` there must exceed ``heartbeat_s`` here, with margin). API
errors are retried with bounded exponential backoff; NVML is read fresh for each write.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes.client.rest import ApiException

from agent.inventory import (
    HealthTracker,
    build_inventory,
    pod_uid_of_pid,
    replicas_for,
    same_content,
)
from agent.metrics import AgentMetrics
from agent.nvml import GpuReading, NvmlBackend
from podspec.annotations import INVENTORY, NodeInventory, dump_inventory
from podspec.kubeio import drain, response_json

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PublishOptions:
    """Timing and defaults of the agent; seconds.

    Attributes
    ----------
    replicas : int
        Time-slicing replicas per GPU unless the node has GFD's ``nvidia.com/gpu.replicas``.
    heartbeat_s : float
        Longest time between two writes.
    min_interval_s : float
        Shortest time between two writes for ordinary changes (memory used, processes).
    backoff_max_s : float
        Longest wait between retries after an API error (from 0.5 s, doubling).
    proc_root : Path
        Where the host's ``/proc`` is visible (NVML reports host PIDs; the DaemonSet mounts
        the host's ``/proc`` read-only at ``/host/proc``).
    """

    replicas: int = 4
    heartbeat_s: float = 60.0
    min_interval_s: float = 10.0
    backoff_max_s: float = 30.0
    proc_root: Path = Path("/proc")


class Publisher:
    """Reads the GPUs, decides when to write, writes the node annotation.

    Parameters
    ----------
    api : kubernetes.client.CoreV1Api
    node : str
        This node's name (the DaemonSet passes ``spec.nodeName``).
    backend : NvmlBackend
    options : PublishOptions
    now, monotonic : callables, optional
        Clocks (injected by tests).
    """

    def __init__(self, api: Any, node: str, backend: NvmlBackend, options: PublishOptions,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC),
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.node = node
        self._backend = backend
        self._opts = options
        self._now = now
        self._mono = monotonic
        self.health = HealthTracker()
        self._last: NodeInventory | None = None
        self.on_publish: Callable[[], None] = lambda: None
        """Called after each write (the device plugin re-sends its device list)."""
        self._last_at = float("-inf")
        self.writes = 0
        self.readings: list[GpuReading] = []
        """The last NVML reading (for the agent's metrics)."""
        self.metrics: AgentMetrics | None = None

    def _node_labels(self) -> dict[str, str]:
        if self.api is None:  # no API (``--once``): the configured replicas
            return {}
        node = response_json(self.api.read_node(self.node, _preload_content=False))
        return dict((node.get("metadata") or {}).get("labels") or {})

    def inventory(self) -> NodeInventory:
        """The inventory as it would be written now."""
        replicas = replicas_for(self._node_labels(), self._opts.replicas)
        self.readings = list(self._backend.read())
        return build_inventory(self.node, self.readings, self.health, replicas, self._now(),
                               pod_of=lambda pid: pod_uid_of_pid(pid, self._opts.proc_root))

    def publish_once(self, force: bool = False) -> bool:
        """Write the annotation if due; True if written.

        Raises
        ------
        kubernetes.client.rest.ApiException
            When reading or patching the Node fails (``run`` retries with backoff).
        """
        inv = self.inventory()
        since = self._mono() - self._last_at
        changed = not same_content(self._last, inv)
        if not (force or since >= self._opts.heartbeat_s or (changed and since >= self._opts.min_interval_s)):
            return False
        body = {"metadata": {"annotations": {INVENTORY: dump_inventory(inv)}}}
        try:
            drain(self.api.patch_node(self.node, body, _preload_content=False))
        except Exception:
            if self.metrics is not None:
                self.metrics.publishes.labels("error").inc()
            raise
        self._last, self._last_at = inv, self._mono()
        self.writes += 1
        if self.metrics is not None:
            self.metrics.publishes.labels("ok").inc()
            self.metrics.last_publish.set(self._now().timestamp())
        self.on_publish()
        return True

    def published(self) -> NodeInventory | None:
        """The inventory last written (what the extender sees)."""
        return self._last

    def run(self, stop: threading.Event, xid_poll_s: float = 1.0) -> None:
        """Until ``stop``: wait for XID events (publishing at once on a health change),
        publish when due, back off on API errors."""
        delay = 0.5
        force = True
        while not stop.is_set():
            event = self._backend.wait_xid(xid_poll_s)
            if event is not None and self.metrics is not None:
                self.metrics.xid(event)
            if event is not None and self.health.observe(event):
                log.warning("GPU %s unhealthy: XID %d", event.uuid, event.xid)
                force = True
            try:
                self.publish_once(force=force)
                force, delay = False, 0.5
            except (ApiException, OSError) as exc:
                log.warning("publishing inventory of %s failed (%s); retrying in %.1fs", self.node, exc, delay)
                stop.wait(delay)
                delay = min(delay * 2, self._opts.backoff_max_s)
