"""Prometheus metrics of one extender process (own registry, so apps in tests don't collide)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Metrics:
    """Request latency per verb, filter outcomes per reason, binds, cache totals."""

    def __init__(self, summary: Callable[[], dict[str, int]]) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "gpufrac_extender_request_duration_seconds",
            "Time to answer one kube-scheduler extender call, by verb.",
            ["verb"], buckets=_BUCKETS_S, registry=self.registry)
        self.filter_nodes = Counter(
            "gpufrac_filter_nodes_total",
            "Candidate nodes seen by filter, by outcome (passed or the failed check).",
            ["outcome"], registry=self.registry)
        self.filter_errors = Counter(
            "gpufrac_filter_errors_total",
            "Filter calls answered with Error (invalid pod or request).",
            registry=self.registry)
        self.binds = Counter(
            "gpufrac_bind_total", "Bind calls, by result.", ["result"], registry=self.registry)
        self.config_reloads = Counter(
            "gpufrac_config_reloads_total",
            "Admin config file changes seen, by result (applied, or rejected: the previous "
            "config stays in force).", ["result"], registry=self.registry)
        self.config_valid = Gauge(
            "gpufrac_config_valid",
            "1 when the admin config file last read was valid and is in force, 0 when the "
            "last change was rejected.", registry=self.registry)
        self.config_valid.set(1)
        self.rejected_objects = Counter(
            "gpufrac_rejected_objects_total",
            "Objects from the API gpufrac could not read and skipped (quarantined), by kind "
            "(pod, node, namespace) and reason (the first field that failed).",
            ["kind", "reason"], registry=self.registry)
        for key in ("nodes", "gpus", "gpu_allocated_milli", "pods_bound"):
            g = Gauge(f"gpufrac_cache_{key}", f"Cache total: {key}.", registry=self.registry)
            g.set_function(_total(summary, key))
        over = Gauge("gpufrac_overcommitted_pods",
                     "Bound pods whose allocation record gpufrac could not have made (forged, or "
                     "bound outside gpufrac): counted only up to what was free.", registry=self.registry)
        over.set_function(_total(summary, "pods_overcommitted"))

    @contextmanager
    def timer(self, verb: str) -> Iterator[None]:
        """Observe the wall time of the block into the latency histogram."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.latency.labels(verb).observe(time.perf_counter() - start)

    def exposition(self) -> bytes:
        """The text exposition format of this registry."""
        return generate_latest(self.registry)


def _total(summary: Callable[[], dict[str, int]], key: str) -> Callable[[], float]:
    """A gauge's reader: one total of ``summary()``, read at scrape time."""
    return lambda: summary()[key]
