"""``/healthz`` (process up), ``/readyz`` (cache synced), ``/metrics`` (Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from extender.deps import CacheDep, MetricsDep
from extender.routes.jsonresp import json_response

router = APIRouter()


@router.get("/healthz")
def healthz() -> Response:
    """Always 200 while the process serves HTTP."""
    return json_response({"status": "ok"})


@router.get("/readyz")
def readyz(request: Request, cache: CacheDep) -> Response:
    """200 once the cache has had its first full sync, else 503."""
    ready = bool(request.app.state.ready())
    return json_response({"ready": ready, **cache.summary()}, status_code=200 if ready else 503)


@router.get("/metrics")
def metrics_endpoint(metrics: MetricsDep) -> Response:
    """Prometheus text exposition."""
    return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


@router.get("/allocations")
def allocations(cache: CacheDep) -> Response:
    """Every bound pod's allocation (node, GPU indices and UUIDs, share, memory, QoS)."""
    return json_response(cache.allocations())
