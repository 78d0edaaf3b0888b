"""A real Prometheus (Debian's package) scrapes a running extender and agent; every query of
the shipped Grafana dashboard returns data after a short run of pods, and the same numbers
when two extender replicas are scraped as when one is.

gpufrac runs in cluster mode against the session's kube-apiserver, with a tenant and quota in
its admin config; the agent publishes a fake-NVML node that gpufrac-scheduler places pods on.
A second gpufrac replica (same config, no verb traffic, as a second Deployment replica
behind the Service would be between calls) watches the same cluster; one Prometheus scrapes
the first replica only, another both.
"""

from __future__ import annotations

import functools
import json
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from harness.builds import ensure_debian
from harness.controlplane import add_fake_node, fake_node_gpus
from harness.processes import LOOPBACK, ROOT, free_port, start, wait_until
from tests.e2e.conftest import STALE_AFTER_S, Cluster, unique, wait_for_pods
from tests.e2e.helpers import gpu_pod, new_namespace

pytestmark = pytest.mark.e2e

DASHBOARD = ROOT / "deploy" / "helm" / "gpufrac" / "dashboards" / "gpufrac.json"
RULES = ROOT / "deploy" / "helm" / "gpufrac" / "rules" / "gpufrac-rules.yaml"
TENANT_NS = unique("prom")


def dashboard_queries() -> list[str]:
    """Every PromQL expression in the committed dashboard JSON as Grafana runs it with every
    variable at "All" (its ``allValue``, ``.*``)."""
    board = json.loads(DASHBOARD.read_text())
    names = {v["name"]: v.get("allValue", ".*") for v in board["templating"]["list"] if v["type"] == "query"}
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    for name, value in names.items():
        exprs = [e.replace(f"${name}", value) for e in exprs]
    return exprs


@dataclass(frozen=True)
class Scrapes:
    """Prometheus scraping one extender replica (``one``) and both (``both``); base URLs."""

    one: str
    both: str


@pytest.fixture(scope="module")
def prometheus(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scrapes]:
    """gpufrac (restarted with a tenant config), a second replica, an agent, and two
    Prometheus servers scraping every second."""
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

    second_port = free_port()
    second = cluster.cp.start_gpufrac(second_port, name="gpufrac-second", extra=[
        "--config", str(config), "--inventory-stale-after-s", str(STALE_AFTER_S)])

    # The chart's alerting rules, each rule's `for` cut to 2 s (promtool's unit tests check the
    # durations: tests/deploy/test_alert_rules.py): loaded and evaluated by the real server.
    rules = yaml.safe_load(RULES.read_text())
    for rule in rules["groups"][0]["rules"]:
        rule["for"] = "2s"
    (work / "rules.yml").write_text(yaml.safe_dump(rules))
    proms, urls = [], []
    for name, extenders in (("one", [cluster.gpufrac_port]), ("both", [cluster.gpufrac_port, second_port])):
        port = free_port()
        (work / f"{name}.yml").write_text(json.dumps({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(work / "rules.yml")],
            "scrape_configs": [
                {"job_name": "gpufrac-extender",
                 "static_configs": [{"targets": [f"{LOOPBACK}:{p}" for p in extenders]}]},
                {"job_name": "gpufrac-agent", "static_configs": [{"targets": [f"{LOOPBACK}:{agent_port}"]}]}]}))
        proms.append(cluster.cp.track(start(f"prometheus-{name}", [
            str(ensure_debian("prometheus", "prometheus")), f"--config.file={work / f'{name}.yml'}",
            f"--storage.tsdb.path={work / f'data-{name}'}", f"--web.listen-address={LOOPBACK}:{port}"], work)))
        urls.append(f"http://{LOOPBACK}:{port}")
    for url, prom in zip(urls, proms, strict=True):  # a test that runs first (-k) finds it serving
        wait_until(lambda url=url: urllib.request.urlopen(f"{url}/-/ready", timeout=5).status == 200, 60,
                   f"{prom.name} ready", prom)
    try:
        yield Scrapes(*urls)
    finally:
        for prom in proms:
            prom.stop()
        second.stop()
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


def test_every_dashboard_query_returns_data_from_a_real_prometheus(cluster: Cluster, prometheus: Scrapes) -> None:
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
        missing[:] = [q for q in queries if not query(prometheus.both, q)]
        return not missing
    try:
        cluster.wait(all_answered, 90, "every dashboard query answered")
    except AssertionError:
        raise AssertionError(f"queries without data: {missing}") from None

    # The data is the cluster's: three quarter-GPU pods of tenant research, on the agent's node.
    (allocated,) = query(prometheus.one, f'sum(gpufrac_gpu_allocated_milli{{node="{TENANT_NS}-000"}})')
    assert float(allocated["value"][1]) == 750
    (used,) = query(prometheus.one, 'gpufrac_tenant_gpu_milli{tenant="research"}')
    assert float(used["value"][1]) == 750
    (quota,) = query(prometheus.one, 'gpufrac_tenant_quota_gpu_milli{tenant="research"}')
    assert float(quota["value"][1]) == 4000
    cluster.wait(lambda: query(prometheus.both, 'gpufrac_filter_pods_total{result=~".*model.*"} > 0'), 30,
                 "the H100 pod counted by its reason")
    utilization = query(prometheus.both, f'gpufrac_agent_gpu_memory_total_bytes{{node="{TENANT_NS}-000"}}')
    assert sorted(float(r["value"][1]) for r in utilization) == [24576 * 2**20] * 2


