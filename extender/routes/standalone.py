"""``POST /standalone/pod-events``: pod watch events fed by hand (standalone mode only).

In cluster mode the Kubernetes pod watch calls the same ``GpuCache.apply_pod_event``; this
endpoint exists so that a standalone extender (the replay) learns of every pod it did not
bind (CPU-only pods, deletions) through the very same path.

Whoever may post here decides what the cache believes, so the endpoint exists only when
the extender was started with an events token (``--events-token-file`` or
``$GPUFRAC_EVENTS_TOKEN``), and every call must present it as ``Authorization: Bearer
<token>`` (compared in constant time); otherwise 401, and nothing is read.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Request, Response

from extender.bodies import json_body, json_response
from extender.deps import CacheDep, SettingsDep
from extender.wire import PodEvent
from podspec.pods import pod_intent

router = APIRouter()
_parse, _openapi = json_body(list[PodEvent])


def _authorized(request: Request, settings: SettingsDep) -> None:
    token = settings.events_token
    authorization = request.headers.get("authorization")
    expected = f"Bearer {token.get_secret_value()}" if token is not None else None
    if expected is None or authorization is None or not hmac.compare_digest(
            authorization.encode(), expected.encode()):
        raise HTTPException(401, "pod events need 'Authorization: Bearer <events token>'")


@router.post("/standalone/pod-events", openapi_extra=_openapi, dependencies=[Depends(_authorized)])
def pod_events(events: Annotated[list[PodEvent], Depends(_parse)], cache: CacheDep) -> Response:
    """Apply a batch of ``{"type", "object"}`` events in order.

    All events are parsed first; if any is invalid the batch is refused with 400 naming the
    event, and nothing is applied.
    """
    parsed = []
    for i, event in enumerate(events):
        try:
            intent = pod_intent(event.object)
        except ValueError as exc:
            return json_response({"Error": f"events[{i}]: {exc}"}, status_code=400)
        if not intent.uid:
            return json_response({"Error": f"events[{i}]: Pod.metadata.uid missing"}, 400)
        parsed.append((event.type, intent))
    for kind, intent in parsed:
        cache.apply_pod_event(kind, intent)  # type: ignore[arg-type]
    return json_response({"applied": len(parsed)})
