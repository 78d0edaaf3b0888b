"""FastAPI dependencies: long-lived objects live on ``app.state`` (set in ``create_app``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from extender.cache import GpuCache
from extender.metrics import Metrics
from extender.settings import Settings
from extender.verbs.bind import Binder


async def _cache(request: Request) -> GpuCache:
    return request.app.state.cache  # type: ignore[no-any-return]


async def _metrics(request: Request) -> Metrics:
    return request.app.state.metrics  # type: ignore[no-any-return]


async def _settings(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


async def _binder(request: Request) -> Binder:
    return request.app.state.binder  # type: ignore[no-any-return]


CacheDep = Annotated[GpuCache, Depends(_cache)]
MetricsDep = Annotated[Metrics, Depends(_metrics)]
BinderDep = Annotated[Binder, Depends(_binder)]
SettingsDep = Annotated[Settings, Depends(_settings)]
