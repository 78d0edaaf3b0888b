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

from agent.dra.slice import DRIVER, slice_name
from agent.dra.slice_publisher import GROUP, PLURAL, VERSION, SlicePublisher
from agent.inventory import HealthTracker, build_inventory
from agent.nvml import FakeNvml
from harness.controlplane import ControlPlane, add_fake_node
from harness.processes import start, wait_until
from tests.e2e.conftest import unique


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
