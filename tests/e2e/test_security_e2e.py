"""Issue 22 against the real kube-apiserver: poison pods, forged records, the shipped policy.

- A pod no parser should accept, pending in another namespace under any scheduler name, does
  not keep gpufrac from becoming ready after a restart, nor from scheduling others; it is
  listed at ``/quarantine`` and counted in ``gpufrac_rejected_objects_total``; and the
  restart still loses no allocation.
- The shipped ``deploy/base/admission-policy.yaml`` (ValidatingAdmissionPolicy, evaluated by
  the API server) refuses a user pod that writes ``gpufrac.io/assigned-gpus`` itself, a user
  update that adds or changes it, a Binding carrying it from anyone but gpufrac's service
  account, a GPU pod under another scheduler or with ``spec.nodeName`` set, and any change
  by gpufrac's account beyond the requeue annotation; gpufrac, as that account, still binds.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.rest import ApiException

from harness.controlplane import ControlPlane
from harness.processes import free_port, wait_until
from tests.e2e.conftest import Cluster, bind_directly, unique, wait_for_pods
from tests.e2e.helpers import gpu_pod, make_nodes, new_namespace

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "base"
EXTENDER_SA = "system:serviceaccount:gpufrac-system:gpufrac-extender"
FORGED = {"gpufrac.io/assigned-gpus": "GPU-forged-0", "gpufrac.io/assigned-fraction": "1"}


def poison_pod(name: str, scheduler: str, **limits: str) -> client.V1Pod:
    pod = gpu_pod(name, "nowhere", scheduler=scheduler, extra_annotations={"gpufrac.io/fraction": "1e-1000030"})
    pod.spec.containers[0].resources.limits.update(limits)
    return pod


def test_poison_pods_elsewhere_do_not_stop_readiness_scheduling_or_the_restart(cluster: Cluster) -> None:
    group = unique("poison")
    make_nodes(cluster.api, group, count=2, gpus=2)
    ns = new_namespace(cluster.api, group)
    mallory = new_namespace(cluster.api, f"{group}-mallory")
    # The pods: a fraction that underflows to 0, and 1000Mi GPUs (was an OOM kill).
    cluster.api.create_namespaced_pod(mallory, poison_pod("underflow", "nobody"))
    cluster.api.create_namespaced_pod(mallory, poison_pod("huge", "gpufrac-scheduler", **{"gpufrac.io/gpu": "1000Mi"}))
    try:
        cluster.api.create_namespaced_pod(ns, gpu_pod("before", group, fraction="0.5"))
        wait_for_pods(cluster, ns, ["before"])
        before = cluster.allocations()
        cluster.gpufrac.kill()
        cluster.start_gpufrac()  # waits for /readyz: was never 200 with the underflow pod present
        assert cluster.allocations() == before  # the restart lost nothing
        quarantined = {q["key"]: q["message"] for q in httpx.get(f"{cluster.url}/quarantine", timeout=10).json()}
        assert "is not a plain decimal number" in quarantined[f"{mallory}/underflow"]
        assert "is too large (at most 64 GPUs)" in quarantined[f"{mallory}/huge"]
        metrics = httpx.get(f"{cluster.url}/metrics", timeout=10).text
        assert 'gpufrac_rejected_objects_total{kind="pod"' in metrics
        # and every other tenant is scheduled as usual
        names = [f"after-{i}" for i in range(4)]
        for n in names:
            cluster.api.create_namespaced_pod(ns, gpu_pod(n, group, fraction="0.25"))
        wait_for_pods(cluster, ns, names)
    finally:
        cluster.api.delete_namespace(mallory)


MISTAKES: list[tuple[dict[str, str], bool, str]] = [
    ({"gpufrac.io/fractoin": "0.5"}, True, "did you mean gpufrac.io/fraction?"),
    ({"gpufrac.io/memroy": "8Gi"}, True, "did you mean gpufrac.io/memory?"),
    ({"gpufrac.io/gpu-modle": "A10"}, True, "did you mean gpufrac.io/gpu-model?"),
    ({"gpufrac.io/gpu": "1"}, True, "gpufrac.io/gpu is a container resource, set it in resources.limits"),
    ({"gpufrac.io/fraction": "0.5"}, False, "add resources.limits gpufrac.io/gpu: 1 to the container"),
    ({"gpufrac.io/fraction": "1.5"}, True, "must be a decimal in [0.001, 1]"),
    ({"gpufrac.io/fraction": "0.0001"}, True, "at most 3 decimal places"),
    ({"gpufrac.io/fraction": "half"}, True, "(the share of one GPU)"),
    ({"gpufrac.io/memory": "8 GB"}, True, "must be a positive Kubernetes quantity of GPU memory"),
    ({"gpufrac.io/qos": "gold"}, True, "use guaranteed, burstable or best-effort"),
]
"""(annotations, whether the container asks for gpufrac.io/gpu, what the refusal must say)."""


def _apply_policy(cluster: Cluster, action: str) -> None:
    cluster.cp.kubectl(action, "-f", str(BASE / "admission-policy.yaml"), *(["--wait=true"] if action == "delete" else []))


def _refused(call: Any, *args: Any, **kw: Any) -> str:
    """The API's message for a refused call (fails the test if it went through)."""
    with pytest.raises(ApiException) as exc:
        call(*args, **kw)
    assert exc.value.status in (403, 422), exc.value
    return str(exc.value.body)


