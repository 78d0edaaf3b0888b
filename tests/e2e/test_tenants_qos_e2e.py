"""Tenants, QoS isolation, preemption, live config and TLS with the real control plane.

The module restarts the session's gpufrac with an admin config file (tenants, isolation) and
gives the session its plain gpufrac back at the end. Each test owns a namespace and a group
of fake nodes, as in ``test_cluster_mode``.
"""

from __future__ import annotations

import os
import ssl
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client

from harness.processes import LOOPBACK, free_port, start, wait_until
from tests.e2e.conftest import Cluster, failed_scheduling_message, unique, wait_for_pods
from tests.e2e.helpers import check_invariants, gpu_pod, make_nodes, new_namespace

LIMITED = unique("limited")
"""Namespace of the tenant with ceiling burstable and a one-GPU quota."""

CONFIG = f"""
qos:
  isolate_guaranteed: true
tenants:
  limited:
    namespaces: [{LIMITED}]
    qos_ceiling: burstable
    quota: {{gpu_milli: 1000}}
tenant_label: gpufrac.io/tenant
"""


@pytest.fixture(scope="module")
def config_file(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The session's gpufrac, restarted with the admin config (polled every 0.2 s)."""
    path = tmp_path_factory.mktemp("admin") / "gpufrac.yaml"
    path.write_text(CONFIG)
    new_namespace(cluster.api, LIMITED)
    cluster.gpufrac.stop()
    cluster.start_gpufrac(["--config", str(path), "--config-poll-s", "0.2"])
    yield path
    cluster.gpufrac.stop()
    cluster.start_gpufrac()


def edit(path: Path, text: str) -> None:
    """Replace the admin config as kubelet swaps a mounted ConfigMap: atomically. (An in-place
    write can be polled half written, a shorter but valid config that then gets applied.)"""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def assigned(pod: client.V1Pod) -> list[str]:
    return [u for u in (pod.metadata.annotations or {}).get("gpufrac.io/assigned-gpus", "").split(",") if u]


def test_guaranteed_and_best_effort_never_share_a_gpu(cluster: Cluster, config_file: Path) -> None:
    group = unique("iso")
    make_nodes(cluster.api, group, count=1, gpus=2, replicas=8)
    ns = new_namespace(cluster.api, group)
    cluster.api.create_namespaced_pod(ns, gpu_pod("g", group, fraction="0.25", qos="guaranteed"))
    g = wait_for_pods(cluster, ns, ["g"])["g"]
    # best fit alone would put these on g's GPU (the tighter fit); isolation sends them to the other
    for i in range(2):
        cluster.api.create_namespaced_pod(ns, gpu_pod(f"be{i}", group, fraction="0.25", qos="best-effort"))
    pods = wait_for_pods(cluster, ns, ["be0", "be1"])
    assert assigned(pods["be0"]) == assigned(pods["be1"])  # packed together...
    assert assigned(pods["be0"]) != assigned(g)  # ...away from the guaranteed pod
    # more of both kinds, and burstable pods that may share with either
    for name, qos in (("g2", "guaranteed"), ("be2", "best-effort"), ("b0", "burstable"), ("b1", "burstable")):
        cluster.api.create_namespaced_pod(ns, gpu_pod(name, group, fraction="0.125", qos=qos))
    pods = wait_for_pods(cluster, ns, ["g", "be0", "be1", "g2", "be2", "b0", "b1"])
    classes: dict[str, set[str]] = {}
    for p in pods.values():
        for uuid in assigned(p):
            classes.setdefault(uuid, set()).add(p.metadata.annotations["gpufrac.io/qos"])
    assert all(not {"guaranteed", "best-effort"} <= c for c in classes.values()), classes
    assert check_invariants(cluster.api) == []


def test_tenant_asking_above_its_ceiling_gets_a_failed_scheduling_event(
        cluster: Cluster, config_file: Path) -> None:
    group = unique("ceil")
    make_nodes(cluster.api, group, count=1, gpus=1)
    cluster.api.create_namespaced_pod(LIMITED, gpu_pod(f"{group}-g", group, fraction="0.25", qos="guaranteed"))
    msg = failed_scheduling_message(cluster, LIMITED, f"{group}-g")
    assert ("tenant 'limited' may ask for QoS class burstable or lower; the pod asks for guaranteed"
            in msg), msg
    assert not cluster.api.read_namespaced_pod(f"{group}-g", LIMITED).spec.node_name


def test_a_namespace_labelled_with_a_tenant_gets_its_rules_and_a_relabel_applies_live(
        cluster: Cluster, config_file: Path) -> None:
    group = unique("label")
    make_nodes(cluster.api, group, count=1, gpus=1)
    cluster.api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
        name=group, labels={"gpufrac.io/tenant": "limited"})))
    cluster.api.create_namespaced_pod(group, gpu_pod("g", group, fraction="0.25", qos="guaranteed"))
    msg = failed_scheduling_message(cluster, group, "g")
    assert "tenant 'limited' may ask for QoS class burstable or lower" in msg, msg
    # the namespace leaves the tenant: gpufrac's namespace watch sees it, and the pod is
    # placed when kube-scheduler retries it (an update to the pod is such an event)
    cluster.api.patch_namespace(group, {"metadata": {"labels": {"gpufrac.io/tenant": None}}})
    cluster.wait(lambda: not httpx.post(f"{cluster.url}/filter", json={
        "Pod": cluster.api.api_client.sanitize_for_serialization(cluster.api.read_namespaced_pod("g", group)),
        "NodeNames": [f"{group}-000"]}, timeout=10).json()["FailedAndUnresolvableNodes"], 10,
                 "the relabel seen by gpufrac")
    cluster.api.patch_namespaced_pod("g", group, {"metadata": {"annotations": {"retry": "1"}}})
    wait_for_pods(cluster, group, ["g"], timeout_s=60)


