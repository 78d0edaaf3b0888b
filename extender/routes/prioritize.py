"""``POST /prioritize``: 0..10 per candidate; exactly one node (gpufrac's choice) gets 10."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Response

from extender.bodies import json_body, json_response
from extender.deps import CacheDep, MetricsDep
from extender.translate import inbound, outbound
from extender.wire import ExtenderArgs

router = APIRouter()
_parse, _openapi = json_body(ExtenderArgs)


@router.post("/prioritize", openapi_extra=_openapi)
def prioritize_nodes(args: Annotated[ExtenderArgs, Depends(_parse)], cache: CacheDep, metrics: MetricsDep) -> Response:
    """Answer ``HostPriorityList``; unknown or infeasible nodes score 0."""
    with metrics.timer("prioritize"):
        try:
            intent, names = inbound.extender_args(
                args.Pod, args.Nodes.items if args.Nodes is not None else None, args.NodeNames)
        except ValueError as exc:
            # kube-scheduler ignores prioritize errors; say why anyway.
            return json_response({"Error": str(exc)}, status_code=400)
        ce = cache.evaluate(intent, names)
        return json_response(outbound.prioritize_reply(ce.evaluation, ce.names, ce.unknown, ce.rejected))
