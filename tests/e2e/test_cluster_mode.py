"""gpufrac in cluster mode with the real kube-apiserver and kube-scheduler.

Each test owns a namespace and a group of fake nodes (label ``gpufrac.io/test-group``; its
pods select it), so the tests share one control plane without seeing each other's pods.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import random
from pathlib import Path

import httpx
import pytest
from kubernetes import client

from tests.e2e.conftest import Cluster, failed_scheduling_message, unique, wait_for_pods, wait_node_known
from tests.e2e.helpers import check_invariants, gpu_pod, make_nodes, new_namespace


def assigned(pod: client.V1Pod) -> list[str]:
    return [u for u in (pod.metadata.annotations or {}).get("gpufrac.io/assigned-gpus", "").split(",") if u]


def test_quarter_pods_pack_one_gpu_and_a_fifth_goes_elsewhere(cluster: Cluster) -> None:
    group = unique("pack")
    make_nodes(cluster.api, group, count=2, gpus=2, replicas=8)
    ns = new_namespace(cluster.api, group)
    # A whole-GPU pod first: with it in the learned demand, a quarter on an empty GPU leaves
    # 750 milli that pod cannot use, on a used GPU it shrinks that fragment (FGD).
    cluster.api.create_namespaced_pod(ns, gpu_pod("whole", group))
    whole = wait_for_pods(cluster, ns, ["whole"])["whole"]
    for i in range(4):
        cluster.api.create_namespaced_pod(ns, gpu_pod(f"q{i}", group, fraction="0.25"))
    pods = wait_for_pods(cluster, ns, [f"q{i}" for i in range(4)])
    gpus = {tuple(assigned(p)) for p in pods.values()}
    nodes = {p.spec.node_name for p in pods.values()}
    assert not gpus & {tuple(assigned(whole))}
    # 4 x 250 milli = 1000: all four fill one GPU of one node.
    assert len(gpus) == 1 and len(nodes) == 1, (gpus, nodes)
    ann = pods["q0"].metadata.annotations
    assert ann["gpufrac.io/assigned-fraction"] == "0.25"
    assert ann["gpufrac.io/assigned-memory"] == "6144Mi"  # 0.25 x 24576 MiB
    assert ann["gpufrac.io/assigned-at"].endswith("Z")

    cluster.api.create_namespaced_pod(ns, gpu_pod("q4", group, fraction="0.25"))
    fifth = wait_for_pods(cluster, ns, ["q4"])["q4"]
    assert tuple(assigned(fifth)) not in gpus  # that GPU is full
    assert check_invariants(cluster.api) == []


def test_cpu_only_pod_of_the_gpufrac_scheduler_is_placed_and_bound_by_gpufrac(cluster: Cluster) -> None:
    # The shipped profile lists no managedResources: kube-scheduler sends CPU-only pods of
    # gpufrac-scheduler to gpufrac too, which binds them (its allocation record, no GPUs).
    group = unique("cpu")
    nodes = make_nodes(cluster.api, group, count=2, gpus=1)
    ns = new_namespace(cluster.api, group)
    pod = gpu_pod("cpu", group, cpu="500m")
    pod.spec.containers[0].resources.limits = None
    cluster.api.create_namespaced_pod(ns, pod)
    bound = wait_for_pods(cluster, ns, ["cpu"])["cpu"]
    ann = bound.metadata.annotations or {}
    assert bound.spec.node_name in nodes
    assert ann.get("gpufrac.io/assigned-gpus") == "" and ann["gpufrac.io/assigned-at"].endswith("Z"), ann
    assert check_invariants(cluster.api) == []


def test_memory_headroom_is_respected(cluster: Cluster) -> None:
    group = unique("mem")
    make_nodes(cluster.api, group, count=1, gpus=1, replicas=8)
    ns = new_namespace(cluster.api, group)
    cluster.api.create_namespaced_pod(ns, gpu_pod("big", group, fraction="0.25", memory="16Gi"))
    wait_for_pods(cluster, ns, ["big"])
    # Share is free (250 of 1000 used) but 16 GiB + 16 GiB > 24 GiB.
    cluster.api.create_namespaced_pod(ns, gpu_pod("second", group, fraction="0.25", memory="16Gi"))
    msg = failed_scheduling_message(cluster, ns, "second")
    assert "insufficient GPU memory: pod needs 16384Mi" in msg, msg
    assert not cluster.api.read_namespaced_pod("second", ns).spec.node_name


def test_model_constraint_and_a_model_no_node_has(cluster: Cluster) -> None:
    group = unique("model")
    make_nodes(cluster.api, group + "-a10", count=1, gpus=1, model="A10")
    t4 = make_nodes(cluster.api, group + "-t4", count=1, gpus=1, model="T4", memory_mib=15360)
    for name in (f"{group}-a10-000", t4[0]):
        cluster.api.patch_node(name, {"metadata": {"labels": {"gpufrac.io/test-group": group}}})
    ns = new_namespace(cluster.api, group)
    cluster.api.create_namespaced_pod(ns, gpu_pod("wants-t4", group, fraction="0.5", model="T4"))
    assert wait_for_pods(cluster, ns, ["wants-t4"])["wants-t4"].spec.node_name == t4[0]

    cluster.api.create_namespaced_pod(ns, gpu_pod("wants-h100", group, fraction="0.5", model="H100"))
    msg = failed_scheduling_message(cluster, ns, "wants-h100")
    assert 'gpufrac.io/gpu-model "H100"' in msg, msg
    assert not cluster.api.read_namespaced_pod("wants-h100", ns).spec.node_name


@pytest.mark.parametrize(("fraction", "rule"), [
    ("abc", 'gpufrac.io/fraction: "abc" is not a plain decimal number'),
    ("1.5", 'gpufrac.io/fraction: "1.5" is out of range'),
])
def test_bad_annotation_reaches_the_pod_events(cluster: Cluster, fraction: str, rule: str) -> None:
    group = unique("bad")
    make_nodes(cluster.api, group, count=1, gpus=1)
    ns = new_namespace(cluster.api, group)
    cluster.api.create_namespaced_pod(ns, gpu_pod("bad", group, fraction=fraction))
    msg = failed_scheduling_message(cluster, ns, "bad")
    assert rule in msg, msg


def test_an_inventory_that_stops_changing_makes_the_node_infeasible(cluster: Cluster) -> None:
    """Freshness is judged by when this replica saw the heartbeat change (issue 52), never by
    the agent's clock: an agent two hours behind is fresh while it beats, its node turns
    infeasible once the heartbeat stops changing for the window, and a new beat brings it back."""
    import datetime as dt

    from harness.controlplane import inventory_annotation
    from harness.processes import LOOPBACK, free_port

    window_s = 12.0
    port = free_port()
    proc = cluster.cp.start_gpufrac(port, extra=["--inventory-stale-after-s", str(window_s)],
                                    name="gpufrac-short-stale-window")
    try:
        group = unique("stale")
        behind = dt.datetime.now(dt.UTC) - dt.timedelta(hours=2)
        node = make_nodes(cluster.api, group, count=1, gpus=1, heartbeat=behind)[0]
        url = f"http://{LOOPBACK}:{port}"
        pod = {"metadata": {"name": "p", "namespace": "default", "uid": "stale-probe",
                            "annotations": {"gpufrac.io/fraction": "0.5"}},
               "spec": {"containers": [{"name": "c", "resources": {"limits": {"gpufrac.io/gpu": "1"}}}]}}

        def reason() -> str:
            reply = httpx.post(f"{url}/filter", json={"Pod": pod, "Nodes": None, "NodeNames": [node]},
                               timeout=10).json()
            return "" if node in (reply.get("NodeNames") or []) else str(reply.get("FailedNodes", {}).get(node))

        wait_node_known(cluster, node, url=url)
        assert reason() == "", "a node first seen counts as fresh, whatever its agent's clock says"
        def stale() -> str | None:
            why = reason()
            return why if "inventory stale" in why else None

        cluster.wait(stale, window_s + 30, "the node to turn stale")
        beat = behind + dt.timedelta(seconds=1)
        gpus = json.loads(cluster.api.read_node(node).metadata.annotations["gpufrac.io/inventory"])["gpus"]
        cluster.api.patch_node(node, {"metadata": {"annotations": {
            "gpufrac.io/inventory": inventory_annotation(node, gpus, beat)}}})
        cluster.wait(lambda: reason() == "", 30, "a changed heartbeat to make the node fresh again")
    finally:
        proc.stop()


def test_deleting_a_pod_frees_its_share(cluster: Cluster) -> None:
    group = unique("free")
    make_nodes(cluster.api, group, count=1, gpus=1)
    ns = new_namespace(cluster.api, group)
    cluster.api.create_namespaced_pod(ns, gpu_pod("first", group, fraction="0.75"))
    wait_for_pods(cluster, ns, ["first"])
    cluster.api.create_namespaced_pod(ns, gpu_pod("second", group, fraction="0.5"))
    msg = failed_scheduling_message(cluster, ns, "second")
    assert "insufficient GPU share" in msg, msg
    # No kubelet: force-delete, as the node would confirm the container gone.
    cluster.api.delete_namespaced_pod("first", ns, grace_period_seconds=0)
    # Well inside kube-scheduler's 5-minute flush of unschedulable pods: whether its retry on
    # the deletion came after gpufrac's watch applied it, or gpufrac requeued the pod after.
    wait_for_pods(cluster, ns, ["second"], timeout_s=30)
    assert check_invariants(cluster.api) == []


def test_two_binds_racing_for_the_last_share_one_wins(cluster: Cluster) -> None:
    group = unique("race")
    node = make_nodes(cluster.api, group, count=1, gpus=1)[0]
    ns = new_namespace(cluster.api, group)
    # schedulerName nobody serves: only our direct /bind calls place them.
    uids = {}
    for name in ("a", "b"):
        pod = cluster.api.create_namespaced_pod(ns, gpu_pod(name, group, fraction="0.6", scheduler="nobody"))
        uids[name] = pod.metadata.uid

    wait_node_known(cluster, node)

    def bind(name: str) -> str:
        body = {"PodName": name, "PodNamespace": ns, "PodUID": uids[name], "Node": node}
        return str(httpx.post(f"{cluster.url}/bind", json=body, timeout=30).json().get("Error", ""))

    with cf.ThreadPoolExecutor(2) as pool:
        errors = list(pool.map(bind, ["a", "b"]))
    assert sorted(bool(e) for e in errors) == [False, True], errors
    loser = "ab"[errors.index(next(e for e in errors if e))]
    assert "insufficient GPU share" in next(e for e in errors if e)
    pods = {p.metadata.name: p for p in cluster.api.list_namespaced_pod(ns).items}
    winner = "b" if loser == "a" else "a"
    assert pods[winner].spec.node_name == node and len(assigned(pods[winner])) == 1
    # The loser was rolled back: not bound, no allocation record left on it.
    assert not pods[loser].spec.node_name and not assigned(pods[loser])
    assert check_invariants(cluster.api) == []


def mixed_pod(i: int, group: str, rnd: random.Random) -> client.V1Pod:
    kind = rnd.choices(["frac", "frac-mem", "whole", "two"], weights=[6, 2, 1, 1])[0]
    if kind == "frac":
        return gpu_pod(f"m{i:03d}", group, fraction=rnd.choice(["0.1", "0.25", "0.3", "0.5"]))
    if kind == "frac-mem":
        return gpu_pod(f"m{i:03d}", group, fraction=rnd.choice(["0.2", "0.4"]),
                       memory=rnd.choice(["2Gi", "6Gi", "10Gi"]))
    if kind == "whole":
        return gpu_pod(f"m{i:03d}", group, gpus=1)
    return gpu_pod(f"m{i:03d}", group, gpus=2)


def test_stream_survives_sigkill_and_restart(cluster: Cluster) -> None:
    """200 mixed pods onto 50 nodes x 8 GPUs; gpufrac SIGKILLed mid-stream and restarted."""
    group = unique("stream")
    make_nodes(cluster.api, group, count=50, gpus=8, replicas=4, cpu="64", memory="256Gi")
    ns = new_namespace(cluster.api, group)
    rnd = random.Random(42)
    pods = [mixed_pod(i, group, rnd) for i in range(200)]
    names = [p.metadata.name for p in pods]

    def bound_count() -> int:
        return sum(1 for p in cluster.api.list_namespaced_pod(ns).items if p.spec.node_name)

    with cf.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda p: cluster.api.create_namespaced_pod(ns, p), pods[:100]))
    cluster.wait(lambda: bound_count() >= 40, 60, "40 pods bound")
    cluster.gpufrac.kill()  # SIGKILL in the middle of the stream
    with cf.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda p: cluster.api.create_namespaced_pod(ns, p), pods[100:]))
    cluster.start_gpufrac()
    wait_for_pods(cluster, ns, names, timeout_s=180)
    assert check_invariants(cluster.api) == []

    # The cache rebuilt from the API equals the cache that made the decisions.
    before = cluster.allocations()
    cluster.gpufrac.kill()
    cluster.start_gpufrac()
    after = cluster.allocations()
    assert after == before
    ours = [a for a in after if a["namespace"] == ns]
    assert len(ours) == 200
    by_name = {p.metadata.name: p for p in cluster.api.list_namespaced_pod(ns).items}
    for a in ours:
        pod = by_name[a["name"]]
        assert a["node"] == pod.spec.node_name
        assert a["gpu_uuids"] == assigned(pod)


def test_readyz_is_false_until_the_first_sync(cluster: Cluster, tmp_path: Path) -> None:
    """A gpufrac that cannot reach its API server never says ready."""
    from harness.processes import free_port, start

    bad = tmp_path / "bad.kubeconfig"
    cfg = json.loads(json.dumps(__import__("yaml").safe_load(cluster.cp.admin_kubeconfig.read_text())))
    cfg["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    bad.write_text(json.dumps(cfg))
    port = free_port()
    proc = cluster.cp.track(start("gpufrac-unsynced", [
        __import__("sys").executable, "-m", "extender", "serve", "--mode", "cluster",
        "--kubeconfig", str(bad), "--host", "127.0.0.1", "--port", str(port)], tmp_path))
    try:
        r = cluster.wait(lambda: _get(f"http://127.0.0.1:{port}/readyz"), 30, "unsynced gpufrac serving")
        assert r is not None and r.status_code == 503 and r.json()["ready"] is False
        health = _get(f"http://127.0.0.1:{port}/healthz")
        assert health is not None and health.status_code == 200
    finally:
        proc.stop()


def _get(url: str) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=2)
    except httpx.HTTPError:
        return None


def test_finished_pod_frees_its_share_and_a_vanished_node_its_gpus(cluster: Cluster) -> None:
    group = unique("done")
    node = make_nodes(cluster.api, group, count=1, gpus=1)[0]
    ns = new_namespace(cluster.api, group)
    cluster.api.create_namespaced_pod(ns, gpu_pod("job", group, fraction="0.75"))
    wait_for_pods(cluster, ns, ["job"])
    cluster.api.create_namespaced_pod(ns, gpu_pod("next", group, fraction="0.5"))
    failed_scheduling_message(cluster, ns, "next")
    # The kubelet would report the container's exit: the pod Succeeded, its share is free.
    cluster.api.patch_namespaced_pod_status("job", ns, {"status": {"phase": "Succeeded"}})
    wait_for_pods(cluster, ns, ["next"], timeout_s=90)

    cluster.api.delete_node(node)
    cluster.wait(lambda: all(a["node"] != node for a in cluster.allocations()), 30,
                 "allocations on the deleted node dropped")
    # No controller-manager runs here: do what its pod GC does with pods bound to a node that
    # is gone, so that later tests' cluster-wide invariant checks see a consistent cluster.
    for name in ("job", "next"):
        cluster.api.delete_namespaced_pod(name, ns, grace_period_seconds=0)
    cluster.wait(lambda: not cluster.api.list_namespaced_pod(ns).items, 30, "orphaned pods collected")
