"""An extender app on an in-memory cache, for route tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fastapi.testclient import TestClient

from extender.app import create_app
from extender.cache import GpuCache
from extender.settings import Settings, scoring_config
from scoring.state import NodeSpec
from scoring.strategies import build_scorer


@contextmanager
def client_for(nodes: list[NodeSpec], preset: str = "default") -> Iterator[tuple[TestClient, GpuCache]]:
    """A started app (lifespan run) whose cache holds ``nodes``."""
    cache = GpuCache(build_scorer(scoring_config(preset)))
    cache.set_nodes(nodes)
    app = create_app(Settings(preset=preset), cache=cache)
    with TestClient(app) as client:
        yield client, cache
