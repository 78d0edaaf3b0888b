"""deploy/ against the real API server, and ``gpufrac inspect`` over a live cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from harness.processes import free_port
from tests.e2e.conftest import Cluster, bind_directly, unique, wait_for_pods
from tests.e2e.helpers import gpu_pod, make_nodes, new_namespace

ROOT = Path(__file__).resolve().parents[2]


def test_deploy_manifests_pass_server_side_dry_run(cluster: Cluster) -> None:
    # A dry-run namespace is not created, so its namespaced objects would be refused.
    cluster.cp.kubectl("apply", "-f", str(ROOT / "deploy" / "base" / "namespace.yaml"))
    out = cluster.cp.kubectl("apply", "-k", str(ROOT / "deploy" / "base"), "--dry-run=server", "-o", "name")
    created = set(out.stdout.split())
    assert {"namespace/gpufrac-system", "serviceaccount/gpufrac-scheduler", "serviceaccount/gpufrac-extender",
            "clusterrole.rbac.authorization.k8s.io/gpufrac-extender",
            "deployment.apps/gpufrac-scheduler", "deployment.apps/gpufrac-extender",
            "service/gpufrac-extender", "networkpolicy.networking.k8s.io/gpufrac-extender",
            "validatingadmissionpolicy.admissionregistration.k8s.io/gpufrac-pods",
            "validatingadmissionpolicy.admissionregistration.k8s.io/gpufrac-bindings",
            "validatingadmissionpolicy.admissionregistration.k8s.io/gpufrac-gpu-models",
            "configmap/gpufrac-gpu-models"} <= created, out.stdout


def test_kustomize_keeps_every_object_in_its_own_namespace(cluster: Cluster) -> None:
    """kustomize's top-level ``namespace:`` moved the kube-system RoleBinding (kube-scheduler's
    read access to its authentication ConfigMap) into gpufrac-system, where it grants nothing."""
    rendered = list(yaml.safe_load_all(cluster.cp.kubectl("kustomize", str(ROOT / "deploy" / "base")).stdout))
    where = {(d["kind"], d["metadata"]["name"]): d["metadata"].get("namespace") for d in rendered if d}
    assert where[("RoleBinding", "gpufrac-scheduler-authentication-reader")] == "kube-system"
    # The claim ledgers' namespace holds only the extender's Role there (extender/fence.py).
    assert where[("Role", "gpufrac-extender-claims")] == where[("RoleBinding", "gpufrac-extender-claims")] \
        == "gpufrac-claims"
    namespaced = {k: ns for k, ns in where.items() if k[0] not in (
        "Namespace", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding") and k[1] not in (
        "gpufrac-scheduler-authentication-reader", "gpufrac-extender-claims")}
    assert set(namespaced.values()) == {"gpufrac-system"}, namespaced
    # and applied, kube-scheduler's account can really read that ConfigMap
    cluster.cp.kubectl("apply", "-f", str(ROOT / "deploy" / "base" / "namespace.yaml"))
    cluster.cp.kubectl("apply", "-f", str(ROOT / "deploy" / "base" / "rbac.yaml"))
    r = cluster.cp.kubectl("auth", "can-i", "get", "configmap/extension-apiserver-authentication", "-n",
                           "kube-system", "--as=system:serviceaccount:gpufrac-system:gpufrac-scheduler", check=False)
    assert r.stdout.strip() == "yes", r.stdout + r.stderr


def test_extender_runs_with_the_deployed_least_privilege_role(cluster: Cluster) -> None:
    """Apply the RBAC for real and check what the service account may and may not do."""
    cluster.cp.kubectl("apply", "-f", str(ROOT / "deploy" / "base" / "namespace.yaml"))
    cluster.cp.kubectl("apply", "-f", str(ROOT / "deploy" / "base" / "serviceaccount.yaml"))
    cluster.cp.kubectl("apply", "-f", str(ROOT / "deploy" / "base" / "rbac.yaml"))
    sa = "system:serviceaccount:gpufrac-system:gpufrac-extender"

    def can(verb: str, resource: str) -> bool:
        resource, _, sub = resource.partition("/")
        extra = [f"--subresource={sub}"] if sub else []
        r = cluster.cp.kubectl("auth", "can-i", verb, resource, *extra, f"--as={sa}",
                               "--all-namespaces", check=False)
        return r.stdout.strip() == "yes"

    # events: the Warning on GPU pods no scheduler attempts (extender/cluster/stall.py)
    for verb, resource in [("watch", "nodes"), ("list", "pods"), ("patch", "pods"), ("create", "pods/binding"),
                           ("create", "events")]:
        assert can(verb, resource), (verb, resource)

    def can_in(verb: str, resource: str, namespace: str) -> bool:
        r = cluster.cp.kubectl("auth", "can-i", verb, resource, f"--as={sa}", "-n", namespace, check=False)
        return r.stdout.strip() == "yes"

    # The claim ledgers: written in gpufrac-claims only, never beside its own configuration.
    assert all(can_in(v, "configmaps", "gpufrac-claims") for v in ("get", "list", "watch", "create", "update"))
    assert not any(can_in(v, "configmaps", "gpufrac-system") for v in ("create", "update", "delete"))
    assert not can_in("delete", "configmaps", "gpufrac-claims")
    # The admission policy's list of GPU models: that one ConfigMap, never the admin config.
    assert can_in("get", "configmap/gpufrac-gpu-models", "gpufrac-system")
    assert can_in("patch", "configmap/gpufrac-gpu-models", "gpufrac-system")
    assert not can_in("patch", "configmap/gpufrac-config", "gpufrac-system")
    # None of kube-scheduler's rights: gpufrac does not delete preemption victims.
    for verb, resource in [("delete", "nodes"), ("patch", "nodes"), ("get", "secrets"), ("create", "pods"),
                           ("delete", "pods"), ("update", "pods/status"), ("update", "events")]:
        assert not can(verb, resource), (verb, resource)

    # And gpufrac really works as that identity: it syncs, and its bind goes through.
    kubeconfig = cluster.cp.user_kubeconfig(sa, ["system:serviceaccounts", "system:serviceaccounts:gpufrac-system"])
    port = free_port()
    proc = cluster.cp.start_gpufrac(port, kubeconfig, extra=["--inventory-stale-after-s", "3600",
                                                              "--fence-namespace", "gpufrac-claims"],
                                    name="gpufrac-least-privilege")
    try:
        group = unique("rbac")
        node = make_nodes(cluster.api, group, count=1, gpus=1)[0]
        ns = new_namespace(cluster.api, group)
        pod = cluster.api.create_namespaced_pod(ns, gpu_pod("p", group, fraction="0.5", scheduler="nobody"))
        bind_directly(cluster, port, ns, "p", pod.metadata.uid, node)
        bound = cluster.api.read_namespaced_pod("p", ns)
        assert bound.spec.node_name == node and bound.metadata.annotations["gpufrac.io/assigned-gpus"]
        # fenced, as deployed: the claim went into the node's ledger first
        ledger = cluster.api.read_namespaced_config_map(f"gpufrac-claims-{node}", "gpufrac-claims")
        assert pod.metadata.uid in ledger.data["claims.json"]
    finally:
        proc.stop()


def test_inspect_shows_shares_memory_replicas_and_qos(cluster: Cluster) -> None:
    group = unique("inspect")
    node = make_nodes(cluster.api, group, count=1, gpus=1, replicas=4)[0]
    ns = new_namespace(cluster.api, group)
    cluster.api.create_namespaced_pod(ns, gpu_pod("a", group, fraction="0.5", memory="4Gi", qos="guaranteed"))
    cluster.api.create_namespaced_pod(ns, gpu_pod("b", group, fraction="0.25", qos="best-effort"))
    wait_for_pods(cluster, ns, ["a", "b"])
    cmd = [sys.executable, "-m", "extender", "inspect", "--kubeconfig", str(cluster.cp.admin_kubeconfig)]
    reports = json.loads(subprocess.run([*cmd, "--json"], capture_output=True, text=True, check=True).stdout)
    (mine,) = [r for r in reports if r["name"] == node]
    (gpu,) = mine["gpus"]
    # 500 + 250 milli; 4096 MiB + 0.25 x 24576 = 6144 MiB; 2 of 4 replica slots.
    assert (gpu["share_used_milli"], gpu["share_free_milli"]) == (750, 250)
    assert (gpu["memory_used_mib"], gpu["memory_free_mib"]) == (10240, 24576 - 10240)
    assert (gpu["replicas_used"], gpu["replicas_free"]) == (2, 2)
    assert sorted((p["pod"], p["qos"]) for p in gpu["pods"]) == [(f"{ns}/a", "guaranteed"), (f"{ns}/b", "best-effort")]
    table = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    (row,) = [line for line in table.splitlines() if line.startswith(node)]
    assert "0.75/0.25" in row and "10240/14336" in row and "2/2" in row and f"{ns}/a(guaranteed)" in row


def test_agent_manifests_pass_server_side_dry_run(cluster: Cluster) -> None:
    cluster.cp.kubectl("apply", "-f", str(ROOT / "deploy" / "base" / "namespace.yaml"))
    out = cluster.cp.kubectl("apply", "-k", str(ROOT / "deploy" / "agent"), "--dry-run=server", "-o", "name")
    assert {"serviceaccount/gpufrac-agent", "clusterrole.rbac.authorization.k8s.io/gpufrac-agent",
            "daemonset.apps/gpufrac-agent"} <= set(out.stdout.split()), out.stdout


def test_inspect_filters_watches_and_runs_as_a_kubectl_plugin(cluster: Cluster, tmp_path: Path) -> None:
    group = unique("filters")
    first, second = make_nodes(cluster.api, group, count=2, gpus=1, replicas=4)
    ours, theirs = new_namespace(cluster.api, f"{group}-a"), new_namespace(cluster.api, f"{group}-b")
    cluster.api.create_namespaced_pod(ours, gpu_pod("mine", group, fraction="0.5"))
    cluster.api.create_namespaced_pod(theirs, gpu_pod("other", group, fraction="0.75"))
    pods = wait_for_pods(cluster, ours, ["mine"]) | wait_for_pods(cluster, theirs, ["other"])
    where = {name: pod.spec.node_name for name, pod in pods.items()}
    cmd = [sys.executable, "-m", "extender", "inspect", "--kubeconfig", str(cluster.cp.admin_kubeconfig), "--json"]

    def inspect(*args: str) -> list[dict[str, Any]]:
        return list(json.loads(subprocess.run([*cmd, *args], capture_output=True, text=True, check=True).stdout))

    assert [r["name"] for r in inspect("--node", first, "--node", second)] == sorted([first, second])
    # -n: only the GPU holding a pod of that namespace, with only that pod listed
    (node,) = inspect("-n", ours)
    assert node["name"] == where["mine"] and [p["pod"] for p in node["gpus"][0]["pods"]] == [f"{ours}/mine"]
    # --tenant: the namespaces the admin config gives the tenant
    config = tmp_path / "gpufrac.yaml"
    config.write_text(f"tenants:\n  team-b:\n    namespaces: [{theirs}]\n")
    (node,) = inspect("--tenant", "team-b", "--config", str(config))
    assert node["name"] == where["other"] and [p["pod"] for p in node["gpus"][0]["pods"]] == [f"{theirs}/other"]
    bad = subprocess.run([*cmd, "--tenant", "nobody", "--config", str(config)], capture_output=True, text=True)
    assert bad.returncode != 0 and bad.stderr.strip().splitlines() == [
        f"gpufrac inspect: no tenant 'nobody' in {config} (tenants: team-b)"]
    # --watch: reads again each period (bounded here by the hidden --max-refreshes)
    watch = subprocess.run([*cmd[:-1], "--watch", "--interval-s", "0.2", "--max-refreshes", "2", "-n", ours],
                           capture_output=True, text=True, check=True).stdout
    assert watch.count(f"{ours}/mine(burstable)") == 2 and watch.count("Ctrl-C stops") == 2
    # as a kubectl plugin: kubectl finds kubectl-gpufrac on $PATH
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "KUBECONFIG": str(cluster.cp.admin_kubeconfig)}
    plugin = subprocess.run([str(cluster.cp.bins["kubectl"]), "gpufrac", "inspect", "-n", ours],
                            capture_output=True, text=True, env=env, timeout=60)
    assert plugin.returncode == 0, plugin.stderr
    (row,) = [line for line in plugin.stdout.splitlines() if line.startswith(where["mine"])]
    assert f"{ours}/mine" in row and f"{theirs}/other" not in plugin.stdout
