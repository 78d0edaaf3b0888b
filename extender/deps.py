"""FastAPI dependencies: long-lived objects live on ``app.state`` (set in ``create_app``)."""

from __future__ import annotations

from typing import Annotated, cast

from fastapi import Depends, Request

from extender.cache import GpuCache
from extender.metrics import Metrics
from extender.settings import Settings
from extender.verbs.bind import Binder


async def _cache(request: Request) -> GpuCache:
    return cast(GpuCache, request.app.state.cache)


async def _metrics(request: Request) -> Metrics:
    return cast(Metrics, request.app.state.metrics)


async def _settings(request: Request) -> Settings:
    return cast(Settings, request.app.state.settings)


async def _binder(request: Request) -> Binder:
    return cast(Binder, request.app.state.binder)


CacheDep = Annotated[GpuCache, Depends(_cache)]
MetricsDep = Annotated[Metrics, Depends(_metrics)]
BinderDep = Annotated[Binder, Depends(_binder)]
SettingsDep = Annotated[Settings, Depends(_settings)]