def test_the_dashboard_reads_the_same_with_two_replicas_scraped(cluster: Cluster, prometheus: Scrapes) -> None:
    """Runs after the test above (same module, its pods bound): every panel's numbers from
    the Prometheus that scrapes both replicas equal those from the one that scrapes one."""
    node = f'node="{TENANT_NS}-000"'

    def both_replicas_scraped() -> bool:
        # The second replica's view has caught up: its series are there too.
        return len(query(prometheus.both, f"gpufrac_gpu_allocated_milli{{{node}}} > 0")) == 2 * len(
            query(prometheus.one, f"gpufrac_gpu_allocated_milli{{{node}}} > 0")) > 0
    cluster.wait(both_replicas_scraped, 60, "both replicas' GPU series in Prometheus")
    # The naive sum the dashboard used to run doubles: the setup really has two replicas.
    naive = f"sum(gpufrac_gpu_allocated_milli{{{node}}})"
    assert float(query(prometheus.both, naive)[0]["value"][1]) == 2 * float(query(prometheus.one, naive)[0]["value"][1])

    def answer(base: str, expr: str) -> dict[str, float]:
        return {json.dumps(r["metric"], sort_keys=True): float(r["value"][1]) for r in query(base, expr)}

    def same_series(expr: str) -> tuple[dict[str, float], dict[str, float]] | None:
        # A scrape that misses its 1 s timeout on a loaded machine leaves a rate() without
        # samples for a moment: the two servers agree again within a few scrapes.
        one, both = answer(prometheus.one, expr), answer(prometheus.both, expr)
        return (one, both) if one.keys() == both.keys() else None
    for expr in dashboard_queries():
        try:
            one, both = cluster.wait(functools.partial(same_series, expr), 30, f"the same series for {expr}")
        except AssertionError:
            one, both = answer(prometheus.one, expr), answer(prometheus.both, expr)
            raise AssertionError(f"{expr}: one {sorted(one)}, both {sorted(both)}") from None
        if "rate(" in expr:
            continue  # per-replica counters summed: the second replica served no calls, so no series of its own
        tolerance = 5.0 if "time()" in expr else 1e-9  # two servers evaluate time() a moment apart
        assert all(abs(one[k] - both[k]) <= tolerance for k in one), (expr, one, both)


def test_the_committed_dashboard_is_the_generators_output() -> None:
    import runpy

    module = runpy.run_path(str(ROOT / "deploy" / "grafana" / "dashboard.py"))
    assert DASHBOARD.read_text() == module["render"]()


def test_the_alerting_rules_load_and_fire_on_a_stale_inventory(cluster: Cluster, prometheus: Scrapes) -> None:
    """The chart's rules in the real Prometheus: all loaded, and GpufracInventoryStale fires for
    a node whose agent never wrote an inventory (and not for the agent's node)."""
    def evaluated() -> list[dict[str, Any]] | None:  # each rule's health is "unknown" until evaluated once
        with urllib.request.urlopen(f"{prometheus.one}/api/v1/rules", timeout=10) as r:
            rules = [rule for g in json.loads(r.read())["data"]["groups"] for rule in g["rules"]]
        return rules if rules and all(rule["health"] != "unknown" for rule in rules) else None
    rules = cluster.wait(evaluated, 30, "every rule evaluated once")
    chart = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    assert {rule["name"] for rule in rules} == {rule["alert"] for rule in chart}
    assert all(rule["health"] == "ok" for rule in rules), rules
    # What GpufracScoringWithoutKernels reads: the extender scraped says its kernels score.
    cluster.wait(lambda: query(prometheus.one, 'gpufrac_scoring_info{backend=~"numba .+"}'), 60,
                 "gpufrac_scoring_info naming numba")
    silent = unique("noagent")
    add_fake_node(cluster.api, silent, fake_node_gpus(silent, 1), publish_inventory=False)
    try:
        firing = f'ALERTS{{alertname="GpufracInventoryStale",alertstate="firing",node="{silent}"}}'
        cluster.wait(lambda: query(prometheus.one, firing), 60, "GpufracInventoryStale firing for the node")
        assert not query(prometheus.one, f'ALERTS{{alertname="GpufracInventoryStale",node="{TENANT_NS}-000"}}')
    finally:
        cluster.api.delete_node(silent)
