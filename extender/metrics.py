"""Prometheus metrics of one extender process (own registry, so apps in tests don't collide)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from extender.cache import EMPTY_VIEW, DefragPlan, MetricsView
from scoring.request import MILLI_PER_GPU


class LeaseView(Protocol):
    """What the metrics read of ``extender.cluster.stall.LeaseState``."""

    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def holder(self) -> str: ...
    @property
    def renew_age_s(self) -> float | None: ...
    @property
    def holder_in_release(self) -> bool | None: ...


class StallView(Protocol):
    """What the metrics read of ``extender.cluster.stall.StallReport`` (the cluster package sits
    above the metrics in the layers: it is not imported here)."""

    @property
    def pods(self) -> tuple[str, ...]: ...
    @property
    def oldest_s(self) -> float: ...
    @property
    def lease(self) -> LeaseView | None: ...

_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


_GPU_LABELS = ["node", "gpu_uuid", "model"]


class _Cluster(Collector):
    """Per-GPU, per-node and per-tenant gauges, built at scrape time from one
    ``GpuCache.metrics_view`` and the nodes' inventory ages."""

    def __init__(self, view: Callable[[], MetricsView],
                 inventory_ages: Callable[[], dict[str, float | None]]) -> None:
        self._view, self.inventory_ages = view, inventory_ages
        self.planned_waiting = 0  # the last defragmentation plan's count (cluster mode)
        self.clock_skews: Callable[[], dict[tuple[str, str], float]] = dict  # (kind, name) -> s
        self.watch_silences: Callable[[], dict[str, float]] = dict  # watch -> s since a sign of life
        self.scheduler_stall: Callable[[], StallView | None] = lambda: None  # cluster mode
        self.inventory_stale_after_s = float("inf")  # cluster mode: --inventory-stale-after-s

    def collect(self) -> Iterator[GaugeMetricFamily]:
        view = self._view()
        waiting = view.waiting_for_fragmentation
        yield GaugeMetricFamily(
            "gpufrac_pods_waiting_for_fragmentation",
            "Pending GPU pods (of the oldest 64) whose request is free in sum on the GPUs they may "
            "use but fits no node: as of the last defragmentation plan in cluster mode (nodeSelectors "
            "matched against the nodes' labels), at scrape time in standalone mode.",
            value=self.planned_waiting if waiting is None else waiting)
        fam = {name: GaugeMetricFamily(f"gpufrac_gpu_{name}", text, labels=_GPU_LABELS) for name, text in (
            ("allocated_milli", "GPU share gpufrac has allocated on the GPU, milli-GPU (1000 = whole)."),
            ("capacity_milli", "GPU share the GPU offers, milli-GPU (1000 when usable, 0 when unhealthy "
                               "or its node's inventory is stale or missing)."),
            ("memory_allocated_bytes", "GPU memory gpufrac has allocated on the GPU."),
            ("memory_total_bytes", "GPU memory of the GPU (the agent's inventory)."),
            ("pods", "Pods gpufrac has placed on the GPU."),
            ("replicas", "Time-slicing replicas the GPU offers (pods it may hold at once)."),
        )}
        for node, uuid, model, milli, mem, total, replicas, pods, healthy, ready in view.gpus:
            labels = [node, uuid, model]
            fam["allocated_milli"].add_metric(labels, milli)
            fam["capacity_milli"].add_metric(labels, MILLI_PER_GPU if healthy and ready else 0)
            fam["memory_allocated_bytes"].add_metric(labels, mem * 2**20)
            fam["memory_total_bytes"].add_metric(labels, total * 2**20)
            fam["pods"].add_metric(labels, pods)
            fam["replicas"].add_metric(labels, replicas)
        yield from fam.values()
        tenant = {name: GaugeMetricFamily(f"gpufrac_tenant_{name}", text, labels=["tenant"]) for name, text in (
            ("gpu_milli", "GPU share the tenant's bound pods hold, milli-GPU."),
            ("gpu_memory_bytes", "GPU memory the tenant's bound pods hold."),
            ("quota_gpu_milli", "The tenant's GPU share quota, milli-GPU (absent: no quota)."),
            ("quota_gpu_memory_bytes", "The tenant's GPU memory quota (absent: no quota)."),
        )}
        for name, milli, mib, quota_milli, quota_mib in view.tenants:
            tenant["gpu_milli"].add_metric([name], milli)
            tenant["gpu_memory_bytes"].add_metric([name], mib * 2**20)
            if quota_milli is not None:
                tenant["quota_gpu_milli"].add_metric([name], quota_milli)
            if quota_mib is not None:
                tenant["quota_gpu_memory_bytes"].add_metric([name], quota_mib * 2**20)
        yield from tenant.values()
        age = GaugeMetricFamily("gpufrac_node_inventory_age_seconds",
                                "Seconds since this replica saw the node's gpufrac.io/inventory heartbeat change "
                                "(cluster mode); a node past --inventory-stale-after-s gets no GPU pods. NaN: no "
                                "valid inventory.",
                                labels=["node"])
        stale = GaugeMetricFamily("gpufrac_node_inventory_stale",
                                  "1 when this replica refuses the node GPU pods because its gpufrac.io/inventory "
                                  "is stale (unchanged for --inventory-stale-after-s) or missing, else 0 "
                                  "(cluster mode).", labels=["node"])
        for node, seconds in sorted(self.inventory_ages().items()):
            age.add_metric([node], float("nan") if seconds is None else seconds)
            stale.add_metric([node], float(seconds is None or seconds > self.inventory_stale_after_s))
        yield age
        yield stale
        skew = GaugeMetricFamily("gpufrac_clock_skew_seconds",
                                 "Another machine's clock minus this replica's, seconds (cluster mode): a node's "
                                 "agent (kind=node, from its heartbeat when it changed) or another gpufrac "
                                 "replica (kind=replica, from its newest claim). Freshness and TTLs never read "
                                 "it; alert when it passes a few seconds (NTP).", labels=["kind", "name"])
        for (kind, name), seconds in sorted(self.clock_skews().items()):
            skew.add_metric([kind, name], seconds)
        yield skew
        silence = GaugeMetricFamily("gpufrac_watch_silence_seconds",
                                    "Seconds since the watch's last sign of life (an event, a bookmark, the "
                                    "server ending a request at its timeout; cluster mode): past the watch "
                                    "timeout plus its read margin (45 s) it is silent and /readyz says 503.",
                                    labels=["watch"])
        for name, seconds in sorted(self.watch_silences().items()):
            silence.add_metric([name], seconds)
        yield silence
        yield from self._stall()

    def _stall(self) -> Iterator[GaugeMetricFamily]:
        report = self.scheduler_stall()
        if report is None:
            return
        yield GaugeMetricFamily(
            "gpufrac_pods_not_attempted",
            "Pending GPU pods of gpufrac's scheduler profile that no scheduler has attempted (no "
            "PodScheduled condition) for --stall-after-s or longer since this replica first saw them "
            "(cluster mode; of the first 500 pending). Above 0: the scheduler is stalled; /readyz's "
            "scheduler detail says what holds its Lease.", value=len(report.pods))
        yield GaugeMetricFamily(
            "gpufrac_pods_not_attempted_oldest_seconds",
            "Seconds the longest-waiting of gpufrac_pods_not_attempted has waited since this replica first "
            "saw it (0 when none).", value=report.oldest_s)
        lease = report.lease
        if lease is not None:
            fam = GaugeMetricFamily(
                "gpufrac_scheduler_lease_renew_age_seconds",
                "Seconds since this replica saw the scheduler Lease's renewTime change (--scheduler-lease), "
                "with its holder and whether the holder is one of the release's kube-scheduler pods "
                "(true, false, unknown). NaN: no Lease or no renewTime.",
                labels=["lease", "holder", "holder_in_release"])
            whose = {True: "true", False: "false", None: "unknown"}[lease.holder_in_release]
            fam.add_metric([f"{lease.namespace}/{lease.name}", lease.holder[:128], whose],
                           float("nan") if lease.renew_age_s is None else lease.renew_age_s)
            yield fam


