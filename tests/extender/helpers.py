"""An extender app on an in-memory cache, for route tests; a raw API response for client fakes."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http import HTTPStatus
from types import SimpleNamespace
from typing import Any

import uvicorn
from fastapi.testclient import TestClient

from extender.admin_config import scoring_config
from extender.app import create_app
from extender.cache import GpuCache
from extender.cache.reservations import StarvationPolicy
from extender.server import uvicorn_config
from extender.settings import Settings
from extender.tenants import NO_TENANTS
from extender.verbs.pod_events import PodEvent, pod_events
from scoring.presets import PRESETS
from scoring.scorer import build_scorer
from scoring.specs import GpuSpec, NodeSpec

EVENTS_TOKEN = "test-events-token"
"""The ``events_token`` of ``client_for``'s app; its client sends it on every call."""


@contextmanager
def client_for(nodes: list[NodeSpec], preset: str = "default",
               **settings: object) -> Iterator[tuple[TestClient, GpuCache]]:
    """A started app (lifespan run) whose cache holds ``nodes``; the pod-events endpoint is
    on (``EVENTS_TOKEN``, sent by the client). ``settings``: more ``Settings`` fields."""
    cache = GpuCache(build_scorer(scoring_config(preset)))
    cache.set_nodes(nodes)
    app = create_app(Settings.model_validate({"preset": preset, "events_token": EVENTS_TOKEN, **settings}), cache=cache)
    with TestClient(app, headers={"Authorization": f"Bearer {EVENTS_TOKEN}"}) as client:
        yield client, cache


def infeasible(allocations: list[dict[str, Any]], nodes: list[NodeSpec]) -> list[str]:
    """GPUs over their share (non-best-effort), memory or replica slots, from ``/allocations``:
    an independent check of what the cache counts (``held_milli``: an over-commit's counted part)."""
    gpus = {g.uuid: g for n in nodes for g in n.gpus}
    share: dict[str, int] = defaultdict(int)
    mem: dict[str, int] = defaultdict(int)
    pods: dict[str, int] = defaultdict(int)
    for a in allocations:
        for uuid, milli, m in zip(a["gpu_uuids"], a["held_milli"], a["gpu_memory_mib"], strict=True):
            if a["qos"] != "best-effort":
                share[uuid] += milli
            mem[uuid] += m
            pods[uuid] += 1
    return [u for u, g in gpus.items() if share[u] > 1000 or mem[u] > g.memory_mib or pods[u] > g.replicas]


Route = Callable[[str, str, Any], tuple[int, dict[str, Any]]]
"""``route(method, path, json_body) -> (status, json_reply)``: a fake API server's writes."""


class FakeApiClient:
    """What ``podspec.kubeio.write_json`` uses of ``kubernetes.client.ApiClient``: host,
    credentials, default headers and the urllib3 pool, the pool answering through ``route``.
    ``requests`` keeps (method, path, headers) of every write."""

    HOST = "https://fake-apiserver:6443"

    def __init__(self, route: Route) -> None:
        self.configuration = SimpleNamespace(
            host=self.HOST, auth_settings=lambda: {"BearerToken": {
                "in": "header", "key": "authorization", "value": "Bearer fake-token"}})
        self.default_headers: dict[str, str] = {}
        self.rest_client = SimpleNamespace(pool_manager=SimpleNamespace(request=self._request))
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self._route = route

    def _request(self, method: str, url: str, body: bytes, headers: dict[str, str], **kw: Any) -> Any:
        assert url.startswith(self.HOST), url
        path = url.removeprefix(self.HOST)
        self.requests.append((method, path, headers))
        status, reply = self._route(method, path, json.loads(body))
        return SimpleNamespace(status=status, reason=HTTPStatus(status).phrase, data=json.dumps(reply).encode())


class FakeResponse:
    """What the kubernetes client returns with ``_preload_content=False`` (see podspec.kubeio)."""

    def __init__(self, body: dict[str, Any] | None = None) -> None:
        self.data = json.dumps(body or {}).encode()

    def release_conn(self) -> None:
        pass


class ListApi:
    """Lists Nodes, Pods and Namespaces from fixed items; any watch ends the list-and-watch
    call (``ConnectionError``), so a test drives the watch by calling the event handler."""

    def __init__(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]] | None = None) -> None:
        self.nodes, self.pods = nodes, pods or []

    def _list(self, items: list[dict[str, Any]], **kw: Any) -> FakeResponse:
        if kw.get("watch"):
            raise ConnectionError("watch not served by this fake")
        return FakeResponse({"metadata": {"resourceVersion": "1"}, "items": items})

    def list_node(self, **kw: Any) -> FakeResponse:
        return self._list(self.nodes, **kw)

    def list_pod_for_all_namespaces(self, **kw: Any) -> FakeResponse:
        return self._list(self.pods, **kw)

    def list_namespace(self, **kw: Any) -> FakeResponse:
        return self._list([], **kw)


def v100_node(name: str, gpus: int = 2) -> NodeSpec:
    """A node of ``gpus`` V100M16 GPUs (20 replica slots each), 64 cores, 256 GiB."""
    return NodeSpec(name, 64_000, 262_144, tuple(GpuSpec(i, f"GPU-{name}-{i}", "V100M16", 16_384, 20)
                                                   for i in range(gpus)))


def trace_pod(name: str, num_gpu: int = 1, gpu_milli: int = 1000) -> dict[str, Any]:
    """A Pod object as the replay makes one (1 core, 1 GiB, LS)."""
    from benchmarks.trace import TracePod

    return TracePod(name, 1000, 1024, num_gpu, gpu_milli, "", "LS").pod_object(seed=0)


def bestfit_cache(nodes: list[NodeSpec], starvation: StarvationPolicy | None = None) -> GpuCache:
    """A cache scoring by the ``bestfit`` preset (no tenants) that holds ``nodes``; ``starvation``:
    starvation protection (None: the cache's own, off)."""
    scorer = build_scorer(PRESETS["bestfit"])
    cache = GpuCache(scorer)
    cache.set_policy(scorer, NO_TENANTS, starvation=starvation)
    cache.set_nodes(nodes)
    return cache


def send_event(cache: GpuCache, kind: str, pod: dict[str, Any]) -> None:
    """Apply one pod event (``ADDED``, ``MODIFIED``, ``DELETED``) through the verb; it must succeed."""
    assert pod_events(cache, [PodEvent.model_validate({"type": kind, "object": pod})]).status == 200


class LiveServer:
    """The real app under uvicorn (with gpufrac's read deadline) on a free loopback port."""

    def __init__(self, cache: GpuCache, **settings: Any) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cfg = Settings(port=port, events_token=EVENTS_TOKEN, **settings)
        self.server = uvicorn.Server(uvicorn_config(create_app(cfg, cache=cache), cfg))
        self.url = f"http://127.0.0.1:{port}"
        self.port = port
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
