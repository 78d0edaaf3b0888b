"""``pod-events`` (standalone mode only): pod watch events fed by hand.

In cluster mode the Kubernetes pod watch calls the same ``GpuCache.apply_pod_event``; this
verb exists so that a standalone extender (the replay) learns of every pod it did not bind
(CPU-only pods, deletions) through the very same path. It is gpufrac's own, not
kube-scheduler's; the route guards it with the events token.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from extender.cache import GpuCache
from extender.verbs import Reply, WireModel
from podspec.pods import PodIntent, pod_intent


class PodEvent(WireModel):
    """A pod watch event (``{"type", "object"}``), the standalone cache-update input."""

    type: Literal["ADDED", "MODIFIED", "DELETED"]
    object: dict[str, Any] = Field()


def pod_events(cache: GpuCache, events: list[PodEvent]) -> Reply:
    """Apply a batch of events in order.

    All events are parsed first; if any is invalid the batch is refused with 400 naming the
    event, and nothing is applied.
    """
    parsed: list[tuple[Literal["ADDED", "MODIFIED", "DELETED"], PodIntent]] = []
    for i, event in enumerate(events):
        try:
            intent = pod_intent(event.object)
        except ValueError as exc:
            return Reply({"Error": f"events[{i}]: {exc}"}, status=400)
        if not intent.uid:
            return Reply({"Error": f"events[{i}]: Pod.metadata.uid missing"}, status=400)
        parsed.append((event.type, intent))
    for kind, intent in parsed:
        cache.apply_pod_event(kind, intent)
    return Reply({"applied": len(parsed)})
