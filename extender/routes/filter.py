"""``POST /filter``: which candidate nodes can take the pod. No side effects.

A plain ``def`` handler: FastAPI runs it in its worker threads, so the numpy work never
blocks the event loop that answers ``/healthz`` and ``/metrics``.
"""

from __future__ import annotations

from typing import Annotated

import numpy as np
from fastapi import APIRouter, Depends, Response

from extender.bodies import json_body, json_response
from extender.deps import CacheDep, MetricsDep
from extender.translate import inbound, outbound
from extender.wire import ExtenderArgs, ExtenderFilterResult
from scoring.fit import Reason

router = APIRouter()
_parse, _openapi = json_body(ExtenderArgs)


@router.post("/filter", openapi_extra=_openapi)
def filter_nodes(args: Annotated[ExtenderArgs, Depends(_parse)], cache: CacheDep, metrics: MetricsDep) -> Response:
    """Answer ``ExtenderFilterResult``; a bad pod gets ``Error`` naming annotation and rule."""
    with metrics.timer("filter"):
        node_items = args.Nodes.items if args.Nodes is not None else None
        try:
            intent, names = inbound.extender_args(args.Pod, node_items, args.NodeNames)
        except ValueError as exc:
            metrics.filter_errors.inc()
            return json_response(ExtenderFilterResult(Error=str(exc)))
        ce = cache.evaluate(intent, names)
        codes = ce.evaluation.context.reason
        for code, count in enumerate(np.bincount(codes, minlength=len(Reason)).tolist()):
            if count:
                label = "passed" if code == Reason.FITS else Reason(code).name.lower()
                metrics.filter_nodes.labels(label).inc(count)
        if ce.unknown:
            metrics.filter_nodes.labels("node_unknown").inc(len(ce.unknown))
        return json_response(outbound.filter_reply(ce.evaluation, intent, ce.names, ce.unknown, node_items,
                                                   ce.rejected))
