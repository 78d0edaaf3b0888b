"""Tenants (QoS ceiling, GPU quotas), preemption, live config reload and request limits,
through the extender's HTTP verbs on an in-memory cache."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from extender.admin_config import ConfigError, load_admin_config
from extender.app import create_app
from extender.cache import GpuCache
from extender.settings import Settings
from scoring.scorer import Scorer
from scoring.specs import NodeSpec
from tests.conftest import gpu_node, pod_json
from tests.extender.helpers import EVENTS_TOKEN

TENANTS = """
qos:
  isolate_guaranteed: true
  best_effort_oversubscription: 1.0
tenants:
  research:
    namespaces: [research]
    qos_ceiling: burstable
    quota: {gpu_milli: 1000}
  serving:
    namespaces: [serving]
    qos_ceiling: guaranteed
    quota: {gpu_memory_mib: 8192}
  batch:
    qos_ceiling: best-effort
default_tenant: batch
"""


@contextmanager
def app_with(nodes: list[NodeSpec], config: Path, **settings: Any) -> Iterator[tuple[TestClient, GpuCache]]:
    cache = GpuCache(load_scorer(config))
    cache.set_nodes(nodes)
    app = create_app(Settings(config_file=config, events_token=EVENTS_TOKEN, **settings), cache=cache)
    with TestClient(app, headers={"Authorization": f"Bearer {EVENTS_TOKEN}"}) as client:
        yield client, cache


def load_scorer(config: Path) -> Scorer:
    from scoring.scorer import build_scorer

    return build_scorer(load_admin_config(config).scoring)


def pod(name: str, ns: str, fraction: str | None = None, qos: str | None = None, gpus: int = 1,
        priority: int | None = None, memory: str | None = None) -> dict[str, Any]:
    ann = {}
    if fraction:
        ann["gpufrac.io/fraction"] = fraction
    if qos:
        ann["gpufrac.io/qos"] = qos
    if memory:
        ann["gpufrac.io/memory"] = memory
    p = pod_json(name, gpus=gpus, annotations=ann)
    p["metadata"]["namespace"] = ns
    if priority is not None:
        p["spec"]["priority"] = priority
    return p


def add(client: TestClient, p: dict[str, Any]) -> None:
    r = client.post("/standalone/pod-events", json=[{"type": "ADDED", "object": p}])
    assert r.status_code == 200, r.text


def filter_(client: TestClient, p: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return cast(dict[str, Any], client.post("/filter", json={"Pod": p, "Nodes": None, "NodeNames": names}).json())


def bind(client: TestClient, p: dict[str, Any], node: str) -> str:
    m = p["metadata"]
    return str(client.post("/bind", json={"PodName": m["name"], "PodNamespace": m["namespace"],
                                          "PodUID": m["uid"], "Node": node}).json()["Error"])


@pytest.fixture
def tenants_file(tmp_path: Path) -> Path:
    path = tmp_path / "gpufrac.yaml"
    path.write_text(TENANTS)
    return path


def test_qos_above_the_ceiling_fails_every_node_unresolvably(tenants_file: Path) -> None:
    with app_with([gpu_node("a", 1), gpu_node("b", 1)], tenants_file) as (client, cache):
        g = pod("g", "research", "0.5", "guaranteed")
        add(client, g)
        reply = filter_(client, g, ["a", "b"])
        msg = ("gpufrac: tenant 'research' may ask for QoS class burstable or lower; "
               "the pod asks for guaranteed")
        assert reply["NodeNames"] == [] and reply["FailedNodes"] == {}
        assert reply["FailedAndUnresolvableNodes"] == {"a": msg, "b": msg}
        scores = client.post("/prioritize", json={"Pod": g, "Nodes": None, "NodeNames": ["a", "b"]}).json()
        assert [s["Score"] for s in scores] == [0, 0]
        assert bind(client, g, "a") == msg + " (at bind)"
        assert cache.summary()["pods_bound"] == 0
        # the same pod at the ceiling, and the unlisted namespace's default tenant (best-effort)
        b = pod("b", "research", "0.5", "burstable")
        add(client, b)
        assert filter_(client, b, ["a", "b"])["NodeNames"] == ["a"]  # admitted: the chosen node passes
        other = pod("o", "scratch", "0.5", "burstable")
        add(client, other)
        assert "tenant 'batch' may ask for QoS class best-effort" in \
            filter_(client, other, ["a"])["FailedAndUnresolvableNodes"]["a"]


def test_share_quota_counts_bound_pods_and_frees_on_delete(tenants_file: Path) -> None:
    with app_with([gpu_node("a", 2)], tenants_file) as (client, cache):
        pods = [pod(f"r{i}", "research", "0.5") for i in range(3)]
        for p in pods[:2]:
            add(client, p)
            assert filter_(client, p, ["a"])["NodeNames"] == ["a"]
            assert bind(client, p, "a") == ""
        add(client, pods[2])
        # holds 0.5 + 0.5 = 1 GPU; 1 + 0.5 > quota 1
        assert filter_(client, pods[2], ["a"])["FailedAndUnresolvableNodes"]["a"] == (
            "gpufrac: tenant 'research' over GPU quota: holds 1 GPU, the pod asks for 0.5, quota 1")
        assert cache.usage(["research"]).gpu_milli == 1000
        client.post("/standalone/pod-events", json=[{"type": "DELETED", "object": pods[0]}])
        assert filter_(client, pods[2], ["a"])["NodeNames"] == ["a"]
        assert bind(client, pods[2], "a") == ""
        assert cache.usage(["research"]).gpu_milli == 1000


def test_memory_quota_is_checked_exactly_at_bind(tenants_file: Path) -> None:
    # T4 16384 MiB: a 0.25 pod without gpufrac.io/memory holds 16384 * 250 // 1000 = 4096 MiB.
    with app_with([gpu_node("a", 1)], tenants_file) as (client, cache):
        first, second, third = (pod(n, "serving", "0.25", "guaranteed") for n in ("s1", "s2", "s3"))
        for p in (first, second):
            add(client, p)
            assert bind(client, p, "a") == ""
        assert cache.usage(["serving"]).gpu_memory_mib == 8192
        add(client, third)
        # filter cannot know the memory of a proportional request before the GPU is chosen
        assert filter_(client, third, ["a"])["NodeNames"] == ["a"]
        assert bind(client, third, "a") == ("gpufrac: tenant 'serving' over GPU memory quota: holds "
                                            "8192Mi, the pod asks for 4096Mi, quota 8192Mi (at bind)")
        assert cache.summary()["pods_bound"] == 2
        explicit = pod("s4", "serving", "0.25", "guaranteed", memory="1Gi")
        add(client, explicit)
        assert "over GPU memory quota" in filter_(client, explicit, ["a"])["FailedAndUnresolvableNodes"]["a"]


@pytest.mark.parametrize(("text", "message"), [
    ("tenants:\n  a: {namespaces: [x]}\n  b: {namespaces: [y, x]}\n",
     "tenants.b.namespaces.1: namespace 'x' already belongs to tenant 'a'"),
    ("default_tenant: nobody\n", "default_tenant: unknown tenant 'nobody'"),
    ("tenants:\n  a: {qos_ceiling: platinum}\n", "tenants.a.qos_ceiling: Input should be 'guaranteed'"),
    ("tenants:\n  a: {quota: {gpu_milli: -1}}\n", "tenants.a.quota.gpu_milli: Input should be greater than or equal to 0"),
    ("qos:\n  best_effort_oversubscription: 5\n", "qos.best_effort_oversubscription: Input should be less than or equal to 4"),
])
def test_tenant_and_qos_config_errors_name_the_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_admin_config(path)
    assert message in str(exc.value)


def test_isolation_keeps_guaranteed_and_best_effort_apart(tenants_file: Path) -> None:
    with app_with([gpu_node("a", 1), gpu_node("b", 1)], tenants_file) as (client, _):
        g = pod("g", "serving", "0.25", "guaranteed")
        add(client, g)
        assert bind(client, g, "a") == ""
        be = pod("be", "scratch", "0.25", "best-effort")
        add(client, be)
        reply = filter_(client, be, ["a", "b"])
        assert reply["NodeNames"] == ["b"]
        assert reply["FailedNodes"] == {
            "a": "gpufrac: QoS isolation: a best-effort pod does not share a GPU with guaranteed pods"}


def one_gpu_full_of_pods(client: TestClient, held: list[tuple[str, str, int]]) -> list[dict[str, Any]]:
    """Bind (name, qos, priority) pods of 0.25 each on node a's only GPU."""
    out = []
    for name, qos, prio in held:
        p = pod(name, "scratch" if qos == "best-effort" else "research", "0.25", qos, priority=prio)
        add(client, p)
        assert bind(client, p, "a") == "", name
        out.append(p)
    return out