def test_tenant_over_quota_is_rejected(cluster: Cluster, config_file: Path) -> None:
    group = unique("quota")
    make_nodes(cluster.api, group, count=1, gpus=2, replicas=8)
    names = [f"{group}-{i}" for i in range(3)]
    for name in names[:2]:
        cluster.api.create_namespaced_pod(LIMITED, gpu_pod(name, group, fraction="0.5"))
    wait_for_pods(cluster, LIMITED, names[:2])
    cluster.api.create_namespaced_pod(LIMITED, gpu_pod(names[2], group, fraction="0.5"))
    msg = failed_scheduling_message(cluster, LIMITED, names[2])
    assert "tenant 'limited' over GPU quota: holds 1 GPU, the pod asks for 0.5, quota 1" in msg, msg
    # deleting one frees quota: the third pod is placed (gpufrac requeues it)
    cluster.api.delete_namespaced_pod(names[0], LIMITED, grace_period_seconds=0)
    wait_for_pods(cluster, LIMITED, [names[2]], timeout_s=60)


def test_config_edit_changes_scores_without_restart_and_a_broken_one_is_kept_out(
        cluster: Cluster, config_file: Path) -> None:
    group = unique("reload")
    nodes = make_nodes(cluster.api, group, count=2, gpus=1, replicas=8)
    ns = new_namespace(cluster.api, group)
    cluster.api.create_namespaced_pod(ns, gpu_pod("held", group, fraction="0.5"))
    held = wait_for_pods(cluster, ns, ["held"])["held"].spec.node_name
    probe: dict[str, Any] = {"metadata": {"name": "probe", "namespace": ns, "uid": "probe-reload"},
             "spec": {"containers": [{"name": "c", "resources": {"limits": {"gpufrac.io/gpu": "1"}}}]},
             "status": {"phase": "Pending"}}
    probe["metadata"]["annotations"] = {"gpufrac.io/fraction": "0.25"}

    def top() -> str:
        reply = httpx.post(f"{cluster.url}/prioritize", json={"Pod": probe, "Nodes": None, "NodeNames": nodes},
                           timeout=10).json()
        return str(max(reply, key=lambda h: h["Score"])["Host"])

    def metric(name: str) -> float:
        for line in httpx.get(f"{cluster.url}/metrics", timeout=10).text.splitlines():
            if line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    pid = cluster.gpufrac.popen.pid
    try:
        packing = CONFIG + "scoring:\n  preset: packing\n"
        edit(config_file, packing)
        cluster.wait(lambda: top() == held, 10, "packing: next to the half-used GPU")
        spread = CONFIG + "scoring:\n  preset: spread\n"
        edit(config_file, spread)
        started = time.monotonic()
        cluster.wait(lambda: top() != held, 10, "prioritize reply after the config edit")
        assert time.monotonic() - started < 10
        edit(config_file, CONFIG + "scoring:\n  weights: {spread: -1}\n")
        cluster.wait(lambda: metric("gpufrac_config_valid") == 0, 10, "the broken edit reported")
        assert top() != held  # the previous (spread) config stays in force
        assert "config reload rejected" in cluster.gpufrac.tail(20000)
        assert "scoring.weights.spread" in cluster.gpufrac.tail(20000)
        edit(config_file, packing)
        cluster.wait(lambda: top() == held, 10, "a valid config again")
        applied = 'gpufrac_config_reloads_total{result="applied"}'
        before = metric(applied)
        edit(config_file, CONFIG)  # the module's config, for the tests after this one
        cluster.wait(lambda: metric(applied) > before, 10, "the module's config back")
    finally:
        edit(config_file, CONFIG)  # the module's config, whatever happened above
    assert cluster.gpufrac.popen.pid == pid and cluster.gpufrac.popen.poll() is None  # never restarted


