"""The device plugin over the real gRPC API, with this test playing kubelet.

A Registration server on a temporary unix socket stands in for ``kubelet.sock``; the test
then calls ``ListAndWatch``, ``GetPreferredAllocation`` and ``Allocate`` on the plugin's
socket the way kubelet does (one Allocate per container, in spec order).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.deviceplugin.plugin import GpuSlots, PluginServer
from agent.deviceplugin.stubs import load
from podspec import annotations as ann
from podspec.pods import allocation_annotations
from tests.agent.kubelet import FakeKubelet
from tests.conftest import pod_json

T0 = dt.datetime(2026, 11, 22, 12, 0, 0, tzinfo=dt.UTC)
A, B = "GPU-aaaa", "GPU-bbbb"


@pytest.fixture(scope="module")
def stubs() -> tuple[Any, Any]:
    """The generated stubs (generated from k8s.io/kubelet's api.proto on first use)."""
    return load(generate_if_missing=True)


def bound_pod(name: str, created: str, uuids: list[str], milli: int, memory: list[int],
              containers: list[int] | None = None) -> dict[str, Any]:
    """A pod gpufrac bound to n1, not started yet, with its allocation record."""
    record = allocation_annotations(uuids, milli, memory, T0)
    ann_ = dict(record)
    if milli < 1000:
        ann_[ann.FRACTION] = str(milli / 1000)
    pod = pod_json(name, node="n1", annotations=ann_, gpus=(containers or [len(uuids)])[0])
    pod["metadata"]["creationTimestamp"] = created
    if containers and len(containers) > 1:
        pod["spec"]["containers"] = [
            {"name": f"c{i}", "resources": {"limits": {ann.RESOURCE_GPU: str(n)}}} for i, n in enumerate(containers)]
    return pod


@pytest.fixture
def world(tmp_path: Path, stubs: tuple[Any, Any]) -> Any:
    class World:
        gpus = [GpuSlots(A, 4, True), GpuSlots(B, 4, True)]
        pods: list[dict[str, Any]] = []
        kubelet: FakeKubelet
        plugin: PluginServer
        stub: Any
        pb: Any

    w = World()
    kubelet = FakeKubelet(tmp_path, stubs)
    kubelet.start()
    plugin = PluginServer(lambda: w.gpus, lambda: w.pods, "n1", tmp_path)
    plugin.start_once()
    channel = grpc.insecure_channel(f"unix://{plugin.socket}")
    w.kubelet, w.plugin, w.stub, w.pb = kubelet, plugin, stubs[1].DevicePluginStub(channel), stubs[0]
    yield w
    channel.close()
    plugin.close()
    kubelet.stop()


def allocate(w: Any, n: int) -> dict[str, str]:
    ids = [f"{A}::{i}" for i in range(n)]  # kubelet's pick; the record decides the GPU
    req = w.pb.AllocateRequest(container_requests=[w.pb.ContainerAllocateRequest(devices_ids=ids)])
    return dict(w.stub.Allocate(req, timeout=5).container_responses[0].envs)


def test_registers_and_advertises_every_replica_slot_with_health(world: Any) -> None:
    (req,) = world.kubelet.requests
    assert (req.version, req.endpoint, req.resource_name) == ("v1beta1", "gpufrac.sock", "gpufrac.io/gpu")
    stream = world.stub.ListAndWatch(world.pb.Empty(), timeout=10)
    first = next(stream)
    # 2 GPUs x 4 replicas = 8 slots, the node's gpufrac.io/gpu allocatable.
    assert len(first.devices) == 8 and {d.health for d in first.devices} == {"Healthy"}
    world.gpus = [GpuSlots(A, 4, True), GpuSlots(B, 4, False)]  # XID on B
    world.plugin.changed.set()
    second = next(stream)
    unhealthy = sorted(d.ID for d in second.devices if d.health == "Unhealthy")
    assert unhealthy == [f"{B}::{i}" for i in range(4)]
    stream.cancel()


def test_quarter_pod_gets_its_gpu_and_mps_limits(world: Any) -> None:
    world.pods = [bound_pod("q", "2026-11-22T12:00:00Z", [B], 250, [6144])]
    pref = world.stub.GetPreferredAllocation(world.pb.PreferredAllocationRequest(container_requests=[
        world.pb.ContainerPreferredAllocationRequest(
            available_deviceIDs=[f"{g}::{i}" for g in (A, B) for i in range(4)], allocation_size=1)]), timeout=5)
    # The preferred slot lies on the GPU the record names.
    assert [d.split("::")[0] for d in pref.container_responses[0].deviceIDs] == [B]
    env = allocate(world, 1)
    # 250 milli = 25 % of the SMs; 6144 MiB pinned on the one visible device (index 0).
    assert env == {"NVIDIA_VISIBLE_DEVICES": B, "GPUFRAC_ASSIGNED_GPUS": B,
                   "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=6144M"}


def test_two_containers_of_one_pod_get_their_own_gpus(world: Any) -> None:
    world.pods = [bound_pod("multi", "2026-11-22T12:00:00Z", [A, B], 1000, [24576, 24576], containers=[1, 1])]
    first, second = allocate(world, 1), allocate(world, 1)
    assert (first["NVIDIA_VISIBLE_DEVICES"], second["NVIDIA_VISIBLE_DEVICES"]) == (A, B)
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in first  # whole GPUs: no MPS limits


def test_two_pods_with_identical_requests_get_their_own_assignments(world: Any) -> None:
    # Same size, same share: only the record differs. Admission order = creation time.
    world.pods = [bound_pod("later", "2026-11-22T12:00:05Z", [A], 500, [12288]),
                  bound_pod("earlier", "2026-11-22T12:00:01Z", [B], 500, [12288])]
    got = [allocate(world, 1)["NVIDIA_VISIBLE_DEVICES"] for _ in range(2)]
    assert got == [B, A]
    with pytest.raises(grpc.RpcError) as err:  # both consumed: a third call matches nothing
        allocate(world, 1)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no pod on n1 bound by gpufrac waits for 1 gpufrac.io/gpu" in err.value.details()


def test_started_pods_are_not_candidates(world: Any) -> None:
    pod = bound_pod("running", "2026-11-22T12:00:00Z", [A], 500, [12288])
    pod["status"]["containerStatuses"] = [{"name": "c", "ready": True}]
    world.pods = [pod]
    with pytest.raises(grpc.RpcError):
        allocate(world, 1)


def test_reregisters_when_kubelet_restarts(world: Any) -> None:
    stop = threading.Event()
    runner = threading.Thread(target=world.plugin.run, args=(stop, 0.05))
    runner.start()
    try:
        deadline = time.monotonic() + 10
        while world.plugin.registrations < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # first pass of run() registers again (new inode seen)
        count = len(world.kubelet.requests)
        world.kubelet.stop()           # kubelet restarts: its socket is recreated
        world.kubelet.start()
        while len(world.kubelet.requests) <= count and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(world.kubelet.requests) > count
        assert world.kubelet.requests[-1].resource_name == "gpufrac.io/gpu"
        with grpc.insecure_channel(f"unix://{world.plugin.socket}") as ch:
            stub = type(world.stub)(ch)
            assert stub.GetDevicePluginOptions(world.pb.Empty(), timeout=5).get_preferred_allocation_available
    finally:
        stop.set()
        runner.join(10)


def test_mps_pipe_directory_goes_to_fractional_containers_only() -> None:
    from agent.deviceplugin.assign import MPS_CONTAINER_DIR, container_mps

    # Below a whole GPU, with a daemon on the node: the pipe directory mounted, the variable
    # pointing at it. A whole GPU needs no MPS; a node without a daemon gets nothing.
    assert container_mps(250, "/run/nvidia/mps") == ({"CUDA_MPS_PIPE_DIRECTORY": MPS_CONTAINER_DIR},
                                                     [(MPS_CONTAINER_DIR, "/run/nvidia/mps")])
    assert container_mps(1000, "/run/nvidia/mps") == ({}, [])
    assert container_mps(250, None) == ({}, [])
