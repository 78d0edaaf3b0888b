"""``prioritize``: 0..10 per candidate; exactly one node (gpufrac's choice) gets 10.

Request ``ExtenderArgs`` (as ``filter``); reply ``HostPriorityList``: ``outbound.wire_scores``
per known candidate, 0 for nodes not in gpufrac's cache and for every node when the pod's
tenant may not place it. kube-scheduler ignores prioritize errors; a pod that cannot be read
still gets a 400 with ``Error`` saying why.
"""

from __future__ import annotations

from typing import TypedDict

from extender.cache import GpuCache
from extender.translate import inbound, outbound
from extender.verbs import Reply
from extender.verbs.filter import ExtenderArgs, Shape


class HostPriority(TypedDict):
    """One entry of the reply (``extender/v1.HostPriority``)."""

    Host: str
    Score: int


def prioritize(cache: GpuCache, args: ExtenderArgs, shape: Shape | None = None) -> Reply:
    """Answer ``prioritize``; right after ``filter`` for the same pod the evaluation is the
    cache's memo (``GpuCache.evaluate``), not a second one. ``shape``: as ``filter``'s."""
    try:
        intent, names = inbound.extender_args(
            args.Pod, args.Nodes.items if args.Nodes is not None else None, args.NodeNames)
        if shape is not None:
            intent = shape(intent)
    except ValueError as exc:
        return Reply({"Error": str(exc)}, status=400)
    ce = cache.evaluate(intent, names)
    scores = [0] * len(ce.names) if ce.rejection is not None else outbound.wire_scores(ce.evaluation)
    body: list[HostPriority] = [{"Host": n, "Score": s} for n, s in zip(ce.names, scores, strict=True)]
    body.extend({"Host": n, "Score": 0} for n in ce.unknown)
    return Reply(body)