def preempt(client: TestClient, p: dict[str, Any], nodes: list[str]) -> dict[str, list[str]]:
    body = {"Pod": p, "NodeNameToVictims": None,
            "NodeNameToMetaVictims": {n: {"Pods": [{"UID": "proposed-by-kube-scheduler"}],
                                          "NumPDBViolations": 1} for n in nodes}}
    r = client.post("/preempt", json=body)
    assert r.status_code == 200, r.text
    reply = r.json()["NodeNameToMetaVictims"]
    assert all(v["NumPDBViolations"] == 1 and v["Pods"] for v in reply.values())
    return {n: [x["UID"] for x in v["Pods"]] for n, v in reply.items()}


def test_preempt_chooses_the_fewest_lowest_class_victims(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("qos: {best_effort_oversubscription: 1.0}\n")
    nodes = [gpu_node("a", 1, replicas=4), gpu_node("b", 1, replicas=4)]
    with app_with(nodes, path) as (client, cache):
        one_gpu_full_of_pods(client, [("be1", "best-effort", 0), ("bu1", "burstable", 0),
                                      ("be2", "best-effort", 0), ("be3", "best-effort", 5)])
        before = cache.state_copy()
        # a guaranteed 0.5 pod: the GPU is full (1000 milli, 4 of 4 slots); two 0.25 victims
        # are needed; best-effort first, lowest priority first: be1, be2 (not be3, priority 5)
        g = pod("g", "research", "0.5", "guaranteed", priority=100)
        add(client, g)
        # node b is empty: the pod fits there without preemption, so b is left out
        assert preempt(client, g, ["a", "b"]) == {"a": ["uid-be1", "uid-be2"]}
        after = cache.state_copy()
        for name in ("gpu_used_milli", "gpu_pods", "gpu_qos_pods", "gpu_best_effort_milli", "cpu_used_milli"):
            np.testing.assert_array_equal(getattr(before, name), getattr(after, name))
        assert cache.summary()["pods_bound"] == 4
        # a 1.0 guaranteed pod needs all four; the burstable pod is a lower class too
        whole = pod("w", "research", None, "guaranteed", priority=100)
        add(client, whole)
        assert sorted(preempt(client, whole, ["a"])["a"]) == ["uid-be1", "uid-be2", "uid-be3", "uid-bu1"]
        # a burstable preemptor may take best-effort victims only: three of them free 0.75
        b = pod("b", "research", "0.75", "burstable", priority=100)
        add(client, b)
        assert sorted(preempt(client, b, ["a"])["a"]) == ["uid-be1", "uid-be2", "uid-be3"]
        # ...but 1.0 would need the burstable pod, an equal class: no node
        b1 = pod("b1", "research", None, "burstable", priority=100)
        add(client, b1)
        assert preempt(client, b1, ["a"]) == {}
        # never a victim of a higher priority: a preemptor at priority 3 cannot take be3 (5)
        low = pod("low", "research", None, "guaranteed", priority=3)
        add(client, low)
        assert preempt(client, low, ["a"]) == {}


def test_preempt_rejects_a_bad_pod_with_400(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("{}\n")
    with app_with([gpu_node("a", 1)], path) as (client, _):
        bad = pod("bad", "x", "1.5")
        r = client.post("/preempt", json={"Pod": bad, "NodeNameToMetaVictims": {"a": {"Pods": []}}})
        assert r.status_code == 400 and "gpufrac.io/fraction" in r.json()["Error"]


def test_config_reload_changes_scores_and_a_broken_edit_keeps_the_old(tmp_path: Path) -> None:
    path = tmp_path / "gpufrac.yaml"
    path.write_text("scoring:\n  preset: packing\n")

    def edit(text: str) -> None:
        # replaced whole, as kubelet swaps a ConfigMap volume: write_text truncates first,
        # and a poll between truncate and write reads an empty (valid, default) config
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)

    # node a holds half a GPU; b is empty: packing puts a quarter pod on a, spread on b
    with app_with([gpu_node("a", 1), gpu_node("b", 1)], path, config_poll_s=0.05) as (client, _):
        held = pod("held", "default", "0.5")
        add(client, held)
        assert bind(client, held, "a") == ""
        q = pod("q", "default", "0.25")
        add(client, q)

        def top() -> str:
            scores = client.post("/prioritize", json={"Pod": q, "Nodes": None, "NodeNames": ["a", "b"]}).json()
            return str(max(scores, key=lambda s: s["Score"])["Host"])

        def metric(name: str) -> float:
            for line in client.get("/metrics").text.splitlines():
                if line.startswith(name + " ") or line.startswith(name + "{"):
                    return float(line.rsplit(" ", 1)[1])
            return 0.0

        def wait_for(check: Any) -> None:
            deadline = time.monotonic() + 10
            while not check():
                assert time.monotonic() < deadline, "config change not applied within 10 s"
                time.sleep(0.05)

        assert top() == "a"
        edit("scoring:\n  preset: spread\n")
        wait_for(lambda: top() == "b")
        assert metric('gpufrac_config_reloads_total{result="applied"}') == 1
        edit("scoring:\n  weights: {spread: -1}\n")
        wait_for(lambda: metric('gpufrac_config_reloads_total{result="rejected"}') == 1)
        assert metric("gpufrac_config_valid") == 0
        assert top() == "b"  # the previous config stays in force
        edit("scoring:\n  preset: packing\n")
        wait_for(lambda: top() == "a")
        assert metric("gpufrac_config_valid") == 1


def test_request_bodies_over_the_limit_get_413_and_change_nothing(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("{}\n")
    with app_with([gpu_node("a", 1)], path, max_request_body_bytes=4096) as (client, cache):
        p = pod("p", "default", "0.5")
        p["metadata"]["annotations"]["padding"] = "x" * 5000
        r = client.post("/standalone/pod-events", json=[{"type": "ADDED", "object": p}])
        assert r.status_code == 413
        # the same body streamed without a Content-Length
        body = r.request.content

        def chunks() -> Iterator[bytes]:
            for i in range(0, len(body), 1000):
                yield body[i:i + 1000]

        r = client.post("/standalone/pod-events", content=chunks(),
                        headers={"content-type": "application/json"})
        assert r.status_code == 413
        assert cache.pod_intent("uid-p") is None
        small = pod("s", "default", "0.5")
        add(client, small)
        assert cache.pod_intent("uid-s") is not None


def test_tls_settings_come_in_pairs(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="give both or neither"):
        Settings(tls_cert_file=tmp_path / "c.pem")
    with pytest.raises(ValidationError, match="client certificates need"):
        Settings(tls_client_ca_file=tmp_path / "ca.pem")


def test_nvml_usage_heartbeat_patches_in_place_and_guaranteed_sees_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from podspec.pods import pod_intent
    from scoring.scorer import ScoringConfig, build_scorer

    node = gpu_node("a", 1)
    cache = GpuCache(build_scorer(ScoringConfig({"gpu_best_fit": 1.0})))
    cache.set_nodes([node])
    g = pod_intent(pod("g", "default", "0.5", "guaranteed"))
    assert cache.evaluate(g, ["a"]).evaluation.node_fits[0]

    def no_rebuild() -> None:
        raise AssertionError("a usage-only heartbeat rebuilt the arrays")

    monkeypatch.setattr(cache._ledger, "rebuild", no_rebuild)
    # NVML sees 12000 of 16384 MiB used: a guaranteed half (8192 MiB) no longer fits
    busy = replace(node, gpus=(replace(node.gpus[0], memory_used_mib=12000),))
    cache.upsert_nodes([busy])
    assert int(cache.state_copy().gpu_mem_nvml_used_mib[0, 0]) == 12000
    assert not cache.evaluate(g, ["a"]).evaluation.node_fits[0]
    b = pod_intent(pod("b", "default", "0.5", "burstable"))
    assert cache.evaluate(b, ["a"]).evaluation.node_fits[0]  # burstable reserves share only


def test_namespace_label_names_the_tenant_and_its_quota_is_shared(tenants_file: Path) -> None:
    tenants_file.write_text(TENANTS + "tenant_label: gpufrac.io/tenant\n")
    with app_with([gpu_node("a", 2)], tenants_file) as (client, cache):
        cache.set_namespaces({"ml": {"gpufrac.io/tenant": "research"}, "web": {"gpufrac.io/tenant": "nobody"}})
        g = pod("g", "ml", "0.5", "guaranteed")
        add(client, g)
        assert "tenant 'research' may ask for QoS class burstable" in \
            filter_(client, g, ["a"])["FailedAndUnresolvableNodes"]["a"]
        # a label naming no tenant falls back to default_tenant (batch: best-effort only)
        w = pod("w", "web", "0.5", "burstable")
        add(client, w)
        assert "tenant 'batch'" in filter_(client, w, ["a"])["FailedAndUnresolvableNodes"]["a"]
        # research's one-GPU quota spans its listed namespace and the labelled one:
        # 0.5 (research) + 0.5 (ml) = 1; a third half in ml is over
        for p in (pod("r", "research", "0.5"), pod("m1", "ml", "0.5")):
            add(client, p)
            assert bind(client, p, "a") == ""
        m2 = pod("m2", "ml", "0.5")
        add(client, m2)
        assert "over GPU quota: holds 1 GPU" in filter_(client, m2, ["a"])["FailedAndUnresolvableNodes"]["a"]
        # relabelled to serving (no share quota): admitted at once
        cache.upsert_namespace("ml", {"gpufrac.io/tenant": "serving"})
        assert filter_(client, m2, ["a"])["NodeNames"] == ["a"]
        cache.upsert_namespace("ml", None)  # deleted: back to the default tenant
        assert "tenant 'batch'" in filter_(client, m2, ["a"])["FailedAndUnresolvableNodes"]["a"]