def test_shipped_admission_policy_keeps_the_allocation_record_gpufracs(cluster: Cluster) -> None:
    for name in ("namespace.yaml", "serviceaccount.yaml", "rbac.yaml"):
        cluster.cp.kubectl("apply", "-f", str(BASE / name))
    group = unique("vap")
    node = make_nodes(cluster.api, group, count=1, gpus=2)[0]
    ns = new_namespace(cluster.api, group)
    _apply_policy(cluster, "apply")
    try:
        # The policy is compiled by the API server a moment after it is created: poll.
        def forged_refused() -> bool:
            pod = gpu_pod(unique("forged"), group, extra_annotations=FORGED)
            try:
                cluster.api.create_namespaced_pod(ns, pod)
            except ApiException as exc:
                return exc.status in (403, 422) and "allocation record" in str(exc.body)
            cluster.api.delete_namespaced_pod(pod.metadata.name, ns)
            return False
        cluster.wait(forged_refused, 60, "the admission policy refuses a forged record")

        # A pod gpufrac will place: nobody else may add the record to it, or bind it with one.
        # (Its node selector matches no node, so kube-scheduler leaves it to this test.)
        pending = gpu_pod("honest", group, fraction="0.5")
        pending.spec.node_selector = {"gpufrac.io/test-group": f"{group}-none"}
        pod = cluster.api.create_namespaced_pod(ns, pending)
        msg = _refused(cluster.api.patch_namespaced_pod, "honest", ns, {"metadata": {"annotations": FORGED}})
        assert "may not set, change or remove them" in msg
        binding = client.V1Binding(
            metadata=client.V1ObjectMeta(name="honest", namespace=ns, annotations=FORGED),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=node))
        msg = _refused(cluster.api.create_namespaced_pod_binding, "honest", ns, binding, _preload_content=False)
        assert "only gpufrac's service account may create one" in msg
        # GPU pods are gpufrac's to place: not under another scheduler, not pinned by nodeName.
        other = gpu_pod("elsewhere", group, scheduler="default-scheduler")
        assert "must set spec.schedulerName: gpufrac-scheduler" in _refused(
            cluster.api.create_namespaced_pod, ns, other)
        pinned = gpu_pod("pinned", group)
        pinned.spec.node_name = node
        assert "must not set spec.nodeName" in _refused(cluster.api.create_namespaced_pod, ns, pinned)
        # A CPU-only pod with no record is not affected.
        cpu_only = gpu_pod("cpu-only", group, scheduler="nobody")
        cpu_only.spec.containers[0].resources.limits = {}
        cluster.api.create_namespaced_pod(ns, cpu_only)

        # Mistakes refused when made, each with its fix (issue 53); the honest spellings pass.
        for i, (annotations, gpus, fix) in enumerate(MISTAKES):
            wrong = gpu_pod(f"mistake-{i}", group, scheduler="gpufrac-scheduler", extra_annotations=annotations)
            if not gpus:
                wrong.spec.containers[0].resources.limits = {}
            assert fix in _refused(cluster.api.create_namespaced_pod, ns, wrong), (annotations, fix)
        fine = gpu_pod("fine", group, fraction="0.5", memory="8Gi", qos="best-effort", model="A10|T4")
        fine.spec.node_selector = {"gpufrac.io/test-group": f"{group}-none"}
        cluster.api.create_namespaced_pod(ns, fine)
        for value in ("1", "0.001", ".25", "0.2500"):
            ok = gpu_pod(unique("frac"), group, fraction=value)
            ok.spec.node_selector = {"gpufrac.io/test-group": f"{group}-none"}
            cluster.api.create_namespaced_pod(ns, ok)

        # gpufrac, running as its own service account, binds with the record.
        kubeconfig = cluster.cp.user_kubeconfig(EXTENDER_SA, ["system:serviceaccounts",
                                                              "system:serviceaccounts:gpufrac-system"])
        port = free_port()
        proc = cluster.cp.start_gpufrac(port, kubeconfig, extra=["--inventory-stale-after-s", "3600"],
                                        name="gpufrac-as-its-service-account")
        try:
            bind_directly(cluster, port, ns, "honest", pod.metadata.uid, node)
            bound = cluster.api.read_namespaced_pod("honest", ns)
            assert bound.spec.node_name == node and bound.metadata.annotations["gpufrac.io/assigned-gpus"]
            # Its pod patch right reaches the requeue annotation and nothing else.
            sa_api = client.CoreV1Api(client.ApiClient(_config(kubeconfig)))
            sa_api.patch_namespaced_pod("honest", ns, {"metadata": {"annotations": {"gpufrac.io/requeue": "x"}}})
            assert "only the gpufrac.io/requeue annotation" in _refused(
                sa_api.patch_namespaced_pod, "honest", ns, {"metadata": {"labels": {"evil": "yes"}}})
            # Once written, the record is nobody else's to change or remove.
            assert "may not set, change or remove them" in _refused(
                cluster.api.patch_namespaced_pod, "honest", ns,
                {"metadata": {"annotations": {"gpufrac.io/assigned-gpus": None}}})
        finally:
            proc.stop()
    finally:
        _apply_policy(cluster, "delete")

        # Later tests share this API server: wait until the policy is gone from admission.
        def lifted() -> bool:
            pod = gpu_pod(unique("after"), group, scheduler="nobody", extra_annotations=FORGED)
            try:
                cluster.api.create_namespaced_pod(ns, pod)
            except ApiException:
                return False
            return True
        cluster.wait(lifted, 60, "the admission policy lifted")
        cluster.api.delete_namespace(ns)


