"""gpufrac's DRA kubelet plugin (agent/dra/kubelet_plugin.py): prepare, CDI, gRPC, hostile input."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.deviceplugin.stubs import load
from agent.dra.kubelet_plugin import (
    MAX_CLAIMS_PER_CALL,
    ClaimError,
    DraDriver,
    DraPluginServer,
    cdi_spec_path,
    prepare_claim,
)
from podspec.annotations import GpuInventory, NodeInventory
from podspec.claims import DRIVER

UID = "0f6c1f7e-1111-4a2b-9c3d-aaaaaaaaaaaa"


def inventory(node: str = "n1") -> NodeInventory:
    return NodeInventory(node=node, heartbeat=dt.datetime(2026, 1, 1, tzinfo=dt.UTC), gpus=[
        GpuInventory(index=0, uuid="GPU-a", model="A10", memory_mib=24576, replicas=4),
        GpuInventory(index=1, uuid="GPU-b", model="A10", memory_mib=24576, replicas=4, healthy=False,
                     health_reason="XID 79"),
        GpuInventory(index=2, uuid="GPU-c", model="A10", memory_mib=24576, replicas=4),
    ])


def result(device: str = "gpu-0", request: str = "gpu", pool: str = "n1", driver: str = DRIVER,
           **consumed: str) -> dict[str, Any]:
    out: dict[str, Any] = {"request": request, "driver": driver, "pool": pool, "device": device,
                           "shareID": "5d5e0c1a-share"}
    if consumed:
        out["consumedCapacity"] = consumed
    return out


def claim(*results: dict[str, Any], uid: str = UID) -> dict[str, Any]:
    return {"metadata": {"namespace": "team", "name": "quarter", "uid": uid},
            "status": {"allocation": {"devices": {"results": list(results)}}}}


def env_of(spec: Mapping[str, Any], i: int = 0) -> dict[str, str]:
    return dict(e.split("=", 1) for e in spec["devices"][i]["containerEdits"]["env"])


def test_a_quarter_gpu_claim_gets_its_gpu_and_mps_limits_as_the_device_plugin_gives_them() -> None:
    spec, devices = prepare_claim(claim(result(share="250", memory="8Gi", slots="1"),
                                        result("gpu-9", driver="other.example.com")), UID, "n1", inventory(), "/run/mps")
    assert (spec["cdiVersion"], spec["kind"]) == ("0.6.0", "gpufrac.io/gpu")
    assert [d["name"] for d in spec["devices"]] == [f"{UID}-gpu"]
    assert env_of(spec) == {"NVIDIA_VISIBLE_DEVICES": "GPU-a", "GPUFRAC_ASSIGNED_GPUS": "GPU-a",
                            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M",
                            "CUDA_MPS_PIPE_DIRECTORY": "/run/gpufrac/mps"}
    assert spec["devices"][0]["containerEdits"]["mounts"] == [
        {"hostPath": "/run/mps", "containerPath": "/run/gpufrac/mps", "options": ["rbind", "rw"]}]
    # The other driver's result is not ours to prepare.
    assert [(d.request, d.pool, d.device, d.cdi_device_id, d.share_id) for d in devices] == [
        ("gpu", "n1", "gpu-0", f"gpufrac.io/gpu={UID}-gpu", "5d5e0c1a-share")]


def test_a_claim_that_asked_no_memory_gets_its_shares_part_of_the_gpu_memory() -> None:
    # consumedCapacity memory 1Mi is the slice's default (no memory asked), not a 1 MiB limit:
    # a quarter of a 24 GiB GPU, as the device plugin gives a pod without gpufrac.io/memory.
    for consumed in ({"share": "250", "memory": "1Mi", "slots": "1"}, {"share": "250"}):
        spec, _ = prepare_claim(claim(result(**consumed)), UID, "n1", inventory(), "/run/mps")
        assert env_of(spec)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=6144M", consumed


def test_a_whole_gpu_result_and_a_two_gpu_request_get_no_mps_limit() -> None:
    # No consumedCapacity: the device held whole (the gate off, or a whole GPU asked).
    spec, devices = prepare_claim(claim(result("gpu-0", request="pair"), result("gpu-2", request="pair")),
                                  UID, "n1", inventory(), "/run/mps")
    assert env_of(spec) == {"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-c", "GPUFRAC_ASSIGNED_GPUS": "GPU-a,GPU-c"}
    assert "mounts" not in spec["devices"][0]["containerEdits"]
    assert [d.device for d in devices] == ["gpu-0", "gpu-2"]


@pytest.mark.parametrize(("the_claim", "uid", "message"), [
    (claim(result(share="250"), uid="other-uid"), UID, "was replaced"),
    (claim(result("gpu-0", driver="other.example.com")), UID, "is not allocated any gpu.gpufrac.io device"),
    (claim(result(pool="n2")), UID, "is in pool \"n2\", not this node's (n1)"),
    (claim(result("gpu-7")), UID, "node n1 has no GPU \"gpu-7\""),
    (claim(result("gpu-1")), UID, "GPU gpu-1 (GPU-b) on n1 is unhealthy"),
    (claim(result(share="2000")), UID, "consumedCapacity.share: \"2000\" is too large"),
    (claim(result(share="0.5")), UID, "must be whole milli-GPU"),
    (claim(result(memory="lots")), UID, "consumedCapacity.memory: \"lots\" is not a Kubernetes quantity"),
    (claim(*[result()] * 33), UID, "33 results, more than the API's 32"),
    ({"metadata": {"namespace": "team", "name": "x" * 300, "uid": UID}}, UID, "longer than 253"),
    ({**claim(result()), "status": {"allocation": {"devices": {"results": "all"}}}}, UID, "must be a list"),
])
def test_what_cannot_be_prepared_is_refused_with_the_reason(the_claim: dict[str, Any], uid: str,
                                                             message: str) -> None:
    with pytest.raises(ClaimError) as info:
        prepare_claim(the_claim, uid, "n1", inventory(), None)
    assert message in str(info.value)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[DraPluginServer, dict[str, Any]]]:
    claims: dict[tuple[str, str], Mapping[str, Any]] = {("team", "quarter"): claim(result(share="250"))}

    def read(namespace: str, name: str) -> Mapping[str, Any]:
        if (namespace, name) not in claims:
            raise ClaimError(f"claim {namespace}/{name} not read: 404 Not Found")
        return claims[namespace, name]

    registered = threading.Event()
    driver = DraDriver("n1", read, inventory, tmp_path / "cdi")
    server = DraPluginServer(driver, tmp_path / "plugin", tmp_path / "registry", registered.set)
    server.start()
    pb, pb_grpc = load(api="dra")
    rpb, rpb_grpc = load(api="registration")
    ctx = {"pb": pb, "rpb": rpb, "registered": registered, "tmp": tmp_path,
           "dra": grpc.insecure_channel(f"unix://{server.socket}"),
           "reg": grpc.insecure_channel(f"unix://{server.registration_socket}")}
    ctx["stub"] = pb_grpc.DRAPluginStub(ctx["dra"])
    ctx["reg_stub"] = rpb_grpc.RegistrationStub(ctx["reg"])
    yield server, ctx
    ctx["dra"].close()
    ctx["reg"].close()
    server.close()


def test_kubelet_registers_the_driver_and_prepares_and_unprepares_a_claim(
        served: tuple[DraPluginServer, dict[str, Any]]) -> None:
    server, ctx = served
    pb, rpb = ctx["pb"], ctx["rpb"]
    info = ctx["reg_stub"].GetInfo(rpb.InfoRequest(), timeout=5)
    assert (info.type, info.name, info.endpoint, list(info.supported_versions)) == (
        "DRAPlugin", DRIVER, str(server.socket), ["v1.DRAPlugin"])
    ctx["reg_stub"].NotifyRegistrationStatus(rpb.RegistrationStatus(plugin_registered=True), timeout=5)
    assert ctx["registered"].is_set() and server.registrations == 1

    ref = pb.Claim(namespace="team", name="quarter", uid=UID)
    missing = pb.Claim(namespace="team", name="gone", uid="1234")
    got = ctx["stub"].NodePrepareResources(pb.NodePrepareResourcesRequest(claims=[ref, missing]), timeout=5)
    ours = got.claims[UID]
    assert ours.error == ""
    [device] = ours.devices
    assert (list(device.request_names), device.pool_name, device.device_name, list(device.cdi_device_ids),
            device.share_id) == (["gpu"], "n1", "gpu-0", [f"gpufrac.io/gpu={UID}-gpu"], "5d5e0c1a-share")
    spec = json.loads(cdi_spec_path(ctx["tmp"] / "cdi", UID).read_text())
    assert env_of(spec)["NVIDIA_VISIBLE_DEVICES"] == "GPU-a"
    # One claim that cannot be read costs only itself.
    assert got.claims["1234"].error == "gpufrac: claim team/gone not read: 404 Not Found"
    # Prepare again (kubelet retries): the same answer, the same file.
    again = ctx["stub"].NodePrepareResources(pb.NodePrepareResourcesRequest(claims=[ref]), timeout=5)
    assert again.claims[UID] == ours
    gone = ctx["stub"].NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(claims=[ref]), timeout=5)
    assert gone.claims[UID].error == "" and not cdi_spec_path(ctx["tmp"] / "cdi", UID).exists()
    assert ctx["stub"].NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(claims=[ref]),
                                              timeout=5).claims[UID].error == ""


def test_hostile_references_from_kubelet_touch_no_path_and_cost_only_themselves(
        served: tuple[DraPluginServer, dict[str, Any]]) -> None:
    _server, ctx = served
    pb = ctx["pb"]
    bad = [pb.Claim(namespace="team", name="quarter", uid="../../etc/passwd"),
           pb.Claim(namespace="x" * 64, name="quarter", uid=UID),
           pb.Claim(namespace="team", name="", uid="abc")]
    got = ctx["stub"].NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(claims=bad), timeout=5)
    assert "is not a UID" in got.claims["../../etc/passwd"].error
    assert "is not a namespace name" in got.claims[UID].error
    assert "is not an object name" in got.claims["abc"].error
    too_many = [pb.Claim(namespace="team", name="quarter", uid=f"{i:x}") for i in range(MAX_CLAIMS_PER_CALL + 1)]
    with pytest.raises(grpc.RpcError) as info:
        ctx["stub"].NodePrepareResources(pb.NodePrepareResourcesRequest(claims=too_many), timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not any((ctx["tmp"] / "cdi").glob("*")) and not any(ctx["tmp"].rglob("*passwd*"))


def test_a_vanished_socket_is_served_again(tmp_path: Path) -> None:
    driver = DraDriver("n1", lambda ns, n: {}, inventory, tmp_path / "cdi")
    server = DraPluginServer(driver, tmp_path / "plugin", tmp_path / "registry")
    stop = threading.Event()
    runner = threading.Thread(target=server.run, args=(stop, 0.05))
    runner.start()
    try:
        for _ in range(100):
            if server.registration_socket.exists():
                break
            stop.wait(0.05)
        server.registration_socket.unlink()
        for _ in range(100):
            if server.registration_socket.exists():
                break
            stop.wait(0.05)
        assert server.registration_socket.exists()
    finally:
        stop.set()
        runner.join(10)
    assert not server.socket.exists() and not server.registration_socket.exists()
