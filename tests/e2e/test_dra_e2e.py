"""The agent's DRA ResourceSlice on the real API server (Kubernetes 1.36, default feature gates)."""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.utils.quantity import parse_quantity

from agent.dra.slice import slice_name
from agent.dra.slice_publisher import GROUP, PLURAL, VERSION, SlicePublisher
from agent.inventory import HealthTracker, build_inventory
from agent.nvml import FakeNvml
from harness.controlplane import ControlPlane, add_fake_node
from harness.helm import helm
from harness.processes import start, wait_until
from podspec.claims import DRIVER
from tests.e2e.conftest import unique

ROOT = Path(__file__).resolve().parents[2]


def _slice(objects: client.CustomObjectsApi, node: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = objects.get_cluster_custom_object(GROUP, VERSION, PLURAL, slice_name(node))
        return found
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_the_agent_publishes_its_gpus_as_a_resource_slice_the_api_server_keeps(
        control_plane: ControlPlane, tmp_path: Path) -> None:
    # The agent, as the chart would run it with the DRA driver on (fake NVML: 2 x A10 24 GiB,
    # 4 replicas): its ResourceSlice holds one shareable device per GPU, and the API server
    # (1.36, default gates: DRAConsumableCapacity is beta and on) keeps every field of it.
    api_client = config.new_client_from_config(config_file=str(control_plane.admin_kubeconfig))
    core, objects = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    node = unique("dra")
    add_fake_node(core, node, [], publish_inventory=False)
    fake = tmp_path / "gpus.yaml"
    fake.write_text(yaml.safe_dump({"gpus": [{"name": "A10", "memory_mib": 24576, "count": 2}]}))
    control_plane.track(start(f"agent-{node}", [
        sys.executable, "-m", "agent", "--node-name", node, "--nvml", "fake", "--fake-config", str(fake),
        "--kubeconfig", str(control_plane.admin_kubeconfig), "--replicas", "4", "--no-device-plugin",
        "--dra-driver", "--dra-registry-dir", str(tmp_path / "registry"), "--dra-plugin-dir", str(tmp_path / "plugin"),
        "--cdi-dir", str(tmp_path / "cdi"), "--metrics-port", "0"], tmp_path))
    got = wait_until(lambda: _slice(objects, node), 30, "the agent's ResourceSlice")
    spec = got["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]) == (
        DRIVER, node, {"name": node, "generation": 0, "resourceSliceCount": 1})
    assert got["metadata"]["ownerReferences"][0]["uid"] == core.read_node(node).metadata.uid
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1"]
    for i, device in enumerate(spec["devices"]):
        assert device["allowMultipleAllocations"] is True  # kept: the feature is on
        assert device["attributes"] == {"uuid": {"string": f"GPU-fake-{node}-{i}"}, "model": {"string": "A10"},
                                        "index": {"int": i}}
        capacity = {k: parse_quantity(v["value"]) for k, v in device["capacity"].items()}
        assert capacity == {"share": 1000, "memory": 24576 * 2**20, "slots": 4}
        share_policy = device["capacity"]["share"]["requestPolicy"]
        assert (parse_quantity(share_policy["validRange"]["min"]), parse_quantity(share_policy["validRange"]["max"])) \
            == (1, 1000)
        assert parse_quantity(device["capacity"]["memory"]["requestPolicy"]["validRange"]["max"]) == 24576 * 2**20


def test_an_unhealthy_gpu_leaves_the_slice_in_a_new_pool_generation(control_plane: ControlPlane) -> None:
    # The slice publisher in process, on the inventory the agent builds: GPU 1 reports XID 79
    # and leaves the slice in generation 1; the same inventory again writes nothing; a slice
    # someone else replaced meanwhile (another resourceVersion) is read again, not clobbered blind.
    api_client = config.new_client_from_config(config_file=str(control_plane.admin_kubeconfig))
    core, objects = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    node = unique("dra-xid")
    add_fake_node(core, node, [], publish_inventory=False)
    nvml = FakeNvml.from_config({"node": node, "gpus": [{"name": "A100", "memory_mib": 81920, "count": 2}]})
    health = HealthTracker()
    readings = nvml.read()

    def inventory() -> Any:
        return build_inventory(node, readings, health, 4, dt.datetime.now(dt.UTC), pod_of=lambda pid: None)

    slices = SlicePublisher(core, node)
    assert slices.publish(inventory()) is True
    assert slices.publish(inventory()) is False  # nothing changed: no write
    nvml.inject_xid(readings[1].uuid, 79)
    event = nvml.wait_xid(1.0)
    assert event is not None and health.observe(event)
    assert slices.publish(inventory()) is True
    got = _slice(objects, node)
    assert got is not None
    assert [d["name"] for d in got["spec"]["devices"]] == ["gpu-0"]
    assert got["spec"]["pool"]["generation"] == 1
    # Another writer bumps the slice; the next change is written over its resourceVersion.
    got["metadata"]["labels"]["touched"] = "yes"
    objects.replace_cluster_custom_object(GROUP, VERSION, PLURAL, slice_name(node), got)
    health = HealthTracker()  # GPU 1 healthy again (a new agent process)
    assert slices.publish(inventory()) is True
    again = _slice(objects, node)
    assert again is not None
    assert [d["name"] for d in again["spec"]["devices"]] == ["gpu-0", "gpu-1"]
    assert again["spec"]["pool"]["generation"] == 2 and slices.writes == 3
    # kubelet deletes a node's slices when it starts: a check (at most every recheck_s) finds
    # the slice gone and writes it again; the kubelet plugin's registration forces a write.
    objects.delete_cluster_custom_object(GROUP, VERSION, PLURAL, slice_name(node))
    assert slices.publish(inventory()) is False and _slice(objects, node) is None  # not checked yet
    slices.recheck_s = 0
    assert slices.publish(inventory()) is True and _slice(objects, node) is not None
    assert slices.publish(inventory()) is False  # there: no write
    slices.recheck_s = 60
    slices.invalidate()
    assert slices.publish(inventory()) is True and slices.writes == 5


def test_the_chart_refuses_claims_asking_what_the_driver_does_not_publish(control_plane: ControlPlane) -> None:
    # The chart's gpufrac-resourceclaims policy (agent.draDriver) as the API server evaluates
    # it: claims and claim templates of gpu.gpufrac.io asking a share, memory or slots out of
    # the published ranges, or a capacity the driver does not have, are refused when written
    # with the request named; the shipped templates and other DeviceClasses' claims pass.
    rendered = helm("template", "gpufrac", str(ROOT / "deploy/helm/gpufrac"), "--namespace", "gpufrac-system",
                    "--kube-version", "1.36.3", "--set", "agent.draDriver=true",
                    "--show-only", "templates/dra.yaml").stdout
    policies = [d for d in yaml.safe_load_all(rendered) if d and d["kind"].startswith("ValidatingAdmissionPolicy")]
    assert [p["kind"] for p in policies] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    api_client = config.new_client_from_config(config_file=str(control_plane.admin_kubeconfig))
    objects = client.CustomObjectsApi(api_client)
    admission = client.AdmissionregistrationV1Api(api_client)
    core = client.CoreV1Api(api_client)
    ns = unique("dra-admission")
    core.create_namespace({"metadata": {"name": ns}})
    admission.create_validating_admission_policy(policies[0])
    admission.create_validating_admission_policy_binding(policies[1])
    try:
        refusals(objects, ns)
    finally:
        admission.delete_validating_admission_policy_binding(policies[1]["metadata"]["name"])
        admission.delete_validating_admission_policy(policies[0]["metadata"]["name"])
        core.delete_namespace(ns)


def _claim(name: str, capacity: dict[str, str] | None, device_class: str = DRIVER,
           first_available: bool = False) -> dict[str, Any]:
    ask: dict[str, Any] = {"deviceClassName": device_class}
    if capacity is not None:
        ask["capacity"] = {"requests": capacity}
    request = ({"name": "gpu", "firstAvailable": [{"name": "any", **ask}]} if first_available
               else {"name": "gpu", "exactly": ask})
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [request]}}}


