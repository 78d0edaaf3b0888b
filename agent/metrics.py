"""Prometheus metrics of the node agent: NVML readings, XID errors, device-plugin Allocates.

Served by ``prometheus_client``'s own HTTP server (``--metrics-port``), on a registry of its
own. GPU readings are the ones the publisher took last (no extra NVML call per scrape).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from agent.nvml import GpuReading, XidEvent

_GPU_LABELS = ["node", "gpu_uuid", "model"]


class _Readings(Collector):
    """Per-GPU gauges from the publisher's last NVML reading, built at scrape time."""

    def __init__(self, node: str, readings: Callable[[], Sequence[GpuReading]],
                 unhealthy: Callable[[], frozenset[str]]) -> None:
        self._node, self._readings, self._unhealthy = node, readings, unhealthy

    def collect(self) -> Iterator[GaugeMetricFamily]:
        util = GaugeMetricFamily("gpufrac_agent_gpu_utilization_ratio",
                                 "GPU utilization NVML reports (nvmlDeviceGetUtilizationRates.gpu / 100).",
                                 labels=_GPU_LABELS)
        used = GaugeMetricFamily("gpufrac_agent_gpu_memory_used_bytes",
                                 "GPU memory used, as NVML reports it (nvmlDeviceGetMemoryInfo.used).",
                                 labels=_GPU_LABELS)
        total = GaugeMetricFamily("gpufrac_agent_gpu_memory_total_bytes",
                                  "GPU memory total (nvmlDeviceGetMemoryInfo.total).", labels=_GPU_LABELS)
        healthy = GaugeMetricFamily("gpufrac_agent_gpu_healthy",
                                    "1 while no critical XID has been seen on the GPU, else 0.",
                                    labels=_GPU_LABELS)
        bad = self._unhealthy()
        for r in self._readings():
            labels = [self._node, r.uuid, r.name]
            util.add_metric(labels, r.utilization_pct / 100.0)
            used.add_metric(labels, r.memory_used_mib * 2**20)
            total.add_metric(labels, r.memory_total_mib * 2**20)
            healthy.add_metric(labels, 0.0 if r.uuid in bad else 1.0)
        yield from (util, used, total, healthy)


class AgentMetrics:
    """The agent's registry.

    Parameters
    ----------
    node : str
        This node (the ``node`` label of every per-GPU series).
    readings : callable
        The GPUs of the last NVML reading.
    unhealthy : callable
        UUIDs of GPUs marked unhealthy by an XID.
    """

    def __init__(self, node: str, readings: Callable[[], Sequence[GpuReading]],
                 unhealthy: Callable[[], frozenset[str]]) -> None:
        self.registry = CollectorRegistry()
        self.node = node
        self.registry.register(_Readings(node, readings, unhealthy))
        self.xid_errors = Counter(
            "gpufrac_agent_gpu_xid_errors_total",
            "Critical XID events NVML reported, by GPU and XID code.",
            [*_GPU_LABELS[:2], "xid"], registry=self.registry)
        self.allocations = Counter(
            "gpufrac_agent_device_plugin_allocate_total",
            "Device-plugin Allocate calls from kubelet, per container, by result (ok, or "
            "no_pod: no pod bound by gpufrac waited for that many devices).",
            ["result"], registry=self.registry)
        for result in ("ok", "no_pod"):
            self.allocations.labels(result)
        self.registrations = Counter(
            "gpufrac_agent_device_plugin_registrations_total",
            "Registrations of the gpufrac.io/gpu device plugin with kubelet.", registry=self.registry)
        self.publishes = Counter(
            "gpufrac_agent_inventory_publishes_total",
            "Writes of the node's gpufrac.io/inventory annotation, by result (ok, error).",
            ["result"], registry=self.registry)
        for result in ("ok", "error"):
            self.publishes.labels(result)
        self.last_publish = Gauge(
            "gpufrac_agent_inventory_last_publish_timestamp_seconds",
            "Unix time of the last successful inventory write.", registry=self.registry)

    def xid(self, event: XidEvent) -> None:
        """Count one XID event."""
        self.xid_errors.labels(self.node, event.uuid, str(event.xid)).inc()

    def serve(self, port: int, host: str) -> None:
        """Serve ``/metrics`` on ``host:port`` from a daemon thread (prometheus_client's server)."""
        start_http_server(port, addr=host, registry=self.registry)
