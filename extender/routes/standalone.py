"""``POST /standalone/pod-events``: pod watch events fed by hand (standalone mode only).

In cluster mode the Kubernetes pod watch calls the same ``GpuCache.apply_pod_event``; this
endpoint exists so that a standalone extender (the replay) learns of every pod it did not
bind (CPU-only pods, deletions) through the very same path.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Response

from extender import translate
from extender.deps import CacheDep
from extender.routes.body import json_body
from extender.routes.jsonresp import json_response
from extender.wire import PodEvent

router = APIRouter()
_parse, _openapi = json_body(list[PodEvent])


@router.post("/standalone/pod-events", openapi_extra=_openapi)
def pod_events(events: Annotated[list[PodEvent], Depends(_parse)], cache: CacheDep) -> Response:
    """Apply a batch of ``{"type", "object"}`` events in order.

    All events are parsed first; if any is invalid the batch is refused with 400 naming the
    event, and nothing is applied.
    """
    parsed = []
    for i, event in enumerate(events):
        try:
            intent = translate.pod_intent(event.object)
        except ValueError as exc:
            return json_response({"Error": f"events[{i}]: {exc}"}, status_code=400)
        if not intent.uid:
            return json_response({"Error": f"events[{i}]: Pod.metadata.uid missing"}, 400)
        parsed.append((event.type, intent))
    for kind, intent in parsed:
        cache.apply_pod_event(kind, intent)  # type: ignore[arg-type]
    return json_response({"applied": len(parsed)})