def test_high_priority_guaranteed_pod_preempts_exactly_the_best_effort_pods_it_needs(
        cluster: Cluster, config_file: Path) -> None:
    group = unique("preempt")
    # 2 GPUs x 2 replica slots: kube-scheduler counts 4 gpufrac.io/gpu slots on the node
    (node,) = make_nodes(cluster.api, group, count=1, gpus=2, replicas=2)
    ns = new_namespace(cluster.api, group)
    high = f"{group}-high"
    client.SchedulingV1Api(cluster.api.api_client).create_priority_class(client.V1PriorityClass(
        metadata=client.V1ObjectMeta(name=high), value=100000, preemption_policy="PreemptLowerPriority"))
    # GPU A: two best-effort halves; GPU B: a burstable 0.75 and a best-effort 0.25 (by best fit)
    for name, fraction, qos in (("be-a1", "0.5", "best-effort"), ("be-a2", "0.5", "best-effort"),
                                ("bu-b", "0.75", "burstable"), ("be-b", "0.25", "best-effort")):
        cluster.api.create_namespaced_pod(ns, gpu_pod(name, group, fraction=fraction, qos=qos))
        wait_for_pods(cluster, ns, [name])
    pods = {p.metadata.name: p for p in cluster.api.list_namespaced_pod(ns).items}
    gpu_a = assigned(pods["be-a1"])
    assert assigned(pods["be-a2"]) == gpu_a and assigned(pods["bu-b"]) == assigned(pods["be-b"]) != gpu_a
    uids = {n: p.metadata.uid for n, p in pods.items()}

    preemptor = gpu_pod("g", group, fraction="0.5", qos="guaranteed")
    preemptor.spec.priority_class_name = high
    cluster.api.create_namespaced_pod(ns, preemptor)

    def bound_after_preemption() -> client.V1Pod | None:
        # No kubelet runs on fake nodes: act as one and finish any graceful deletion that
        # kube-scheduler's preemption started (pods with grace 0 are gone at once).
        pods = cluster.api.list_namespaced_pod(ns).items
        for p in pods:
            if p.metadata.deletion_timestamp is not None:
                cluster.api.delete_namespaced_pod(p.metadata.name, ns, grace_period_seconds=0)
        g = next((p for p in pods if p.metadata.name == "g"), None)
        return g if g is not None and g.spec.node_name else None

    g = cluster.wait(bound_after_preemption, 60, "the preemptor bound")
    # isolation: a guaranteed pod needs GPU A free of best-effort pods (both, 0.5 + 0.5);
    # GPU B would need the burstable pod and the best-effort one; one pair suffices, and
    # the best-effort pair comes first
    assert g.spec.node_name == node and assigned(g) == gpu_a
    left = {p.metadata.name: p.metadata.uid for p in cluster.api.list_namespaced_pod(ns).items}
    assert left == {"bu-b": uids["bu-b"], "be-b": uids["be-b"], "g": g.metadata.uid}
    # kube-scheduler's own dry run needs one replica slot (one victim); the pair is gpufrac's
    assert 'gpufrac_extender_request_duration_seconds_count{verb="preempt"}' in \
        httpx.get(f"{cluster.url}/metrics", timeout=10).text
    assert check_invariants(cluster.api) == []


def test_kube_scheduler_calls_gpufrac_over_https_with_a_client_certificate(
        cluster: Cluster, config_file: Path) -> None:
    tls = cluster.cp.extender_tls("gpufrac-scheduler-client")
    port = free_port()
    url = f"https://{LOOPBACK}:{port}"
    # The test CA's serving certificate names 127.0.0.1; gpufrac serves with it and accepts
    # only clients whose certificate that CA signed.
    proc = cluster.cp.track(start("gpufrac-tls", [
        sys.executable, "-m", "extender", "serve", "--mode", "cluster",
        "--kubeconfig", str(cluster.cp.admin_kubeconfig), "--host", LOOPBACK, "--port", str(port),
        "--inventory-stale-after-s", "600", "--log-level", "info", *tls.serve_args()], cluster.cp.workdir,
        env={"GPUFRAC_SCHEDULER_NAME": "gpufrac-tls", "PYTHONPATH": os.pathsep.join(sys.path)}))
    with_cert = httpx.Client(verify=tls.client_context(), timeout=5)
    wait_until(lambda: with_cert.get(f"{url}/readyz").status_code == 200, 60, "gpufrac-tls /readyz", proc)
    without_cert = httpx.Client(verify=ssl.create_default_context(cafile=str(tls.client_ca)), timeout=5)
    with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError, ssl.SSLError)):
        without_cert.get(f"{url}/readyz")
    with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
        httpx.get(f"http://{LOOPBACK}:{port}/readyz", timeout=5)  # plain HTTP is not spoken

    # The project's config with the https URL, the CA and kube-scheduler's client certificate.
    sched = cluster.cp.start_scheduler(url, name="kube-scheduler-tls", profile="gpufrac-tls", extender_tls=tls)
    try:
        group = unique("tls")
        make_nodes(cluster.api, group, count=1, gpus=1)
        ns = new_namespace(cluster.api, group)
        cluster.api.create_namespaced_pod(ns, gpu_pod("p", group, fraction="0.5", scheduler="gpufrac-tls"))
        p = wait_for_pods(cluster, ns, ["p"])["p"]
        assert p.metadata.annotations["gpufrac.io/assigned-fraction"] == "0.5"
        metrics = with_cert.get(f"{url}/metrics").text
        assert 'gpufrac_bind_total{result="ok"} 1.0' in metrics
    finally:
        sched.stop()
        proc.stop()
