"""The defragmentation plan against the real API server and kube-scheduler (issue 41).

Two fake nodes of one A10 each. A best-effort pod of 0.5 runs on the first, a burstable pod
of 0.5 on the second, both of a ReplicaSet (bound here through gpufrac's own ``/bind``, so
the layout is the test's). A whole-GPU guaranteed pod then waits for fragmentation: 500 +
500 milli free in sum, no empty GPU. Without a PodDisruptionBudget the plan would free the
first node (one move of 500 either way; the lowest row wins) by moving the best-effort pod;
a PodDisruptionBudget over that pod (``minAvailable: 1``; no controller-manager here, so the
API server counts it as allowing nothing) makes the plan free the second node instead, moving
the burstable pod to the first (burstable room there: 1000 - 500 + 500 best-effort = 1000).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client

from extender.cache.moves import Move
from extender.cluster.defragmenter import evict
from harness import docs
from harness.processes import ROOT
from tests.e2e.conftest import Cluster, bind_directly, unique, wait_for_pods
from tests.e2e.helpers import gpu_pod, make_nodes, new_namespace

MANUAL = "defrag-manual"
"""The scheduler name of the pods this test binds itself (no scheduler serves it)."""


def owned(p: client.V1Pod, app: str, rs: client.V1ReplicaSet) -> client.V1Pod:
    p.metadata.labels = {"app": app}
    p.metadata.owner_references = [client.V1OwnerReference(
        api_version="apps/v1", kind="ReplicaSet", name=rs.metadata.name, uid=rs.metadata.uid, controller=True)]
    return p


def plan_of(cluster: Cluster, pod: str) -> dict[str, Any] | None:
    """gpufrac's last plan once it has a step for ``pod`` (other tests' pods may wait too)."""
    reply = httpx.get(f"{cluster.url}/defrag", timeout=10)
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body if any(s["pod"] == pod for s in body["steps"]) else None


def metric(cluster: Cluster, series: str) -> float:
    """One series' value from gpufrac's /metrics."""
    for line in httpx.get(f"{cluster.url}/metrics", timeout=10).text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} not exported")


def write_config(path: Path, evict: bool) -> None:
    path.write_text(f"defragmentation:\n  evict: {'true' if evict else 'false'}\n"
                    "  evict_after_s: 0\n  plan_every_s: 1\n")


def test_the_plan_names_real_pods_respects_a_pdb_and_evicts_through_the_api(
        cluster: Cluster, tmp_path: Path) -> None:
    group = unique("defrag")
    first, second = make_nodes(cluster.api, group, count=2, gpus=1, replicas=4)
    ns = new_namespace(cluster.api, group)
    apps = client.AppsV1Api(cluster.api.api_client)
    template = client.V1PodTemplateSpec(
        metadata=client.V1ObjectMeta(labels={"app": "x"}),
        spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="registry.k8s.io/pause:3.10")]))
    rs = apps.create_namespaced_replica_set(ns, client.V1ReplicaSet(
        metadata=client.V1ObjectMeta(name="workers"),
        spec=client.V1ReplicaSetSpec(replicas=0, selector=client.V1LabelSelector(match_labels={"app": "x"}),
                                     template=template)))
    for name, qos, node in (("be", "best-effort", first), ("bu", "burstable", second)):
        pod = cluster.api.create_namespaced_pod(
            ns, owned(gpu_pod(name, group, fraction="0.5", qos=qos, scheduler=MANUAL), name, rs))
        bind_directly(cluster, cluster.gpufrac_port, ns, name, pod.metadata.uid, node)
        # Running, as a kubelet would report it: the Eviction API lets a Pending pod go whatever
        # its PodDisruptionBudget says.
        cluster.api.patch_namespaced_pod_status(name, ns, {"status": {"phase": "Running"}})
    client.PolicyV1Api(cluster.api.api_client).create_namespaced_pod_disruption_budget(
        ns, client.V1PodDisruptionBudget(
            metadata=client.V1ObjectMeta(name="keep-be"),
            spec=client.V1PodDisruptionBudgetSpec(min_available=1,
                                                  selector=client.V1LabelSelector(match_labels={"app": "be"}))))
    cfg = tmp_path / "gpufrac.yaml"
    write_config(cfg, evict=False)
    cluster.gpufrac.kill()
    cluster.start_gpufrac(["--config", str(cfg), "--config-poll-s", "0.5"])
    try:
        cluster.api.create_namespaced_pod(ns, gpu_pod("big", group, qos="guaranteed"))
        try:
            made = cluster.wait(lambda: plan_of(cluster, f"{ns}/big"), 60, "a defragmentation plan with a step for big")
        except AssertionError as exc:
            raise AssertionError(f"last plan: {httpx.get(f'{cluster.url}/defrag', timeout=10).text}\n{exc}") from None
        assert made["evict"] is False
        assert f"{ns}/big" in made["waiting_for_fragmentation"]
        (step,) = [s for s in made["steps"] if s["pod"] == f"{ns}/big"]
        assert step["node"] == second
        assert [(m["pod"], m["node"], m["fits_on"], m["controller"]) for m in step["moves"]] == [
            (f"{ns}/bu", second, first, "ReplicaSet/workers")]
        # The pods it names are real: same UIDs as the API's.
        assert step["moves"][0]["uid"] == cluster.api.read_namespaced_pod("bu", ns).metadata.uid
        # Showing the plan changes nothing: big still waits, bu still runs.
        assert not cluster.api.read_namespaced_pod("big", ns).spec.node_name
        assert metric(cluster, "gpufrac_pods_waiting_for_fragmentation") >= 1  # big (other tests' pods may wait too)

        # The same plan from the command line, read from the API: docs/admin.md's command as
        # written, and its --json form.
        text = docs.run(docs.command("docs/admin.md", "gpufrac inspect --defrag"), cluster.cp.admin_kubeconfig,
                        ()).stdout
        assert f"{ns}/big (1 x 1 GPU): free node {second} by moving" in text, text
        assert f"{ns}/bu (burstable, 0.5 GPU, ReplicaSet/workers) -> fits on {first}" in text, text
        out = subprocess.run([sys.executable, "-m", "extender", "inspect", "--defrag", "--json",
                              "--kubeconfig", str(cluster.cp.admin_kubeconfig)],
                             capture_output=True, text=True, check=True, cwd=ROOT, timeout=120).stdout
        cli_step = [s for s in json.loads(out)["steps"] if s["pod"] == f"{ns}/big"]
        assert [(s["node"], [m["pod"] for m in s["moves"]]) for s in cli_step] == [(second, [f"{ns}/bu"])]

        # Acting on it (live reload): bu is evicted through the Eviction API, big then gets the
        # node held for it, be (the PodDisruptionBudget's) stays.
        write_config(cfg, evict=True)
        bound = wait_for_pods(cluster, ns, ["big"], timeout_s=90)["big"]
        assert bound.spec.node_name == second
        names = {p.metadata.name for p in cluster.api.list_namespaced_pod(ns).items}
        assert names == {"be", "big"}, names
        assert metric(cluster, 'gpufrac_defrag_evictions_total{result="evicted"}') >= 1
        # The node was held for big until its bind (the hold ends there, in the same lock).
        held = httpx.get(f"{cluster.url}/defrag", timeout=10).json()["held"]
        assert not [h for h in held if h["pod"] == f"{ns}/big"], held
        assert f"defragmentation: freeing node {second} for {ns}/big (1 move(s))" in cluster.gpufrac.tail(20000)

        # A PodDisruptionBudget blocks one: the Eviction API refuses to evict be (429), and be runs on.
        be = cluster.api.read_namespaced_pod("be", ns)
        move = Move(be.metadata.uid, f"{ns}/be", first, "best-effort", 0, 500, second, "ReplicaSet/workers")
        assert evict(cluster.api, move) == "blocked"
        assert cluster.api.read_namespaced_pod("be", ns).metadata.deletion_timestamp is None
    finally:
        cluster.gpufrac.kill()
        cluster.start_gpufrac()
