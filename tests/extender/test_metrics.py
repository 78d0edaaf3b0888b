"""``/metrics``: per-GPU allocation, per-tenant usage against quota, pods by filter result,
bind results and preemptions, read back with prometheus_client's own parser."""

from __future__ import annotations

import threading
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from extender.metrics import Metrics
from tests.conftest import gpu_node, pod_json
from tests.extender.helpers import client_for
from tests.extender.test_routes import add, schedule


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample: (name, labels) -> value."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def value(text: str, name: str, **labels: str) -> float:
    return samples(text)[(name, frozenset(labels.items()))]


def test_per_gpu_series_carry_node_uuid_and_model(tmp_path: Path) -> None:
    config = tmp_path / "gpufrac.yaml"
    config.write_text("tenants:\n  research: {namespaces: [default], quota: {gpu_milli: 2000}}\n")
    with client_for([gpu_node("a", 2, model="A10", memory_mib=24576)], config_file=config) as (client, _):
        # One 0.25 pod: 250 milli on one GPU; with no memory request it holds the share of
        # the GPU's memory (24576 MiB x 0.25 = 6144 MiB).
        host = schedule(client, pod_json("p", annotations={"gpufrac.io/fraction": "0.25"}), ["a"])
        text = client.get("/metrics").text
    assert host == "a"
    allocated = {dict(k[1])["gpu_uuid"]: v for k, v in samples(text).items() if k[0] == "gpufrac_gpu_allocated_milli"}
    assert sorted(allocated.values()) == [0, 250]
    (busy,) = [u for u, v in allocated.items() if v == 250]
    gpu = {"node": "a", "gpu_uuid": busy, "model": "A10"}
    assert value(text, "gpufrac_gpu_capacity_milli", **gpu) == 1000
    assert value(text, "gpufrac_gpu_memory_allocated_bytes", **gpu) == 6144 * 2**20
    assert value(text, "gpufrac_gpu_memory_total_bytes", **gpu) == 24576 * 2**20
    assert value(text, "gpufrac_gpu_pods", **gpu) == 1
    # The tenant holds the pod's share against its quota of two GPUs.
    assert value(text, "gpufrac_tenant_gpu_milli", tenant="research") == 250
    assert value(text, "gpufrac_tenant_quota_gpu_milli", tenant="research") == 2000
    assert value(text, "gpufrac_filter_pods_total", result="feasible") == 1
    assert value(text, "gpufrac_bind_total", result="ok") == 1


def test_a_pod_that_fits_nowhere_is_counted_by_the_reason_most_nodes_gave() -> None:
    nodes = [gpu_node("a", 1, model="T4"), gpu_node("b", 1, model="T4"), gpu_node("c", 1, model="V100")]
    with client_for(nodes) as (client, _):
        pod = pod_json("v", annotations={"gpufrac.io/gpu-model": "A100"})
        add(client, pod)
        r = client.post("/filter", json={"Pod": pod, "Nodes": None, "NodeNames": ["a", "b", "c"]}).json()
        text = client.get("/metrics").text
    assert r["NodeNames"] == []
    # three nodes, all failing the model check: the pod's result is that reason
    counted = {dict(k[1])["result"]: v for k, v in samples(text).items() if k[0] == "gpufrac_filter_pods_total"}
    assert counted == {"feasible": 0, "gpu_model_mismatch": 1}, counted  # feasible exists from the start


def test_bind_refused_because_the_node_filled_up_is_no_fit() -> None:
    with client_for([gpu_node("a", 1)]) as (client, _):
        first, second = (pod_json(n, annotations={"gpufrac.io/fraction": "0.75"}) for n in ("p1", "p2"))
        for pod in (first, second):
            add(client, pod)
        schedule(client, first, ["a"])
        meta = second["metadata"]
        b = client.post("/bind", json={"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                       "PodUID": meta["uid"], "Node": "a"}).json()
        text = client.get("/metrics").text
    assert b["Error"]
    assert value(text, "gpufrac_bind_total", result="no_fit") == 1
    assert value(text, "gpufrac_bind_total", result="ok") == 1


def test_metrics_view_never_waits_for_a_verb_and_is_never_torn() -> None:
    with client_for([gpu_node("a", 1)]) as (client, cache):
        schedule(client, pod_json("p", annotations={"gpufrac.io/fraction": "0.5"}), ["a"])
        before = cache.metrics_view()
        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            with cache._lock:  # a verb in a worker thread
                held.set()
                release.wait(10)
        t = threading.Thread(target=hold)
        t.start()
        held.wait(5)
        try:
            # answered at once, from the view copied last
            assert cache.metrics_view() is before
        finally:
            release.set()
            t.join()
    assert [g[3] for g in before.gpus] == [500]


def test_inventory_ages_are_exposed_per_node() -> None:
    metrics = Metrics(lambda: {"nodes": 0, "gpus": 0, "gpu_allocated_milli": 0, "pods_bound": 0,
                               "pods_overcommitted": 0})
    metrics.cluster.inventory_ages = lambda: {"n1": 12.5, "n2": None}
    text = metrics.exposition().decode()
    assert value(text, "gpufrac_node_inventory_age_seconds", node="n1") == 12.5
    assert value(text, "gpufrac_node_inventory_age_seconds", node="n2") != value(
        text, "gpufrac_node_inventory_age_seconds", node="n2")  # NaN: no valid inventory


def test_every_metric_the_extender_exposes_is_in_the_endpoints_table() -> None:
    import re

    from extender.cluster.stall import LeaseState, StallReport

    m = Metrics(lambda: {"nodes": 0, "gpus": 0, "gpu_allocated_milli": 0, "pods_bound": 0, "pods_overcommitted": 0})
    m.cluster.inventory_ages = lambda: {"n": 1.0}
    m.cluster.clock_skews = lambda: {("node", "n"): 1.0}
    m.cluster.watch_silences = lambda: {"pod": 1.0}
    m.cluster.scheduler_stall = lambda: StallReport(("ns/p",), 40.0, LeaseState("ns", "l", True, "h", 1.0))
    samples = [line.split("{")[0].split(" ")[0] for line in m.exposition().decode().splitlines()
               if line and not line.startswith("#")]
    exposed = {re.sub(r"_(bucket|count|sum)$", "", s) for s in samples if not s.endswith("_created")}
    doc = (Path(__file__).resolve().parents[2] / "docs" / "endpoints.md").read_text()
    wildcards = [w.removesuffix("*") for w in re.findall(r"`(gpufrac_[a-z_]+\*)`", doc)]
    missing = [n for n in sorted(exposed) if f"`{n}`" not in doc and not any(n.startswith(w) for w in wildcards)]
    assert len(exposed) >= 20 and missing == []
