"""The node agent (fake NVML) against the real API server, with the extender placing by it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import grpc
import yaml

from agent.deviceplugin.stubs import load
from harness.controlplane import add_fake_node, fake_node_gpus
from harness.processes import start
from tests.agent.kubelet import FakeKubelet
from tests.e2e.conftest import Cluster, failed_scheduling_message, unique, wait_for_pods
from tests.e2e.helpers import gpu_pod, new_namespace


def test_agent_publishes_inventory_and_the_extender_places_by_it(cluster: Cluster, tmp_path: Path) -> None:
    group = unique("agent")
    node = f"{group}-000"
    # A node as kubelet leaves it: allocatable slots, but no inventory until the agent runs.
    add_fake_node(cluster.api, node, fake_node_gpus(node, 2, replicas=4), publish_inventory=False)
    cluster.api.patch_node(node, {"metadata": {"labels": {"gpufrac.io/test-group": group,
                                                          "nvidia.com/gpu.replicas": "4"}}})
    ns = new_namespace(cluster.api, group)
    cluster.api.create_namespaced_pod(ns, gpu_pod("early", group, fraction="0.5"))
    assert "inventory stale" in failed_scheduling_message(cluster, ns, "early")

    # kubelet's device-plugin directory, with this test answering as kubelet's Registration.
    plugin_dir = tmp_path / "device-plugins"
    plugin_dir.mkdir()
    stubs = load(generate_if_missing=True)
    kubelet = FakeKubelet(plugin_dir, stubs)
    kubelet.start()
    config = tmp_path / "gpus.yaml"
    config.write_text(yaml.safe_dump({"gpus": [{"name": "A10", "memory_mib": 24576, "count": 2}]}))
    agent = cluster.cp.track(start(f"agent-{node}", [
        sys.executable, "-m", "agent", "--node-name", node, "--nvml", "fake",
        "--fake-config", str(config), "--kubeconfig", str(cluster.cp.admin_kubeconfig),
        "--heartbeat-s", "5", "--plugin-dir", str(plugin_dir), "--metrics-port", "0"], tmp_path))
    try:
        def published() -> dict[str, Any] | None:
            raw = (cluster.api.read_node(node).metadata.annotations or {}).get("gpufrac.io/inventory")
            return json.loads(raw) if raw else None
        inv = cluster.wait(published, 30, "agent's inventory annotation")
        assert [g["uuid"] for g in inv["gpus"]] == [f"GPU-fake-{node}-0", f"GPU-fake-{node}-1"]
        assert {g["replicas"] for g in inv["gpus"]} == {4}

        pod = wait_for_pods(cluster, ns, ["early"], timeout_s=90)["early"]
        assert pod.spec.node_name == node
        chosen = pod.metadata.annotations["gpufrac.io/assigned-gpus"]
        assert chosen in {g["uuid"] for g in inv["gpus"]}

        # kubelet's side: the agent registered gpufrac.io/gpu, advertises 2 x 4 slots, and
        # Allocate gives the container exactly the GPU gpufrac chose, at half its SMs.
        cluster.wait(lambda: kubelet.requests, 30, "device plugin registration")
        assert kubelet.requests[0].resource_name == "gpufrac.io/gpu"
        pb, pb_grpc = stubs
        with grpc.insecure_channel(f"unix://{plugin_dir / 'gpufrac.sock'}") as channel:
            stub = pb_grpc.DevicePluginStub(channel)
            devices = next(stub.ListAndWatch(pb.Empty(), timeout=10)).devices
            assert len(devices) == 8
            reply = stub.Allocate(pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=[devices[0].ID])]), timeout=10)
            env = dict(reply.container_responses[0].envs)
        assert env["NVIDIA_VISIBLE_DEVICES"] == chosen
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    finally:
        agent.stop()
        kubelet.stop()
