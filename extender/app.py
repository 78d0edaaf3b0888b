"""``create_app(settings)``: the FastAPI application, its lifespan and error handling."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from kubernetes.client import CoreV1Api
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from extender.admin_config import AdminConfig
from extender.bodies import (
    BadRequest,
    BodyLimitMiddleware,
    declared_over,
    encode_json,
    json_response,
    too_large_message,
    validation_message,
)
from extender.cache import GpuCache
from extender.cluster import ClusterSync, KubeBinder, SyncOptions
from extender.cluster.claim_allocator import ClaimBinding, ClaimPlacement, ClaimWriter
from extender.cluster.loop_api import LoopApi
from extender.cluster.models import GpuModelsPublisher, ModelsOptions
from extender.cluster.stall import StallOptions, StallWatch
from extender.clusterfile import load_cluster_file
from extender.compiled import REFERENCE, kernels
from extender.fence import ClaimFence, default_instance_id
from extender.metrics import Metrics
from extender.quarantine import Quarantine
from extender.reload import ConfigWatcher
from extender.routes import health, webhook
from extender.settings import Settings, admin_config_from_settings
from extender.verbs.bind import Binder
from scoring.scorer import build_scorer

log = logging.getLogger(__name__)


class ExtenderApp(FastAPI):
    """The FastAPI app, with the four verbs answered straight from ASGI.

    ``POST /filter``, ``/prioritize``, ``/bind`` and ``/preempt`` (``extender.routes.webhook.VERBS``)
    are read, size-limited (413 past ``max_request_body_bytes``, as ``BodyLimitMiddleware``),
    handled and answered here, before FastAPI's middleware stack, routing and dependency
    resolution; everything else (health, metrics, inspection, OpenAPI docs, lifespan) goes
    through FastAPI as usual. A verb that raises answers 500 with the error named, logged
    with its traceback (ServerErrorMiddleware is not on this path).
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            verb = webhook.VERBS.get(scope["path"])
            if verb is not None:
                await self._serve_verb(verb, scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    async def _serve_verb(self, verb: Any, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self.state.settings.max_request_body_bytes
        status, body = await self._answer(verb, scope, receive, limit)
        if status < 0:
            return  # the client went away
        data = encode_json(body)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})

    async def _answer(self, verb: Any, scope: Scope, receive: Receive, limit: int) -> tuple[int, Any]:
        too_big = (413, {"Error": too_large_message(limit)})
        if declared_over(scope, limit):
            return too_big
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return -1, None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return too_big
            chunks.append(chunk)
            more = message.get("more_body", False)
        try:
            answer: tuple[int, Any] = await verb(self.state, b"".join(chunks))
            return answer
        except BadRequest as exc:
            return 400, {"Error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - answer kube-scheduler, name the error, log the rest
            log.exception("%s failed", scope["path"])
            return 500, {"Error": f"gpufrac: internal error in {scope['path']}: {type(exc).__name__}"}


def create_app(settings: Settings, cache: GpuCache | None = None,
               kube_api: CoreV1Api | None = None) -> ExtenderApp:
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
    policy = admin_config_from_settings(settings)
    own_cache = cache is None
    scorer = build_scorer(policy.scoring)
    cache = cache if cache is not None else GpuCache(scorer, policy.tolerance)
    # The numpy reference scores until the compiled kernels are ready (extender.compiled: the
    # same numbers; compiling takes seconds in an image), then they score in its place, under
    # the policy of the moment. A cache handed in keeps its own scorer.
    scores_here = own_cache or settings.config_file is not None
    policy_lock = threading.Lock()
    scoring_with, in_use = REFERENCE, scorer

    def apply_policy(new: AdminConfig) -> None:
        nonlocal in_use
        with policy_lock:
            in_use = scoring_with.scorer(new.scoring)
            cache.set_policy(in_use, new.tenants, new.tolerance, new.starvation, new.defrag)

    def compile_kernels() -> None:
        nonlocal scoring_with
        compiled = kernels()
        log.info("scoring with %s", compiled.backend)
        if compiled is not REFERENCE:
            with policy_lock:  # the same numbers, swapped in place: nothing the cache keeps is dropped
                scoring_with = compiled
                compiled.swap_into(in_use)
        scoring_is(compiled.backend)

    if scores_here:
        cache.set_policy(scorer, policy.tenants, policy.tolerance, policy.starvation, policy.defrag)

    metrics = Metrics(cache.summary, cache.metrics_view)
    quarantine = Quarantine(count=lambda kind, reason: metrics.rejected_objects.labels(kind, reason).inc())
    sync: ClusterSync | None = None
    stall: StallWatch | None = None
    models: GpuModelsPublisher | None = None
    if settings.mode == "cluster":
        if kube_api is None:
            raise ValueError("cluster mode needs a Kubernetes API client")
        fence = (None if settings.fence_namespace is None else ClaimFence(
            kube_api, settings.fence_namespace, settings.instance_id or default_instance_id(),
            settings.claim_ttl_s, api_timeout_s=settings.bind_api_timeout_s))
        kube_binder = KubeBinder(kube_api, cache, settings.assume_ttl_s, fence=fence,
                                 api_timeout_s=settings.bind_api_timeout_s)
        kube_binder.loop_api = LoopApi.for_client(kube_api)  # None: binds write through the client
        sync = ClusterSync(kube_api, cache, SyncOptions(
            inventory_stale_after_s=settings.inventory_stale_after_s,
            assume_ttl_s=settings.assume_ttl_s, watch_timeout_s=settings.watch_timeout_s,
            scheduler_name=settings.scheduler_name, requeue_max_pods=settings.requeue_max_pods,
            resource_claims=settings.resource_claims),
            quarantine=quarantine, binder=kube_binder, on_plan=metrics.planned,
            count_eviction=lambda result: metrics.defrag_evictions.labels(result).inc())
        metrics.cluster.inventory_ages = sync.inventory_ages
        metrics.cluster.inventory_stale_after_s = settings.inventory_stale_after_s
        metrics.cluster.watch_silences = sync.watch_silences
        nodes_skew, replica_skew = sync.clock_skews, (fence.skews if fence is not None else dict)
        metrics.cluster.clock_skews = lambda: {**{("node", n): s for n, s in nodes_skew().items()},
                                               **{("replica", r): s for r, s in replica_skew().items()}}
        lease_ns, _, lease_name = (settings.scheduler_lease or "").partition("/")
        stall = watch = StallWatch(kube_api, StallOptions(
            scheduler_name=settings.scheduler_name, after_s=settings.stall_after_s,
            lease=(lease_ns, lease_name) if settings.scheduler_lease else None,
            scheduler_pod_selector=settings.scheduler_pod_selector, poll_s=min(5.0, settings.stall_after_s / 2)))
        metrics.cluster.scheduler_stall = lambda: watch.report
        if settings.gpu_models_configmap:
            cm_ns, _, cm_name = settings.gpu_models_configmap.partition("/")
            synced = sync
            models = GpuModelsPublisher(kube_api, lambda: (g[2] for g in cache.metrics_view().gpus),
                                        ModelsOptions(cm_ns, cm_name), ready=lambda: synced.synced)
        cache.count_waiting = False  # the defragmentation plan counts them, with the nodes' labels
        binder: Binder = kube_binder.bind
    else:
        binder = cache.bind

    watcher = (None if settings.config_file is None else
               ConfigWatcher(settings.config_file, apply_policy, metrics, settings.config_poll_s))

    loops_stop = threading.Event()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if scores_here:
            scoring_is(f"{REFERENCE.backend}, compiling")
            threading.Thread(target=compile_kernels, name="gpufrac-compile", daemon=True).start()
        if watcher is not None:
            watcher.start()
        if sync is not None:
            sync.start()
            app.state.ready = lambda: sync.synced and not sync.silent_watches()
            app.state.ready_detail = lambda: {
                "silent_watches": {w: round(s, 1) for w, s in sync.silent_watches().items()},
                "watch_silence_s": {w: round(s, 1) for w, s in sync.watch_silences().items()},
                **({} if stall is None else {"scheduler": stall.report.as_dict()})}
            if stall is not None:
                threading.Thread(target=stall.loop, args=(loops_stop,), name="gpufrac-stall", daemon=True).start()
            if models is not None:
                threading.Thread(target=models.loop, args=(loops_stop,), name="gpufrac-gpu-models",
                                 daemon=True).start()
        else:
            if own_cache and settings.cluster_file is not None:
                cache.set_nodes(load_cluster_file(settings.cluster_file,
                                                  replicas_per_gpu=settings.replicas_per_gpu))
            elif own_cache:
                log.warning("standalone mode without --cluster-file: no nodes are known, so filter fails "
                            "every pod on every node; give --cluster-file (a YAML node list or an openb CSV) "
                            "or --mode cluster")
            app.state.ready = lambda: True
        yield
        app.state.ready = lambda: False
        if watcher is not None:
            watcher.stop()
        if sync is not None:
            sync.stop()
        if sync is not None and kube_binder.loop_api is not None:
            kube_binder.loop_api.close()
        loops_stop.set()

    app = ExtenderApp(title="gpufrac extender", lifespan=lifespan)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_request_body_bytes)
    app.state.settings = settings
    app.state.cache = cache
    app.state.metrics = metrics
    app.state.quarantine = quarantine
    app.state.config_watcher = watcher
    app.state.ready = lambda: False
    app.state.ready_detail = dict
    scoring_now = REFERENCE.backend if scores_here else "the scorer of the cache handed in"
    app.state.scoring = lambda: scoring_now

    def scoring_is(backend: str) -> None:
        """What scores now: ``/readyz``'s ``scoring`` and ``gpufrac_scoring_info``."""
        nonlocal scoring_now
        scoring_now = backend
        metrics.scoring.info({"backend": backend})
    scoring_is(scoring_now)
    app.state.binder = binder
    app.state.hold_on_receipt = kube_binder.hold_on_receipt if sync is not None else None
    app.state.bind_on_loop = kube_binder.bind_on_loop if sync is not None else None
    app.state.claim_refusals = app.state.claim_shape = None
    if sync is not None and settings.allocate_claims:
        placement = ClaimPlacement(sync.resource_claims)
        kube_binder.claims = ClaimBinding(placement, ClaimWriter(
            kube_api, sync.resource_claims.node_gpus, settings.bind_api_timeout_s), sync.resource_claims, cache)
        app.state.claim_refusals, app.state.claim_shape = placement.refusals, placement.shape
    elif sync is not None and settings.resource_claims:
        book = sync.resource_claims

        def claim_refusals(pod: Mapping[str, Any], names: Sequence[str]) -> dict[str, str]:
            return book.refusals(pod, names, cache.gpu_rooms)
        app.state.claim_refusals = claim_refusals
    app.state.defrag = None if sync is None else sync.defrag.latest

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> Response:
        return json_response({"Error": validation_message(exc.errors())}, status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # 404, 405, 413 and the rest answer in the extender's own shape, never {"detail"}.
        return json_response({"Error": str(exc.detail)}, status_code=exc.status_code)

    app.include_router(webhook.router)
    app.include_router(health.router)
    if settings.mode == "standalone" and settings.events_token is not None:
        app.include_router(webhook.events_router)
    return app
