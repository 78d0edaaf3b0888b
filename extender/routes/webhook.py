"""``POST /filter``, ``/prioritize``, ``/bind``, ``/preempt`` and ``/standalone/pod-events``.

Each of the four verbs is one ``async`` function of ``(app.state, raw body)`` returning
``(status, JSON body)`` (``VERBS``): it parses the body (``extender.bodies.json_body``,
pydantic-core from bytes), calls its verb in ``extender.verbs`` and counts it in the
metrics. ``extender.app.ExtenderApp`` serves them straight from ASGI, before FastAPI's
middleware, routing and dependency resolution (decision record 0013: about half of a
50-node filter's cost was the framework); the FastAPI routes below call the same functions
and document the bodies in the OpenAPI schema (``openapi_extra``).

Where the verb runs: a hop to a worker thread (what FastAPI does for a ``def`` handler)
costs 400-500 us of CPU per call on this machine, more than a 50-node ``filter`` itself
(about 330 us; decision record 0012). So ``filter`` and ``prioritize`` over at most
``INLINE_MAX_CANDIDATES`` nodes run on the event loop (a few milliseconds at most, even for
a shape never seen, which scores every row), larger ones and ``preempt`` in a worker thread,
so ``/healthz`` and ``/metrics`` still answer while a large verb is busy. A cluster-mode
``bind`` that is not fenced, of a pod the cache knows, runs on the event loop too, its
Binding written without blocking (``KubeBinder.bind_on_loop``, ``extender.cluster.loop_api``;
decision record 0033); every other ``bind`` (fenced, ResourceClaims, a pod not seen yet,
standalone) in a worker thread. A cluster-mode ``bind`` holds the pod's GPUs on the event loop first
(``KubeBinder.hold_on_receipt``, no API call), as the request arrives: kube-scheduler sends
the next pod's ``filter`` while this pod's bind is in flight, and a worker thread may wait
milliseconds for the GIL, so a filter answered in between would choose from a node that no
longer has the room (decision record 0026).

Until the cache has listed every node and pod (``/readyz``: cluster mode's first full sync)
the verbs refuse to decide: between the node list and the pod list every GPU would look
free, and a bind there could take share or memory a running pod holds. ``filter`` and
``bind`` answer with ``Error`` (kube-scheduler retries the pod later), ``prioritize`` and
``preempt`` with 503.

``/standalone/pod-events`` decides what the cache believes, so it exists only when the
extender was started with an events token (``--events-token-file`` or
``$GPUFRAC_EVENTS_TOKEN``; ``extender.app`` adds ``events_router`` then), and every call must
present it as ``Authorization: Bearer <token>`` (compared in constant time); otherwise 401,
and nothing is read.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import numpy as np
from anyio import to_thread
from fastapi import APIRouter, Depends, HTTPException, Request, Response

from extender.bodies import BadRequest, json_body, json_dependency, json_response
from extender.deps import CacheDep, SettingsDep
from extender.metrics import Metrics
from extender.verbs import Reply
from extender.verbs.bind import ExtenderBindingArgs, LoopBinder, bind, bind_awaiting
from extender.verbs.filter import ExtenderArgs, error_reply, filter
from extender.verbs.pod_events import PodEvent, pod_events
from extender.verbs.preempt import ExtenderPreemptionArgs, preempt
from extender.verbs.prioritize import prioritize
from scoring.fit import Reason

router = APIRouter()
events_router = APIRouter()
_args, _args_openapi = json_body(ExtenderArgs)
_binding, _binding_openapi = json_body(ExtenderBindingArgs)
_preemption, _preemption_openapi = json_body(ExtenderPreemptionArgs)
_events, _events_openapi = json_body(list[PodEvent])
_REASON_LABELS = ["passed" if r == Reason.FITS else r.name.lower() for r in Reason]
NOT_READY = ("gpufrac: not ready: the cache has not yet listed every node and pod, so it cannot "
             "see which GPUs are taken; retry shortly")

Answer = tuple[int, Any]
"""A verb's HTTP status and JSON body."""


async def filter_verb(state: Any, raw: bytes) -> Answer:
    """``ExtenderFilterResult``; candidates counted by outcome (``gpufrac_filter_nodes_total``).

    Raises
    ------
    extender.bodies.BadRequest
        The body does not validate (400).
    """
    metrics: Metrics = state.metrics
    with metrics.timer("filter"):
        args = await _args(raw)
        if not state.ready():
            metrics.filter_errors.inc()
            metrics.filter_pods.labels("error").inc()
            return 200, error_reply(NOT_READY)
        reply = await _run_sized(args, filter, state.cache, args, state.settings.decision == "filter",
                                 getattr(state, "claim_refusals", None), getattr(state, "claim_shape", None))
        if reply.reasons is None:
            metrics.filter_errors.inc()
            metrics.filter_pods.labels("error").inc()
        else:
            counts = np.bincount(reply.reasons, minlength=len(Reason))
            for code, count in enumerate(counts.tolist()):
                if count:
                    metrics.filter_nodes.labels(_REASON_LABELS[code]).inc(count)
            if reply.unknown:
                metrics.filter_nodes.labels("node_unknown").inc(reply.unknown)
            metrics.filter_pods.labels(_pod_result(counts, reply.unknown)).inc()
        return reply.status, reply.body


