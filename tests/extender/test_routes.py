"""filter / prioritize / bind over HTTP, and bad input that must change nothing."""

from __future__ import annotations

import threading
from typing import Any, cast

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.conftest import gpu_node, pod_json
from tests.extender.helpers import client_for

NODES = [gpu_node("a", 1, model="T4"), gpu_node("b", 2, model="T4"), gpu_node("c", 1, model="V100M32",
                                                                            memory_mib=32768)]
NAMES = ["a", "b", "c"]


def add(client: TestClient, pod: dict[str, Any]) -> None:
    r = client.post("/standalone/pod-events", json=[{"type": "ADDED", "object": pod}])
    assert r.status_code == 200, r.text


def schedule(client: TestClient, pod: dict[str, Any], names: list[str] = NAMES) -> str:
    """Filter, prioritize, take the top score, bind (what kube-scheduler does)."""
    add(client, pod)
    f = client.post("/filter", json={"Pod": pod, "Nodes": None, "NodeNames": names}).json()
    assert f["Error"] == "", f
    passed = f["NodeNames"]
    if not passed:
        return ""
    scores = client.post("/prioritize", json={"Pod": pod, "Nodes": None, "NodeNames": passed}).json()
    host = str(max(scores, key=lambda h: h["Score"])["Host"])
    meta = pod["metadata"]
    b = client.post("/bind", json={"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                   "PodUID": meta["uid"], "Node": host}).json()
    assert b == {"Error": ""}
    return host


def test_quarter_pods_pack_on_one_gpu_then_spill() -> None:
    with client_for(NODES) as (client, cache):
        add(client, pod_json("whole"))  # a whole-GPU pod waiting: part of the learned demand
        hosts = [schedule(client, pod_json(f"q{i}", annotations={"gpufrac.io/fraction": "0.25"}))
                 for i in range(5)]
        allocs = {a["name"]: a for a in client.get("/allocations").json()}
    # FGD with demand {whole: 1, quarter: n}: a quarter on an empty GPU leaves 750 milli the
    # whole-GPU pod cannot use (dF = +750 p_whole), on the used GPU it shrinks that fragment
    # (dF = -250 p_whole): the four quarters fill one GPU exactly; the fifth needs another GPU
    first = (allocs["q0"]["node"], allocs["q0"]["gpu_indices"])
    assert all((allocs[f"q{i}"]["node"], allocs[f"q{i}"]["gpu_indices"]) == first for i in range(4))
    assert (allocs["q4"]["node"], allocs["q4"]["gpu_indices"]) != first
    assert hosts[4] != "" and cache.summary()["gpu_allocated_milli"] == 1250


def test_exactly_one_node_gets_the_top_score() -> None:
    with client_for([gpu_node(f"n{i}", 2) for i in range(6)]) as (client, _):
        pod = pod_json("p", annotations={"gpufrac.io/fraction": "0.5"})
        add(client, pod)
        scores = client.post("/prioritize", json={"Pod": pod, "NodeNames": [f"n{i}" for i in range(6)]}).json()
    values = [h["Score"] for h in scores]
    assert values.count(10) == 1 and all(0 <= v <= 10 for v in values)
    assert scores[0]["Host"] == "n0" and scores[0]["Score"] == 10  # equal floats: lowest row wins


def test_model_constraint_and_unresolvable_message() -> None:
    with client_for(NODES) as (client, _):
        pod = pod_json("m", annotations={"gpufrac.io/gpu-model": "V100M32"})
        assert schedule(client, pod) == "c"
        pod = pod_json("h", annotations={"gpufrac.io/gpu-model": "H100"})
        f = client.post("/filter", json={"Pod": pod, "NodeNames": NAMES}).json()
    assert f["NodeNames"] == []
    assert set(f["FailedAndUnresolvableNodes"]) == set(NAMES)
    assert 'gpufrac.io/gpu-model "H100"' in f["FailedAndUnresolvableNodes"]["a"]


def test_memory_no_gpu_of_the_node_has_is_the_reason_given_whatever_failed_first() -> None:
    # a's only T4 (16 GiB) holds a half-GPU pod: a whole GPU of 20 GiB fails there on share
    # first, but no share could ever make room for 20 GiB on a 16 GiB GPU: that is the reason.
    with client_for(NODES) as (client, _):
        assert schedule(client, pod_json("half", annotations={"gpufrac.io/fraction": "0.5"}), ["a"]) == "a"
        f = client.post("/filter", json={"Pod": pod_json("whole", annotations={"gpufrac.io/memory": "20Gi"}),
                                         "NodeNames": ["a", "c"]}).json()
    assert f["NodeNames"] == ["c"] and f["FailedNodes"] == {}
    assert f["FailedAndUnresolvableNodes"]["a"] == ("gpufrac: insufficient GPU memory: pod needs 20480Mi "
                                                   "(gpufrac.io/memory) on one GPU, more than any GPU of the node has")


def test_memory_headroom_is_respected() -> None:
    with client_for(NODES) as (client, _):
        # T4 has 16384 MiB: 20Gi fits only on the V100M32
        assert schedule(client, pod_json("big", annotations={"gpufrac.io/fraction": "0.1",
                                                              "gpufrac.io/memory": "20Gi"})) == "c"
        f = client.post("/filter", json={"Pod": pod_json("huge", annotations={
            "gpufrac.io/fraction": "0.1", "gpufrac.io/memory": "20Gi"}), "NodeNames": ["c"]}).json()
    # 32768 - 20480 = 12288 MiB left on c's only GPU
    assert f["FailedNodes"]["c"].startswith("gpufrac: insufficient GPU memory: pod needs 20480Mi")


@pytest.mark.parametrize(("body", "status", "message"), [
    (b"{not json", 400, "invalid request: body: Invalid JSON: key must be a string at line 1 column 2"),
    (b'{"Nodes": null, "NodeNames": ["a"]}', 400, "Pod: Field required"),
    (b'{"Pod": [], "NodeNames": ["a"]}', 400, "Pod: Input should be an object"),
    (b'{"Pod": {}, "NodeNames": "a"}', 400, "NodeNames: Input should be a valid array"),
])
def test_malformed_filter_bodies(body: bytes, status: int, message: str) -> None:
    # (these never come from kube-scheduler; a 4xx with the reason, nothing changed)
    with client_for(NODES) as (client, cache):
        before = cache.state_copy()
        r = client.post("/filter", content=body, headers={"Content-Type": "application/json"})
        after = cache.state_copy()
    assert r.status_code == status and message in r.json()["Error"]
    np.testing.assert_array_equal(before.gpu_used_milli, after.gpu_used_milli)


@pytest.mark.parametrize(("annotations", "gpus", "needle"), [
    ({"gpufrac.io/fraction": "abc"}, 1, 'gpufrac.io/fraction: "abc" is not a plain decimal number'),
    ({"gpufrac.io/fraction": "0"}, 1, 'gpufrac.io/fraction: "0" is out of range'),
    ({"gpufrac.io/fraction": "1.5"}, 1, 'gpufrac.io/fraction: "1.5" is out of range'),
    ({"gpufrac.io/fraction": "0.5"}, 2, "a share below 1 needs exactly 1 GPU"),
    ({"gpufrac.io/memory": "-8Gi"}, 1, 'gpufrac.io/memory: "-8Gi" must be > 0'),
    ({"gpufrac.io/memory": "8 gigs"}, 1, 'gpufrac.io/memory: "8 gigs" is not a Kubernetes quantity'),
    ({"gpufrac.io/qos": "gold"}, 1, 'gpufrac.io/qos: "gold" is not a QoS class'),
])
def test_bad_annotation_gives_filter_error_and_changes_nothing(annotations: dict[str, str], gpus: int,
                                                               needle: str) -> None:
    with client_for(NODES) as (client, cache):
        schedule(client, pod_json("ok", annotations={"gpufrac.io/fraction": "0.5"}))
        before = cache.summary()
        pod = pod_json("bad", gpus=gpus, annotations=annotations)
        f = client.post("/filter", json={"Pod": pod, "NodeNames": NAMES}).json()
        p = client.post("/prioritize", json={"Pod": pod, "NodeNames": NAMES})
        e = client.post("/standalone/pod-events", json=[{"type": "ADDED", "object": pod}])
        after = cache.summary()
    assert needle in f["Error"]
    assert p.status_code == 400 and needle in p.json()["Error"]
    assert e.status_code == 400 and needle in e.json()["Error"] and e.json()["Error"].startswith("events[0]")
    assert before == after


def test_unknown_node_names() -> None:
    with client_for(NODES) as (client, _):
        pod = pod_json("p")
        add(client, pod)
        f = client.post("/filter", json={"Pod": pod, "NodeNames": ["a", "ghost"]}).json()
        s = client.post("/prioritize", json={"Pod": pod, "NodeNames": ["a", "ghost"]}).json()
        b = client.post("/bind", json={"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p",
                                       "Node": "ghost"}).json()
        allocs = client.get("/allocations").json()
    assert f["NodeNames"] == ["a"] and "not in gpufrac's cache" in f["FailedNodes"]["ghost"]
    assert {h["Host"]: h["Score"] for h in s} == {"a": 10, "ghost": 0}
    assert b["Error"] == "gpufrac: node 'ghost' not in gpufrac's cache" and allocs == []


def test_bind_refuses_unknown_pod_and_a_node_that_no_longer_fits() -> None:
    with client_for([gpu_node("a", 1)]) as (client, cache):
        b = client.post("/bind", json={"PodName": "x", "PodNamespace": "d", "PodUID": "u", "Node": "a"}).json()
        assert "unknown: no pod event seen" in b["Error"]
        assert schedule(client, pod_json("w1")) == "a"
        add(client, pod_json("w2"))
        b = client.post("/bind", json={"PodName": "w2", "PodNamespace": "default", "PodUID": "uid-w2",
                                       "Node": "a"}).json()
        assert b["Error"].startswith("gpufrac: insufficient GPU share") and "(at bind, on a)" in b["Error"]
        assert cache.summary()["pods_bound"] == 1


def test_racing_binds_for_the_last_share_exactly_one_wins() -> None:
    with client_for([gpu_node("a", 1)]) as (client, _):
        pods = [pod_json(f"r{i}", annotations={"gpufrac.io/fraction": "0.6"}) for i in range(8)]
        for p in pods:
            add(client, p)
        results: list[str] = []

        def bind(p: dict[str, Any]) -> None:
            r = client.post("/bind", json={"PodName": p["metadata"]["name"], "PodNamespace": "default",
                                           "PodUID": p["metadata"]["uid"], "Node": "a"})
            results.append(r.json()["Error"])

        threads = [threading.Thread(target=bind, args=(p,)) for p in pods]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(results).count("") == 1 and len(results) == 8


def test_pod_events_account_cpu_only_pods_and_deletes_free() -> None:
    with client_for([gpu_node("a", 1, cpu_milli=4000)]) as (client, cache):
        cpu_pod = pod_json("cpu", gpus=None, cpu="3", node="a", phase="Running")
        for _ in range(2):  # the same event twice changes nothing more
            client.post("/standalone/pod-events", json=[{"type": "ADDED", "object": cpu_pod}])
        gpu_pod = pod_json("g", cpu="2")
        add(client, gpu_pod)
        f = client.post("/filter", json={"Pod": gpu_pod, "NodeNames": ["a"]}).json()
        assert f["FailedNodes"]["a"] == "gpufrac: insufficient cpu (pod requests 2000m)"
        client.post("/standalone/pod-events", json=[{"type": "DELETED", "object": cpu_pod}])
        assert schedule(client, gpu_pod, ["a"]) == "a"
        done = pod_json("g", cpu="2", node="a", phase="Succeeded")
        client.post("/standalone/pod-events", json=[{"type": "MODIFIED", "object": done}])
        assert cache.summary()["gpu_allocated_milli"] == 0 and cache.summary()["pods"] == 0


def test_bound_pod_event_with_assigned_gpus_rebuilds_allocation() -> None:
    with client_for([gpu_node("a", 2)]) as (client, cache):
        pod = pod_json("seen", node="a", phase="Running",
                       annotations={"gpufrac.io/fraction": "0.5", "gpufrac.io/assigned-gpus": "GPU-a-1"})
        client.post("/standalone/pod-events", json=[{"type": "ADDED", "object": pod}])
        assert cache.state_copy().gpu_used_milli.tolist() == [[0, 500]]


def test_node_cache_capable_false_returns_node_objects() -> None:
    with client_for(NODES, decision="prioritize") as (client, _):
        pod = pod_json("p", annotations={"gpufrac.io/gpu-model": "T4"})
        add(client, pod)
        items = [{"metadata": {"name": n}, "status": {}} for n in NAMES]
        f = client.post("/filter", json={"Pod": pod, "Nodes": {"items": items}, "NodeNames": None}).json()
    assert f["NodeNames"] is None
    assert [i["metadata"]["name"] for i in f["Nodes"]["items"]] == ["a", "b"]
    assert "c" in f["FailedAndUnresolvableNodes"]


def test_filter_decides_only_the_chosen_node_passes() -> None:
    # --decision filter (the default): of the nodes that fit, filter passes only the one
    # prioritize would give 10, so kube-scheduler skips scoring; the others are neither
    # passed nor failed. Nodes that do not fit keep their reasons for the pod's event.
    pod = pod_json("p", annotations={"gpufrac.io/gpu-model": "T4", "gpufrac.io/fraction": "0.5"})
    replies = {}
    for decision in ("filter", "prioritize"):
        with client_for(NODES, decision=decision) as (client, _):
            add(client, pod)
            f = client.post("/filter", json={"Pod": pod, "NodeNames": NAMES}).json()
            s = client.post("/prioritize", json={"Pod": pod, "NodeNames": ["a", "b"]}).json()
            items = [{"metadata": {"name": n}, "status": {}} for n in NAMES]
            objects = client.post("/filter", json={"Pod": pod, "Nodes": {"items": items}}).json()
        replies[decision] = (f, s, objects)
    decided, s, objects = replies["filter"]
    every, s_every, _ = replies["prioritize"]
    assert sorted(every["NodeNames"]) == ["a", "b"]
    top = next(h["Host"] for h in s_every if h["Score"] == 10)
    assert decided["NodeNames"] == [top] and s == s_every
    assert decided["FailedNodes"] == every["FailedNodes"] == {}
    assert set(decided["FailedAndUnresolvableNodes"]) == {"c"}
    assert decided["FailedAndUnresolvableNodes"] == every["FailedAndUnresolvableNodes"]
    assert [i["metadata"]["name"] for i in objects["Nodes"]["items"]] == [top]


def test_health_readiness_and_metrics() -> None:
    with client_for(NODES) as (client, _):
        schedule(client, pod_json("p"))
        assert client.get("/healthz").json() == {"status": "ok"}
        ready = client.get("/readyz").json()
        text = client.get("/metrics").text
    assert ready["ready"] and ready["gpus"] == 4 and ready["pods_bound"] == 1
    assert 'gpufrac_extender_request_duration_seconds_count{verb="filter"} 1.0' in text
    assert 'gpufrac_filter_nodes_total{outcome="passed"} 3.0' in text
    assert 'gpufrac_bind_total{result="ok"} 1.0' in text
    assert "gpufrac_cache_gpu_allocated_milli 1000.0" in text


def test_openapi_documents_the_wire_bodies() -> None:
    with client_for(NODES) as (client, _):
        spec = client.get("/openapi.json").json()
    body = spec["paths"]["/filter"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(body["properties"]) == {"Pod", "Nodes", "NodeNames"} and body["required"] == ["Pod"]
    assert "PodName" in str(spec["paths"]["/bind"]["post"]["requestBody"])
    assert "$ref" not in str(spec["paths"])  # self-contained: no dangling $defs references


def test_verbs_refuse_to_decide_until_the_cache_has_listed_every_pod() -> None:
    # Cluster mode lists Nodes, then Pods: in between every GPU would look free, and a bind
    # there could take share a running pod holds. Until /readyz says synced, filter and bind
    # answer Error (kube-scheduler retries the pod), prioritize and preempt 503; nothing is held.
    with client_for(NODES) as (client, cache):
        pod = pod_json("early", annotations={"gpufrac.io/fraction": "0.5"})
        add(client, pod)
        state = cast(FastAPI, client.app).state
        state.ready = lambda: False  # as between the node list and the pod list
        args = {"Pod": pod, "Nodes": None, "NodeNames": NAMES}
        f = client.post("/filter", json=args)
        assert f.status_code == 200 and "not ready" in f.json()["Error"] and f.json()["NodeNames"] is None
        assert client.post("/prioritize", json=args).status_code == 503
        meta = pod["metadata"]
        binding = {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": "a"}
        assert "not ready" in client.post("/bind", json=binding).json()["Error"]
        assert client.post("/preempt", json={"Pod": pod, "NodeNameToMetaVictims": {"a": {"Pods": []}}}).status_code == 503
        assert cache.allocations() == [] and cache.summary()["gpu_allocated_milli"] == 0
        assert client.get("/readyz").status_code == 503
        state.ready = lambda: True  # synced: business as usual
        assert client.post("/bind", json=binding).json() == {"Error": ""}
        assert cache.summary()["gpu_allocated_milli"] == 500


def test_small_filters_run_on_the_event_loop_large_ones_in_a_worker_thread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A thread hop costs more than a 50-node filter; a filter over more than
    # INLINE_MAX_CANDIDATES names (a full evaluation may take tens of milliseconds) still
    # leaves the event loop free for /healthz and /metrics.
    from extender.routes import webhook as routes
    from extender.verbs.filter import filter as real

    threads: list[str] = []

    def spy(*args: Any) -> Any:
        threads.append(threading.current_thread().name)
        return real(*args)

    monkeypatch.setattr(routes, "filter", spy)
    many = [f"ghost-{i}" for i in range(routes.INLINE_MAX_CANDIDATES + 1)]
    with client_for(NODES) as (client, _):
        pod = pod_json("p")
        add(client, pod)
        small = client.post("/filter", json={"Pod": pod, "NodeNames": NAMES}).json()
        large = client.post("/filter", json={"Pod": pod, "NodeNames": ["a", *many]}).json()
        loop_thread = threads[0]
    assert small["NodeNames"] and large["NodeNames"] == ["a"]
    assert len(threads) == 2 and threads[1] != loop_thread
