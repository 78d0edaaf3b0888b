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
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh

DS = DataSourceRef(type_val="prometheus", uid="${datasource}")

# Every extender replica exports the same cluster-wide view (per GPU, per tenant): a panel
# takes one series per GPU or tenant across replicas (max by its own labels) before it sums,
# so two replicas scraped read as one. Counters (filter, bind, preempt, latency) count each
# replica's own calls: those sum. The node, model and tenant variables filter every panel
# that has the label.
GPU = 'node=~"$node", model=~"$model"'


def per_gpu(metric: str) -> str:
    """One series per GPU whichever replica exported it."""
    return f"max by (node, gpu_uuid, model) ({metric}{{{GPU}}})"


def per_tenant(metric: str) -> str:
    """One series per tenant whichever replica exported it."""
    return f'max by (tenant) ({metric}{{tenant=~"$tenant"}})'


ALLOCATED, CAPACITY = per_gpu("gpufrac_gpu_allocated_milli"), per_gpu("gpufrac_gpu_capacity_milli")

# (panel kind, title, description, unit, [(PromQL, legend)])
PANELS: list[tuple[str, str, str, str, list[tuple[str, str]]]] = [
    ("stat", "GPUs allocated (share of usable capacity)",
     "GPU share gpufrac has allocated over the share healthy GPUs with a fresh inventory offer.", "percentunit", [
         (f"sum({ALLOCATED}) / clamp_min(sum({CAPACITY}), 1)", "allocated")]),
    ("stat", "Fragmentation: free share on partly used GPUs",
     "Of the free GPU share, the part on GPUs that already hold a pod: free, but not as whole GPUs.",
     "percentunit", [
         (f"sum(({CAPACITY} - {ALLOCATED}) and ({ALLOCATED} > 0)) / clamp_min(sum({CAPACITY} - {ALLOCATED}), 1)",
          "fragmented")]),
    ("timeseries", "Cluster GPU allocation over time (GPUs)",
     "Allocated GPU share against usable capacity, in GPUs.", "none", [
         (f"sum({ALLOCATED}) / 1000", "allocated"),
         (f"sum({CAPACITY}) / 1000", "usable capacity")]),
    ("timeseries", "Allocated share per node (GPUs)", "GPU share gpufrac has allocated on each node, in GPUs.",
     "none", [
         (f"sum by (node) ({ALLOCATED}) / 1000", "{{node}}")]),
    ("timeseries", "GPU memory allocated per model", "GPU memory gpufrac has allocated, by GPU model.", "bytes", [
        (f"sum by (model) ({per_gpu('gpufrac_gpu_memory_allocated_bytes')})", "{{model}}")]),
    ("timeseries", "Per-tenant usage (GPUs) against quota",
     "GPU share each tenant's bound pods hold, and its quota where it has one.", "none", [
         (f"{per_tenant('gpufrac_tenant_gpu_milli')} / 1000", "{{tenant}} used"),
         (f"{per_tenant('gpufrac_tenant_quota_gpu_milli')} / 1000", "{{tenant}} quota")]),
    ("timeseries", "Scheduling attempts by result (per second)",
     "Pods gpufrac filtered, by outcome (placed, or the reason no node fits), all replicas.", "reqps", [
         ("sum by (result) (rate(gpufrac_filter_pods_total[5m]))", "{{result}}")]),
    ("timeseries", "Binds by result and preemptions (per second)",
     "Binds (ok, conflict, no_fit, quota, error) and preemption answers, all replicas.", "reqps", [
         ("sum by (result) (rate(gpufrac_bind_total[5m]))", "bind {{result}}"),
         ("sum by (result) (rate(gpufrac_preempt_total[5m]))", "preempt {{result}}")]),
    ("timeseries", "Extender verb latency p99", "99th percentile of each verb's time in gpufrac, all replicas.",
     "s", [
         ("histogram_quantile(0.99, sum by (verb, le) (rate(gpufrac_extender_request_duration_seconds_bucket[5m])))",
          "{{verb}}")]),
    ("timeseries", "GPU utilization (NVML, agents)", "NVML's utilization of each GPU, read by the node agents.",
     "percentunit", [
         (f"gpufrac_agent_gpu_utilization_ratio{{{GPU}}}", "{{node}} {{gpu_uuid}}")]),
    ("timeseries", "GPU memory used (NVML) vs allocated by gpufrac",
     "Memory the GPUs' processes use (NVML) against what gpufrac allocated: used above allocated is a pod "
     "over its gpufrac.io/memory.", "bytes", [
         (f"sum by (node) (gpufrac_agent_gpu_memory_used_bytes{{{GPU}}})", "{{node}} used"),
         (f"sum by (node) ({per_gpu('gpufrac_gpu_memory_allocated_bytes')})", "{{node}} allocated")]),
    ("timeseries", "Agent health: XIDs, Allocates, inventory age",
     "XID errors per node, kubelet's Allocate calls by result, and the oldest inventory heartbeat.", "none", [
         ('sum by (node) (gpufrac_agent_gpu_xid_errors_total{node=~"$node"}) or sum by (node) '
          '(gpufrac_agent_gpu_healthy{node=~"$node"} * 0)', "{{node}} XIDs"),
         ('sum by (result) (gpufrac_agent_device_plugin_allocate_total{node=~"$node"})', "Allocate {{result}}"),
         ('max(time() - gpufrac_agent_inventory_last_publish_timestamp_seconds{node=~"$node"})',
          "oldest inventory (s)")]),
]

# (name, label, the query its values come from)
VARIABLES = [("node", "Node", "label_values(gpufrac_gpu_capacity_milli, node)"),
             ("model", "GPU model", "label_values(gpufrac_gpu_capacity_milli, model)"),
             ("tenant", "Tenant", "label_values(gpufrac_tenant_gpu_milli, tenant)")]

QUERIES: dict[str, list[str]] = {title: [q for q, _ in targets] for _, title, _, _, targets in PANELS}


def build() -> dict[str, object]:
    """The dashboard as Grafana's JSON model."""
    board = (dashboard.Dashboard("gpufrac").uid("gpufrac").tags(["gpufrac", "gpu", "scheduler"])
             .refresh("30s").time("now-6h", "now")
             .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus")))
    for name, label, values in VARIABLES:
        board = board.with_variable(dashboard.QueryVariable(name).label(label).query(values).datasource(DS)
                                    .multi(True).include_all(True).all_value(".*").refresh(
                                        VariableRefresh.ON_TIME_RANGE_CHANGED))
    for kind, title, description, unit, targets in PANELS:
        panel = ((stat.Panel() if kind == "stat" else timeseries.Panel()).title(title).description(description)
                 .unit(unit).datasource(DS))
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