INLINE_MAX_CANDIDATES = 1000
"""Largest candidate list ``filter`` and ``prioritize`` evaluate on the event loop."""


async def _run_sized(args: ExtenderArgs, fn: Callable[..., Reply], *fn_args: Any) -> Reply:
    """``fn(*fn_args)`` on the event loop for small candidate lists, else in a worker thread."""
    n = len(args.NodeNames or ()) + (len(args.Nodes.items) if args.Nodes is not None else 0)
    if n <= INLINE_MAX_CANDIDATES:
        return fn(*fn_args)
    return await to_thread.run_sync(fn, *fn_args)


def _pod_result(counts: np.ndarray, unknown: int) -> str:
    """``feasible`` when a node passed; else the reason most candidates failed with (ties:
    the lowest reason code, so the label is deterministic)."""
    if counts[int(Reason.FITS)]:
        return "feasible"
    failed = counts.copy()
    failed[int(Reason.FITS)] = -1
    if failed.max() < max(unknown, 1):
        return "node_unknown" if unknown else "no_nodes"
    return _REASON_LABELS[int(np.argmax(failed))]


async def prioritize_verb(state: Any, raw: bytes) -> Answer:
    """``HostPriorityList``."""
    with state.metrics.timer("prioritize"):
        args = await _args(raw)
        if not state.ready():
            return 503, {"Error": NOT_READY}
        reply = await _run_sized(args, prioritize, state.cache, args, getattr(state, "claim_shape", None))
        return reply.status, reply.body


async def bind_verb(state: Any, raw: bytes) -> Answer:
    """``ExtenderBindingResult``; binds counted by result (``gpufrac_bind_total``)."""
    metrics: Metrics = state.metrics
    with metrics.timer("bind"):
        args = await _binding(raw)
        if not state.ready():
            metrics.binds.labels("error").inc()
            return 200, {"Error": NOT_READY}
        hold = getattr(state, "hold_on_receipt", None)
        if hold is not None:  # held now: a filter answered before the worker runs counts it
            hold(args.PodUID, args.PodNamespace, args.PodName, args.Node)
        on_loop: LoopBinder | None = getattr(state, "bind_on_loop", None)
        pending = on_loop(args.PodUID, args.PodNamespace, args.PodName, args.Node) if on_loop is not None else None
        if pending is not None:
            reply = await bind_awaiting(pending, args)
        else:
            reply = await to_thread.run_sync(bind, state.binder, args)
        metrics.binds.labels(reply.result).inc()
        return reply.status, reply.body


async def preempt_verb(state: Any, raw: bytes) -> Answer:
    """``ExtenderPreemptionResult``."""
    metrics: Metrics = state.metrics
    with metrics.timer("preempt"):
        args = await _preemption(raw)
        if not state.ready():
            return 503, {"Error": NOT_READY}
        reply = await to_thread.run_sync(preempt, state.cache, args)
        if reply.result:
            metrics.preemptions.labels(reply.result).inc()
            metrics.preemption_victims.inc(reply.victims)
        return reply.status, reply.body


VERBS: dict[str, Callable[[Any, bytes], Awaitable[Answer]]] = {
    "/filter": filter_verb, "/prioritize": prioritize_verb, "/bind": bind_verb, "/preempt": preempt_verb}
"""The hot endpoints, served by ``extender.app.ExtenderApp`` straight from ASGI."""


def _route(verb: Callable[[Any, bytes], Awaitable[Answer]]) -> Callable[[Request], Awaitable[Response]]:
    """A FastAPI endpoint serving ``verb`` (documented by the verb's own docstring)."""

    async def endpoint(request: Request) -> Response:
        try:
            status, body = await verb(request.app.state, await request.body())
        except BadRequest as exc:
            status, body = 400, {"Error": str(exc)}
        return json_response(body, status)

    endpoint.__doc__ = verb.__doc__
    return endpoint


# The routes document the verbs in the OpenAPI schema and serve them wherever this router
# is mounted without ExtenderApp's fast path; ExtenderApp answers them before routing.
for _path, _verb, _openapi in (("/filter", filter_verb, _args_openapi), ("/prioritize", prioritize_verb, _args_openapi),
                               ("/bind", bind_verb, _binding_openapi), ("/preempt", preempt_verb, _preemption_openapi)):
    router.add_api_route(_path, _route(_verb), methods=["POST"], openapi_extra=_openapi,
                         name=f"{_path.strip('/')}_route")


def _authorized(request: Request, settings: SettingsDep) -> None:
    token = settings.events_token
    authorization = request.headers.get("authorization")
    expected = f"Bearer {token.get_secret_value()}" if token is not None else None
    if expected is None or authorization is None or not hmac.compare_digest(
            authorization.encode(), expected.encode()):
        raise HTTPException(401, "pod events need 'Authorization: Bearer <events token>'")


@events_router.post("/standalone/pod-events", openapi_extra=_events_openapi, dependencies=[Depends(_authorized)])
def pod_events_route(events: Annotated[list[PodEvent], Depends(json_dependency(_events))],
                     cache: CacheDep) -> Response:
    """``{"applied": n}``, or 400 naming the first bad event (then nothing is applied)."""
    reply = pod_events(cache, events)
    return json_response(reply.body, reply.status)
