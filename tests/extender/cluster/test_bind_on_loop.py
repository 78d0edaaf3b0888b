"""``KubeBinder.bind_on_loop``: the unfenced bind on the event loop does what ``bind`` does in a
worker (``test_cluster_mode_unit``), its Binding sent by ``LoopApi`` to a scripted server."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from extender.cache import BindError, GpuCache
from extender.cluster import KubeBinder
from extender.cluster.loop_api import LoopApi
from extender.fence import ClaimFence
from podspec import annotations as ann
from podspec.pods import allocation_annotations
from tests.conftest import gpu_node
from tests.extender.cluster.fake_http import FakeServer, Seen, reply
from tests.extender.cluster.test_cluster_mode_unit import NOW, FakeApi, cache_with, pending


def binder_on(srv: FakeServer, c: GpuCache, api: Any = None, **kw: Any) -> KubeBinder:
    binder = KubeBinder(api or FakeApi(), c, 60, now=lambda: NOW, **kw)
    binder.loop_api = LoopApi(srv.url, headers=lambda: {"authorization": "Bearer fake-token"})
    return binder


def created(seen: Seen) -> bytes:
    return reply(201, b'{"kind":"Status","status":"Success"}', "Created")


def bind(binder: KubeBinder, name: str, node: str) -> None:
    pending_bind = binder.bind_on_loop(f"uid-{name}", "default", name, node)
    assert pending_bind is not None
    asyncio.get_event_loop().run_until_complete(pending_bind)


@pytest.fixture
def loop() -> Any:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.servers = []  # type: ignore[attr-defined]
    yield loop
    for srv in loop.servers:  # type: ignore[attr-defined]
        loop.run_until_complete(srv.__aexit__())
    loop.run_until_complete(asyncio.sleep(0.05))
    loop.close()
    asyncio.set_event_loop(None)


def serve(loop: Any, answer: Any) -> FakeServer:
    srv = FakeServer(answer)
    loop.run_until_complete(srv.__aenter__())
    loop.servers.append(srv)
    return srv


def test_the_binding_carries_the_allocation_record_and_the_share_stays_held(loop: Any) -> None:
    c = cache_with(gpu_node("n1", 1))
    pending(c, "a", annotations={ann.FRACTION: "0.5"})
    srv = serve(loop, created)
    binder = binder_on(srv, c)
    binder.hold_on_receipt("uid-a", "default", "a", "n1")
    bind(binder, "a", "n1")
    (seen,) = srv.seen
    assert (seen.method, seen.path) == ("POST", "/api/v1/namespaces/default/pods/a/binding")
    assert seen.headers["authorization"] == "Bearer fake-token"
    body = json.loads(seen.body)
    assert body["metadata"]["uid"] == "uid-a" and body["target"] == {"apiVersion": "v1", "kind": "Node", "name": "n1"}
    assert body["metadata"]["annotations"] == allocation_annotations(["GPU-n1-0"], 500, [8192], NOW)
    assert c.summary()["gpu_allocated_milli"] == 500  # held once: the receipt hold is the bind's


@pytest.mark.parametrize("answer,message", [
    (lambda s: reply(500, b'{"kind":"Status","code":500}', "Internal Server Error"),
     "binding pod default/a to n1: 500 Internal Server Error"),
    (lambda s: None, "binding pod default/a to n1: 0 no answer from the API server"),
])
def test_a_binding_not_written_gives_the_share_back(loop: Any, answer: Any, message: str) -> None:
    c = cache_with(gpu_node("n1", 1))
    pending(c, "a", annotations={ann.FRACTION: "0.5"})
    binder = binder_on(serve(loop, answer), c)
    with pytest.raises(BindError, match=message):
        bind(binder, "a", "n1")
    assert c.summary()["gpu_allocated_milli"] == 0 and c.allocations() == []


def test_a_409_where_the_pod_is_bound_there_is_a_success_counting_what_it_holds(loop: Any) -> None:
    c = cache_with(gpu_node("n1", 2))
    pending(c, "a", annotations={ann.FRACTION: "0.5"})
    theirs = allocation_annotations(["GPU-n1-1"], 500, [8192], NOW)
    conflict = reply(409, b'{"kind":"Status","reason":"Conflict","code":409}', "Conflict")
    binder = binder_on(serve(loop, lambda s: conflict), c, api=FakeApi(bound_to="n1", annotations=theirs))
    bind(binder, "a", "n1")  # the read-back (in a worker) finds the pod bound to n1 on GPU 1
    (alloc,) = c.allocations()
    assert alloc["gpu_uuids"] == ["GPU-n1-1"]
    elsewhere = binder_on(serve(loop, lambda s: conflict), c, api=FakeApi(bound_to="n2"))
    pending(c, "b", annotations={ann.FRACTION: "0.5"})
    with pytest.raises(BindError, match="409 Conflict"):
        bind(elsewhere, "b", "n1")


def test_what_needs_a_blocking_call_is_left_to_the_worker(loop: Any) -> None:
    c = cache_with(gpu_node("n1", 1))
    pending(c, "a", annotations={ann.FRACTION: "0.5"})
    srv = serve(loop, created)
    assert binder_on(srv, c).bind_on_loop("uid-x", "default", "x", "n1") is None  # not seen: read from the API
    assert KubeBinder(FakeApi(), c, 60).bind_on_loop("uid-a", "default", "a", "n1") is None  # no LoopApi
    fenced = binder_on(srv, c, fence=ClaimFence(FakeApi(), "gpufrac", "me", 60))
    assert fenced.bind_on_loop("uid-a", "default", "a", "n1") is None
    assert srv.seen == [] and c.summary()["gpu_allocated_milli"] == 0


def test_a_node_gpufrac_does_not_know_is_refused_before_any_write(loop: Any) -> None:
    c = cache_with(gpu_node("n1", 1))
    pending(c, "a", annotations={ann.FRACTION: "0.5"})
    srv = serve(loop, created)
    with pytest.raises(BindError, match="not in gpufrac's cache"):
        bind(binder_on(srv, c), "a", "no-such-node")
    assert srv.seen == [] and c.summary()["gpu_allocated_milli"] == 0
