"""Generate gpufrac's Grafana dashboard with grafana-foundation-sdk (Grafana's own builders).

    python deploy/grafana/dashboard.py > deploy/helm/gpufrac/dashboards/gpufrac.json

The committed JSON is this script's output (tests/e2e/test_prometheus_e2e.py checks both
that, and that a real Prometheus answers every query below with data). ``QUERIES`` lists
them: panel title -> PromQL.
"""

from __future__ import annotations

import json
import sys

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef

DS = DataSourceRef(type_val="prometheus", uid="${datasource}")

# (panel kind, title, unit, [(PromQL, legend)])
PANELS: list[tuple[str, str, str, list[tuple[str, str]]]] = [
    ("stat", "GPUs allocated (share of usable capacity)", "percentunit", [
        ("sum(gpufrac_gpu_allocated_milli) / clamp_min(sum(gpufrac_gpu_capacity_milli), 1)", "allocated")]),
    ("stat", "Fragmentation: free share on partly used GPUs", "percentunit", [
        ("sum((gpufrac_gpu_capacity_milli - gpufrac_gpu_allocated_milli) and (gpufrac_gpu_allocated_milli > 0))"
         " / clamp_min(sum(gpufrac_gpu_capacity_milli - gpufrac_gpu_allocated_milli), 1)", "fragmented")]),
    ("timeseries", "Cluster GPU allocation over time (GPUs)", "none", [
        ("sum(gpufrac_gpu_allocated_milli) / 1000", "allocated"),
        ("sum(gpufrac_gpu_capacity_milli) / 1000", "usable capacity")]),
    ("timeseries", "Allocated share per node (GPUs)", "none", [
        ("sum by (node) (gpufrac_gpu_allocated_milli) / 1000", "{{node}}")]),
    ("timeseries", "GPU memory allocated per model", "bytes", [
        ("sum by (model) (gpufrac_gpu_memory_allocated_bytes)", "{{model}}")]),
    ("timeseries", "Per-tenant usage (GPUs) against quota", "none", [
        ("gpufrac_tenant_gpu_milli / 1000", "{{tenant}} used"),
        ("gpufrac_tenant_quota_gpu_milli / 1000", "{{tenant}} quota")]),
    ("timeseries", "Scheduling attempts by result (per second)", "reqps", [
        ("sum by (result) (rate(gpufrac_filter_pods_total[5m]))", "{{result}}")]),
    ("timeseries", "Binds by result and preemptions (per second)", "reqps", [
        ("sum by (result) (rate(gpufrac_bind_total[5m]))", "bind {{result}}"),
        ("sum by (result) (rate(gpufrac_preempt_total[5m]))", "preempt {{result}}")]),
    ("timeseries", "Extender verb latency p99", "s", [
        ("histogram_quantile(0.99, sum by (verb, le) (rate(gpufrac_extender_request_duration_seconds_bucket[5m])))",
         "{{verb}}")]),
    ("timeseries", "GPU utilization (NVML, agents)", "percentunit", [
        ("gpufrac_agent_gpu_utilization_ratio", "{{node}} {{gpu_uuid}}")]),
    ("timeseries", "GPU memory used (NVML) vs allocated by gpufrac", "bytes", [
        ("sum by (node) (gpufrac_agent_gpu_memory_used_bytes)", "{{node}} used"),
        ("sum by (node) (gpufrac_gpu_memory_allocated_bytes)", "{{node}} allocated")]),
    ("timeseries", "Agent health: XIDs, Allocates, inventory age", "none", [
        ("sum by (node) (gpufrac_agent_gpu_xid_errors_total) or sum by (node) (gpufrac_agent_gpu_healthy * 0)",
         "{{node}} XIDs"),
        ("sum by (result) (gpufrac_agent_device_plugin_allocate_total)", "Allocate {{result}}"),
        ("max(time() - gpufrac_agent_inventory_last_publish_timestamp_seconds)", "oldest inventory (s)")]),
]

QUERIES: dict[str, list[str]] = {title: [q for q, _ in targets] for _, title, _, targets in PANELS}


def build() -> dict[str, object]:
    """The dashboard as Grafana's JSON model."""
    board = (dashboard.Dashboard("gpufrac").uid("gpufrac").tags(["gpufrac", "gpu", "scheduler"])
             .refresh("30s").time("now-6h", "now")
             .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus")))
    for kind, title, unit, targets in PANELS:
        panel = (stat.Panel() if kind == "stat" else timeseries.Panel()).title(title).unit(unit).datasource(DS)
        panel = panel.height(8).span(6 if kind == "stat" else 12)
        for i, (expr, legend) in enumerate(targets):
            panel = panel.with_target(prometheus.Dataquery().expr(expr).legend_format(legend)
                                      .ref_id(chr(ord("A") + i)).datasource(DS))
        board = board.with_panel(panel)
    return dict(json.loads(json.dumps(board.build(), cls=JSONEncoder)))


def render() -> str:
    """The committed file's text."""
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
