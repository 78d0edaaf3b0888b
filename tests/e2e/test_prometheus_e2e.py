"""A real Prometheus (Debian's package) scrapes a running extender and agent; every query of
the shipped Grafana dashboard returns data after a short run of pods.

gpufrac runs in cluster mode against the session's kube-apiserver, with a tenant and quota in
its admin config; the agent publishes a fake-NVML node that gpufrac-scheduler places pods on.
"""

from __future__ import annotations

import json
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import Cluster, unique, wait_for_pods
from tests.e2e.helpers import gpu_pod, new_namespace
from tests.harness.controlplane import (
    LOOPBACK,
    ROOT,
    add_fake_node,
    ensure_debian,
    fake_node_gpus,
    free_port,
    start,
)

pytestmark = pytest.mark.e2e

DASHBOARD = ROOT / "deploy" / "helm" / "gpufrac" / "dashboards" / "gpufrac.json"
TENANT_NS = unique("prom")


def dashboard_queries() -> list[str]:
    """Every PromQL expression in the committed dashboard JSON (what Grafana will run)."""
    board = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in board["panels"] for t in p.get("targets", [])]


@pytest.fixture(scope="module")
def prometheus(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """gpufrac (restarted with a tenant config), an agent and Prometheus scraping both every
    second; Prometheus's base URL."""
    work = tmp_path_factory.mktemp("prometheus")
    config = work / "gpufrac.yaml"
    config.write_text(f"tenants:\n  research:\n    namespaces: [{TENANT_NS}]\n    quota: {{gpu_milli: 4000}}\n")
    cluster.gpufrac.stop()
    cluster.start_gpufrac(["--config", str(config)])

    node = f"{TENANT_NS}-000"
    add_fake_node(cluster.api, node, fake_node_gpus(node, 2, replicas=4), publish_inventory=False)
    cluster.api.patch_node(node, {"metadata": {"labels": {"gpufrac.io/test-group": TENANT_NS}}})
    fake = work / "gpus.yaml"
    fake.write_text("gpus:\n- {name: NVIDIA A10, memory_mib: 24576, count: 2}\n")
    agent_port = free_port()
    agent = cluster.cp.track(start("agent-prometheus", [
        sys.executable, "-m", "agent", "--node-name", node, "--nvml", "fake", "--fake-config", str(fake),
        "--kubeconfig", str(cluster.cp.admin_kubeconfig), "--heartbeat-s", "5", "--no-device-plugin",
        "--metrics-port", str(agent_port), "--metrics-host", LOOPBACK], work))

    port = free_port()
    (work / "prometheus.yml").write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "gpufrac-extender", "static_configs": [{"targets": [f"{LOOPBACK}:{cluster.gpufrac_port}"]}]},
            {"job_name": "gpufrac-agent", "static_configs": [{"targets": [f"{LOOPBACK}:{agent_port}"]}]}]}))
    prom = cluster.cp.track(start("prometheus", [
        str(ensure_debian("prometheus", "prometheus")), f"--config.file={work / 'prometheus.yml'}",
        f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address={LOOPBACK}:{port}"], work))
    try:
        yield f"http://{LOOPBACK}:{port}"
    finally:
        prom.stop()
        agent.stop()
        cluster.gpufrac.stop()
        cluster.start_gpufrac()


def query(base: str, expr: str) -> list[dict[str, Any]]:
    """Prometheus's instant-query result for ``expr``."""
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def test_every_dashboard_query_returns_data_from_a_real_prometheus(cluster: Cluster, prometheus: str) -> None:
    new_namespace(cluster.api, TENANT_NS)
    names = [f"q{i}" for i in range(3)]
    for name in names:
        cluster.api.create_namespaced_pod(TENANT_NS, gpu_pod(name, TENANT_NS, fraction="0.25"))
    # and one no node can take (no such model): counted by its reason
    cluster.api.create_namespaced_pod(TENANT_NS, gpu_pod("nowhere", TENANT_NS, fraction="0.25", model="H100"))
    wait_for_pods(cluster, TENANT_NS, names, timeout_s=60)

    queries = dashboard_queries()
    assert len(queries) >= 12 and all(queries)
    missing: list[str] = []

    def all_answered() -> bool:
        missing[:] = [q for q in queries if not query(prometheus, q)]
        return not missing
    try:
        cluster.wait(all_answered, 90, "every dashboard query answered")
    except AssertionError:
        raise AssertionError(f"queries without data: {missing}") from None

    # The data is the cluster's: three quarter-GPU pods of tenant research, on the agent's node.
    (allocated,) = query(prometheus, f'sum(gpufrac_gpu_allocated_milli{{node="{TENANT_NS}-000"}})')
    assert float(allocated["value"][1]) == 750
    (used,) = query(prometheus, 'gpufrac_tenant_gpu_milli{tenant="research"}')
    assert float(used["value"][1]) == 750
    (quota,) = query(prometheus, 'gpufrac_tenant_quota_gpu_milli{tenant="research"}')
    assert float(quota["value"][1]) == 4000
    cluster.wait(lambda: query(prometheus, 'gpufrac_filter_pods_total{result=~".*model.*"} > 0'), 30,
                 "the H100 pod counted by its reason")
    utilization = query(prometheus, f'gpufrac_agent_gpu_memory_total_bytes{{node="{TENANT_NS}-000"}}')
    assert sorted(float(r["value"][1]) for r in utilization) == [24576 * 2**20] * 2


def test_the_committed_dashboard_is_the_generators_output() -> None:
    import runpy

    module = runpy.run_path(str(ROOT / "deploy" / "grafana" / "dashboard.py"))
    assert DASHBOARD.read_text() == module["render"]()

