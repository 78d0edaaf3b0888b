"""The node's GPUs as a DRA ResourceSlice (agent/dra/slice.py), without a server."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace
from typing import Any

import pytest
import urllib3

from agent.dra.slice import resource_slice, slice_name
from agent.dra.slice_publisher import SlicePublisher
from podspec.annotations import GpuInventory, NodeInventory
from podspec.claims import DRIVER


def _inventory(node: str = "n1") -> NodeInventory:
    return NodeInventory(node=node, heartbeat=dt.datetime(2026, 1, 1, tzinfo=dt.UTC), gpus=[
        GpuInventory(index=1, uuid="GPU-b", model="A100", memory_mib=81920, replicas=4),
        GpuInventory(index=0, uuid="GPU-a", model="A100", memory_mib=81920, replicas=4, healthy=False,
                     health_reason="XID 79"),
        GpuInventory(index=2, uuid="MIG-c", model="A100-3g.40gb", memory_mib=40960, replicas=2,
                     mig_parent="GPU-p"),
    ])


def test_healthy_gpus_are_shareable_devices_in_index_order_with_the_pod_apis_ranges() -> None:
    got = resource_slice(_inventory(), 3, node_uid="uid-1")
    spec = got["spec"]
    assert (got["apiVersion"], got["kind"], spec["driver"], spec["nodeName"]) == (
        "resource.k8s.io/v1", "ResourceSlice", DRIVER, "n1")
    assert spec["pool"] == {"name": "n1", "generation": 3, "resourceSliceCount": 1}
    assert got["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "uid-1"}]
    # GPU 0 is unhealthy (XID 79): no device, so no new claim lands on it.
    assert [d["name"] for d in spec["devices"]] == ["gpu-1", "gpu-2"]
    b, mig = spec["devices"]
    assert b["allowMultipleAllocations"] is True
    assert b["attributes"] == {"uuid": {"string": "GPU-b"}, "model": {"string": "A100"}, "index": {"int": 1}}
    assert mig["attributes"]["migParent"] == {"string": "GPU-p"}
    assert b["capacity"]["share"] == {"value": "1000", "requestPolicy": {
        "default": "1000", "validRange": {"min": "1", "max": "1000", "step": "1"}}}
    assert b["capacity"]["memory"]["value"] == "81920Mi"
    assert b["capacity"]["memory"]["requestPolicy"]["validRange"]["max"] == "81920Mi"
    assert mig["capacity"]["slots"]["value"] == "2"


def test_the_slice_name_fits_an_object_name_for_the_longest_node_name() -> None:
    node = "n" * 253
    assert len(slice_name(node)) <= 253 and slice_name("a.b") == "a.b-gpufrac"
    assert "ownerReferences" not in resource_slice(_inventory(), 0)["metadata"]


@pytest.mark.parametrize("failure", [
    urllib3.exceptions.MaxRetryError(None, "/api/v1/nodes/n1", "connection refused"),  # type: ignore[arg-type]
    ConnectionResetError("reset by peer"),
    ValueError("not JSON"),
])
def test_publishing_never_raises_when_the_api_server_cannot_be_reached(failure: Exception) -> None:
    # The publisher's thread calls publish after every inventory write: a network error or an
    # answer that is not JSON is logged, nothing is taken as written, and the next call tries again.
    calls: list[str] = []

    def read_node(name: str, **kw: Any) -> Any:
        calls.append(name)
        raise failure

    publisher = SlicePublisher(SimpleNamespace(api_client=None, read_node=read_node), "n1", recheck_s=3600)
    inv = _inventory()
    assert publisher.publish(inv) is False
    assert publisher.publish(inv) is False
    assert calls == ["n1", "n1"] and publisher.writes == 0
