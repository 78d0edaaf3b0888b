"""An extender app on an in-memory cache, for route tests; a raw API response for client fakes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi.testclient import TestClient

from extender.app import create_app
from extender.cache import GpuCache
from extender.settings import Settings, scoring_config
from scoring.state import NodeSpec
from scoring.strategies import build_scorer

EVENTS_TOKEN = "test-events-token"
"""The ``events_token`` of ``client_for``'s app; its client sends it on every call."""


@contextmanager
def client_for(nodes: list[NodeSpec], preset: str = "default",
               **settings: object) -> Iterator[tuple[TestClient, GpuCache]]:
    """A started app (lifespan run) whose cache holds ``nodes``; the pod-events endpoint is
    on (``EVENTS_TOKEN``, sent by the client). ``settings``: more ``Settings`` fields."""
    cache = GpuCache(build_scorer(scoring_config(preset)))
    cache.set_nodes(nodes)
    app = create_app(Settings(preset=preset, events_token=EVENTS_TOKEN, **settings), cache=cache)
    with TestClient(app, headers={"Authorization": f"Bearer {EVENTS_TOKEN}"}) as client:
        yield client, cache


class FakeResponse:
    """What the kubernetes client returns with ``_preload_content=False`` (see extender.kubeio)."""

    def __init__(self, body: dict[str, Any] | None = None) -> None:
        self.data = json.dumps(body or {}).encode()

    def release_conn(self) -> None:
        pass