class Metrics:
    """Request latency per verb, filter outcomes per reason, binds, preemptions, config
    reloads, and the cache: per GPU, per tenant, per node's inventory age, totals.

    Parameters
    ----------
    summary : callable
        ``GpuCache.summary`` (totals, lock-free).
    view : callable, optional
        ``GpuCache.metrics_view`` (per GPU and tenant, never waiting on a verb).
    """

    def __init__(self, summary: Callable[[], dict[str, int]],
                 view: Callable[[], MetricsView] = lambda: EMPTY_VIEW) -> None:
        self.registry = CollectorRegistry()
        self.cluster = _Cluster(view, dict)
        self.registry.register(self.cluster)
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
        self.filter_pods = Counter(
            "gpufrac_filter_pods_total",
            "Filter calls (one per scheduling attempt of a pod), by result: feasible (some node "
            "passed), or the check most candidates failed (the pod stays pending), or error.",
            ["result"], registry=self.registry)
        self.binds = Counter(
            "gpufrac_bind_total",
            "Bind calls, by result: ok, conflict (another gpufrac instance bound there first), "
            "no_fit (the node no longer fits at bind), quota, error.", ["result"], registry=self.registry)
        self.preemptions = Counter(
            "gpufrac_preempt_total",
            "Preempt calls, by result: possible (some proposed node frees enough with victims) "
            "or impossible.", ["result"], registry=self.registry)
        self.preemption_victims = Counter(
            "gpufrac_preempt_victims_total",
            "Victims gpufrac named on the answered node with the fewest, summed over preempt calls.",
            registry=self.registry)
        # Known label values start at 0, so a rate() over them exists before the first event.
        for result in ("ok", "conflict", "no_fit", "quota", "error"):
            self.binds.labels(result)
        for result in ("possible", "impossible"):
            self.preemptions.labels(result)
        self.filter_pods.labels("feasible")
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
        held = Gauge("gpufrac_reserved_nodes",
                     "Nodes held by starvation protection for a GPU pod that waited too long for "
                     "room (admin config starvation:); 0 while it is off.", registry=self.registry)
        held.set_function(lambda: summary().get("reserved_nodes", 0))  # a summary without holds: 0
        self.defrag_planned_moves = Gauge(
            "gpufrac_defrag_planned_moves",
            "Evictions the last defragmentation plan asks for (acted on only with "
            "defragmentation.evict).", registry=self.registry)
        self.defrag_evictions = Counter(
            "gpufrac_defrag_evictions_total",
            "Evictions made acting on the defragmentation plan, by result (evicted; blocked: a "
            "PodDisruptionBudget refused; gone; error).", ["result"], registry=self.registry)
        for result in ("evicted", "blocked", "gone", "error"):
            self.defrag_evictions.labels(result)
        self.scoring = Info(
            "gpufrac_scoring",
            "What scores (backend): 'numpy, compiling' while the compiled kernels build at start, "
            "then 'numba <version>', or 'numpy' where numba is absent or failed (the same "
            "placements, slower).", registry=self.registry)

    def planned(self, made: DefragPlan) -> None:
        """A new defragmentation plan (``extender.cluster.defragmenter.Defragmenter``): its gauges."""
        self.cluster.planned_waiting = len(made.waiting)
        self.defrag_planned_moves.set(made.moves)

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
