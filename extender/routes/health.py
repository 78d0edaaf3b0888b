"""``/healthz`` (process up), ``/readyz`` (cache synced), ``/metrics`` (Prometheus),
``/quarantine`` (objects skipped), ``/allocations``, ``/nodes`` (each node's GPUs as counted),
``/defrag`` (the defragmentation plan).

The first four are ``async`` and never take the cache lock: they answer from the event loop
at once, whatever a verb is doing in a worker thread.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from extender.bodies import json_response
from extender.cache import views
from extender.deps import CacheDep, MetricsDep

router = APIRouter()


@router.get("/healthz")
async def healthz() -> Response:
    """Always 200 while the process serves HTTP."""
    return json_response({"status": "ok"})


@router.get("/readyz")
async def readyz(request: Request, cache: CacheDep) -> Response:
    """200 once the cache has had its first full sync and no watch is silent (cluster mode:
    ``silent_watches`` names each with the seconds since its last sign of life), else 503
    (lock-free: answers at once while a verb is busy). ``scoring`` says what scores:
    ``numpy, compiling`` until the compiled kernels are in use, then ``numba <version>``, or
    ``numpy`` (numba absent or failed: the same placements, slower)."""
    ready = bool(request.app.state.ready())
    return json_response({"ready": ready, "scoring": request.app.state.scoring(),
                          **request.app.state.ready_detail(), **cache.summary()},
                         status_code=200 if ready else 503)


@router.get("/metrics")
async def metrics_endpoint(metrics: MetricsDep) -> Response:
    """Prometheus text exposition."""
    return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


@router.get("/quarantine")
async def quarantine(request: Request) -> Response:
    """Objects the API watch could not read and skipped (cluster mode; empty otherwise)."""
    q = request.app.state.quarantine
    return json_response([{"kind": r.kind, "key": r.key, "message": r.message} for r in q.entries()])


@router.get("/allocations")
def allocations(cache: CacheDep) -> Response:
    """Every bound pod's allocation (node, GPU indices and UUIDs, share, memory, QoS)."""
    return json_response(cache.allocations())


@router.get("/nodes")
def nodes(cache: CacheDep) -> Response:
    """Every node's GPUs as the cache counts them (``views.node_inventory``), from a copy of
    the state taken under the lock and read outside it: with ``/allocations``, what
    ``gpufrac inspect --url`` shows of any running gpufrac."""
    return json_response(views.node_inventory(cache.state_copy()))


@router.get("/defrag")
def defrag(request: Request, cache: CacheDep) -> Response:
    """The last defragmentation plan (cluster mode; ``extender.cluster.defragmenter``), with its age
    in seconds, whether it is acted on, and the nodes held now (by starvation protection or for a
    step acted on); 404 in standalone mode (no PodDisruptionBudgets to read there). A worker
    thread: the holds are read under the cache lock."""
    latest = request.app.state.defrag
    if latest is None:
        return json_response({"Error": "the defragmentation plan is made in cluster mode only "
                                       "(it reads PodDisruptionBudgets from the API)"}, status_code=404)
    made, age_s = latest()
    holds = [{"node": r.node, "pod": r.pod, "for": "starvation" if r.ttl_s is None else "defragmentation"}
             for r in cache.reservations()]
    return json_response({**made.as_dict(), "age_s": age_s, "evict": cache.defrag_policy.evict, "held": holds})