@pytest.fixture(scope="module")
def own_control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane no other test has created and deleted admission policies on: up to at
    least v1.36, kube-apiserver stops resolving a ConfigMap parameter for good once the last
    binding using that kind is deleted (kubernetes/kubernetes#130887; docs/pod-api.md)."""
    cp = ControlPlane.up(Path(tmp_path_factory.mktemp("models-kube")))
    yield cp
    cp.down()


def test_gpu_models_no_node_has_are_refused_at_create(own_control_plane: ControlPlane, tmp_path: Path) -> None:
    """deploy/base's gpufrac-gpu-models policy with the list the extender keeps, as its own
    service account: a model in the wrong case gets a did-you-mean, one no node has the list;
    a known one passes; Warn instead of Deny lets the pod in with kubectl's warning."""
    cp = own_control_plane
    api = client.CoreV1Api(kube_config.new_client_from_config(config_file=str(cp.admin_kubeconfig)))
    for name in ("namespace.yaml", "serviceaccount.yaml", "rbac.yaml", "admission-policy.yaml"):
        cp.kubectl("apply", "-f", str(BASE / name))
    group = unique("models")
    make_nodes(api, group, count=1, gpus=2, model="A10")
    make_nodes(api, group + "-t4", count=1, gpus=1, model="T4")
    ns = new_namespace(api, group)
    kubeconfig = cp.user_kubeconfig(EXTENDER_SA, ["system:serviceaccounts", "system:serviceaccounts:gpufrac-system"])
    proc = cp.start_gpufrac(free_port(), kubeconfig, name="gpufrac-models", extra=[
        "--inventory-stale-after-s", "3600", "--gpu-models-configmap", "gpufrac-system/gpufrac-gpu-models"])
    try:
        def published() -> str | None:
            cm = api.read_namespaced_config_map("gpufrac-gpu-models", "gpufrac-system")
            return (cm.data or {}).get("models") or None
        assert wait_until(published, 60, "the extender publishes the nodes' GPU models", proc) == "A10,T4"

        def asking(model: str) -> client.V1Pod:
            pod = gpu_pod(unique("m"), group, model=model)
            pod.spec.node_selector = {"gpufrac.io/test-group": f"{group}-none"}
            return pod

        # The policy is compiled a moment after it is created: poll for the first refusal.
        def refused_case() -> str | None:
            try:
                api.create_namespaced_pod(ns, asking("a10"))
            except ApiException as exc:
                return str(exc.body)
            return None
        msg = wait_until(refused_case, 60, "the gpu-model policy in force", proc)
        assert "no node of this cluster has a GPU of model" in msg and "a10" in msg, msg
        assert "did you mean A10? (model names are case-sensitive)" in msg, msg
        msg = _refused(api.create_namespaced_pod, ns, asking("A10|H100-typo"))
        assert "H100-typo" in msg and "the models its nodes have: A10, T4 (docs/pod-api.md)" in msg, msg
        api.create_namespaced_pod(ns, asking("A10"))
        api.create_namespaced_pod(ns, asking(" T4 | A10 "))
        # A node of a new model: the list follows within a pass (10 s).
        make_nodes(api, group + "-l4", count=1, gpus=1, model="L4")
        assert wait_until(lambda: published() == "A10,L4,T4" or None, 60, "L4 published", proc)
        wait_until(lambda: _created(api, ns, asking("L4")), 30, "an L4 pod admitted", proc)
        # Where nodes of a model come later (autoscaling): the chart's action Warn.
        cp.kubectl("patch", "validatingadmissionpolicybinding", "gpufrac-gpu-models", "--type=merge",
                   "-p", '{"spec": {"validationActions": ["Warn"]}}')
        manifest = tmp_path / "warned.yaml"
        manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "Pod",
                                        **client.ApiClient().sanitize_for_serialization(asking("H100-typo"))}))

        def warned() -> str | None:
            r = cp.kubectl("create", "-n", ns, "-f", str(manifest), check=False)
            return r.stderr if r.returncode == 0 else None
        out = wait_until(warned, 60, "the Warn action in force", proc)
        assert "Warning:" in out and "H100-typo" in out, out
    finally:
        proc.stop()


def _created(api: client.CoreV1Api, ns: str, pod: client.V1Pod) -> bool:
    try:
        api.create_namespaced_pod(ns, pod)
    except ApiException:
        return False
    return True


def _config(kubeconfig: Path) -> client.Configuration:
    from kubernetes import config

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    return cfg