def _refused(objects: client.CustomObjectsApi, ns: str, plural: str, body: dict[str, Any]) -> str | None:
    """The API server's message when it refuses ``body``; None when it keeps it (then deleted)."""
    try:
        objects.create_namespaced_custom_object("resource.k8s.io", "v1", ns, plural, body)
    except ApiException as exc:
        return str(exc.body)
    objects.delete_namespaced_custom_object("resource.k8s.io", "v1", ns, plural, body["metadata"]["name"])
    return None


def refusals(objects: client.CustomObjectsApi, ns: str) -> None:
    # The policy is enforced once the API server has loaded it (a moment after creation).
    wait_until(lambda: _refused(objects, ns, "resourceclaims", _claim(unique("probe"), {"share": "1001"})), 30,
               "the claim policy in force")
    for capacity, first_available in (({"share": "1001"}, False), ({"share": "0"}, False),
                                      ({"share": "250m"}, False), ({"memory": "17Ti"}, False),
                                      ({"slots": "2"}, False), ({"cores": "1"}, False),
                                      ({"share": "2000"}, True)):
        message = _refused(objects, ns, "resourceclaims", _claim(unique("bad"), capacity, first_available=first_available))
        assert message is not None and "request gpu of DeviceClass gpu.gpufrac.io" in message, (capacity, message)
        assert "whole milli-GPU, 1 to 1000" in message
    good: list[dict[str, str] | None] = [{"share": "250"}, {"share": "1000", "memory": "8Gi", "slots": "1"}, None,
                                         {"share": "1"}]
    for asked in good:
        assert _refused(objects, ns, "resourceclaims", _claim(unique("good"), asked)) is None, asked
    # Another driver's class is not gpufrac's to judge.
    assert _refused(objects, ns, "resourceclaims", _claim(unique("other"), {"share": "5000"}, "gpu.example.com")) is None
    # Templates: the shipped three pass; one asking 1.5 GPUs is refused.
    for template in (d for d in yaml.safe_load_all((ROOT / "deploy/dra/claim-templates.yaml").read_text()) if d):
        assert _refused(objects, ns, "resourceclaimtemplates", template) is None, template["metadata"]["name"]
    bad = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "too-much"},
           "spec": {"spec": _claim("x", {"share": "1500"})["spec"]}}
    message = _refused(objects, ns, "resourceclaimtemplates", bad)
    assert message is not None and "request gpu of DeviceClass gpu.gpufrac.io" in message, message
