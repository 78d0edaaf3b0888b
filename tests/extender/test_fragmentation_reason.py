"""A pod whose request is free in pieces is told so, and counted, in standalone mode as in cluster mode."""

from __future__ import annotations

from typing import Any

from extender.cache import GpuCache
from extender.metrics import Metrics
from extender.verbs.filter import ExtenderArgs, filter
from tests.extender.helpers import bestfit_cache, send_event, trace_pod, v100_node


def place(cache: GpuCache, p: dict[str, Any], node_name: str) -> None:
    send_event(cache, "ADDED", p)
    m = p["metadata"]
    cache.bind(m["uid"], m["namespace"], m["name"], node_name)


def waiting_gauge(cache: GpuCache) -> float:
    text = Metrics(cache.summary, cache.metrics_view).exposition().decode()
    line = next(x for x in text.splitlines() if x.startswith("gpufrac_pods_waiting_for_fragmentation "))
    return float(line.split()[1])


def test_filter_says_the_request_is_free_in_pieces_and_the_gauge_counts_the_pod() -> None:
    # a and b: 2 GPUs each, one GPU of each holds 600. Free: 400 + 1000 on each, 2800 in sum.
    # A pod of 2 whole GPUs (2000) fits neither, yet its request is free in sum on both:
    # fragmentation, on 2 nodes.
    cache = bestfit_cache([v100_node("a"), v100_node("b")])
    place(cache, trace_pod("on-a", 1, 600), "a")
    place(cache, trace_pod("on-b", 1, 600), "b")
    big = trace_pod("big", 2, 1000)
    send_event(cache, "ADDED", big)
    body = filter(cache, ExtenderArgs(Pod=big, NodeNames=["a", "b"]), True).body
    assert body["NodeNames"] == []
    for name in ("a", "b"):
        assert body["FailedNodes"][name] == (
            "gpufrac: insufficient GPU share: pod needs 2 GPU(s) with a whole unshared GPU; "
            "the 2000 milli-GPU it asks is free in pieces on 2 nodes: fragmentation")
    # Standalone mode (no defragmentation plan runs): /metrics counts it at scrape time.
    assert waiting_gauge(cache) == 1.0
    # One of the pods leaves: big fits b now, it waits for nothing.
    send_event(cache, "DELETED", trace_pod("on-b", 1, 600))
    assert waiting_gauge(cache) == 0.0
    assert filter(cache, ExtenderArgs(Pod=big, NodeNames=["a", "b"]), True).body["NodeNames"] == ["b"]


def test_a_pod_waiting_for_capacity_gets_the_plain_reason_and_is_not_counted() -> None:
    # Free in sum: 400 + 1000 = 1400 < 2000: the room is not there at all.
    cache = bestfit_cache([v100_node("a")])
    place(cache, trace_pod("on-a", 1, 600), "a")
    big = trace_pod("big", 2, 1000)
    send_event(cache, "ADDED", big)
    body = filter(cache, ExtenderArgs(Pod=big, NodeNames=["a"]), True).body
    assert body["FailedNodes"]["a"] == "gpufrac: insufficient GPU share: pod needs 2 GPU(s) with a whole unshared GPU"
    assert waiting_gauge(cache) == 0.0


def test_in_cluster_mode_the_gauge_is_the_last_plans() -> None:
    cache = bestfit_cache([v100_node("a"), v100_node("b")])
    place(cache, trace_pod("on-a", 1, 600), "a")
    place(cache, trace_pod("on-b", 1, 600), "b")
    send_event(cache, "ADDED", trace_pod("big", 2, 1000))
    cache.count_waiting = False  # what the app sets in cluster mode
    metrics = Metrics(cache.summary, cache.metrics_view)
    text = metrics.exposition().decode()
    assert "\ngpufrac_pods_waiting_for_fragmentation 0.0\n" in text  # no plan made yet
    metrics.cluster.planned_waiting = 3
    assert "\ngpufrac_pods_waiting_for_fragmentation 3.0\n" in metrics.exposition().decode()
