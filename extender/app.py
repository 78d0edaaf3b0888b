"""``create_app(settings)``: the FastAPI application, its lifespan and error handling."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from kubernetes.client import CoreV1Api
from starlette.exceptions import HTTPException as StarletteHTTPException

from extender.bodies import BodyLimitMiddleware, json_response
from extender.cache import GpuCache
from extender.cluster import ClusterSync, KubeBinder, SyncOptions
from extender.clusterfile import load_cluster_file
from extender.fence import ClaimFence, default_instance_id
from extender.metrics import Metrics
from extender.quarantine import Quarantine
from extender.reload import ConfigWatcher
from extender.routes import health, verbs
from extender.settings import AdminPolicy, Settings, policy_from_settings
from extender.verbs.bind import Binder
from scoring.scorer import build_scorer

log = logging.getLogger(__name__)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:10]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


def create_app(settings: Settings, cache: GpuCache | None = None,
               kube_api: CoreV1Api | None = None) -> FastAPI:
    """Build the extender app.

    Parameters
    ----------
    settings : Settings
    cache : GpuCache, optional
        Pre-filled cache (tests); by default one is built at start-up from the settings'
        scoring config and, in standalone mode, filled from ``settings.cluster_file``.
    kube_api : kubernetes.client.CoreV1Api, optional
        Cluster mode: the API client (built by the caller from a kubeconfig or the
        in-cluster service account). The lifespan starts the watches; ``/readyz`` answers
        200 only after Nodes and Pods have been listed in full.

    Raises
    ------
    ValueError
        Invalid scoring config or cluster file: start-up fails once, with field paths.
    """
    policy = policy_from_settings(settings)
    scorer = build_scorer(policy.scoring)
    own_cache = cache is None
    cache = cache if cache is not None else GpuCache(scorer, policy.tolerance)
    if own_cache or settings.config_file is not None:
        cache.set_policy(scorer, policy.tenants, policy.tolerance)

    def apply_policy(new: AdminPolicy) -> None:
        cache.set_policy(build_scorer(new.scoring), new.tenants, new.tolerance)

    metrics = Metrics(cache.summary, cache.metrics_view)
    quarantine = Quarantine(count=lambda kind, reason: metrics.rejected_objects.labels(kind, reason).inc())
    sync: ClusterSync | None = None
    if settings.mode == "cluster":
        if kube_api is None:
            raise ValueError("cluster mode needs a Kubernetes API client")
        fence = (None if settings.fence_namespace is None else ClaimFence(
            kube_api, settings.fence_namespace, settings.instance_id or default_instance_id(),
            settings.claim_ttl_s, api_timeout_s=settings.bind_api_timeout_s))
        kube_binder = KubeBinder(kube_api, cache, settings.assume_ttl_s, fence=fence,
                                 api_timeout_s=settings.bind_api_timeout_s)
        sync = ClusterSync(kube_api, cache, SyncOptions(
            inventory_stale_after_s=settings.inventory_stale_after_s,
            assume_ttl_s=settings.assume_ttl_s, watch_timeout_s=settings.watch_timeout_s,
            scheduler_name=settings.scheduler_name, requeue_max_pods=settings.requeue_max_pods),
            quarantine=quarantine, binder=kube_binder)
        metrics.cluster.inventory_ages = sync.inventory_ages
        binder: Binder = kube_binder.bind
    else:
        binder = cache.bind

    watcher = (None if settings.config_file is None else
               ConfigWatcher(settings.config_file, apply_policy, metrics, settings.config_poll_s))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if watcher is not None:
            watcher.start()
        if sync is not None:
            sync.start()
            app.state.ready = lambda: sync.synced
        else:
            if own_cache and settings.cluster_file is not None:
                cache.set_nodes(load_cluster_file(settings.cluster_file,
                                                  replicas_per_gpu=settings.replicas_per_gpu))
            app.state.ready = lambda: True
        yield
        app.state.ready = lambda: False
        if watcher is not None:
            watcher.stop()
        if sync is not None:
            sync.stop()

    app = FastAPI(title="gpufrac extender", lifespan=lifespan)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_request_body_bytes)
    app.state.settings = settings
    app.state.cache = cache
    app.state.metrics = metrics
    app.state.quarantine = quarantine
    app.state.config_watcher = watcher
    app.state.ready = lambda: False
    app.state.binder = binder

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> Response:
        return json_response({"Error": _validation_message(exc)}, status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # 404, 405, 413 and the rest answer in the extender's own shape, never {"detail"}.
        return json_response({"Error": str(exc.detail)}, status_code=exc.status_code)

    app.include_router(verbs.router)
    app.include_router(health.router)
    if settings.mode == "standalone" and settings.events_token is not None:
        app.include_router(verbs.events_router)
    return app
