"""``POST /bind``: choose the GPUs on the node kube-scheduler picked and record them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Response

from extender.bodies import json_body, json_response
from extender.cache import BindError
from extender.deps import BinderDep, MetricsDep
from extender.wire import ExtenderBindingArgs, ExtenderBindingResult

router = APIRouter()
_parse, _openapi = json_body(ExtenderBindingArgs)


@router.post("/bind", openapi_extra=_openapi)
def bind_pod(args: Annotated[ExtenderBindingArgs, Depends(_parse)], binder: BinderDep, metrics: MetricsDep) -> Response:
    """Answer ``ExtenderBindingResult``: empty ``Error`` when the allocation is recorded.

    Standalone mode records the allocation in memory; cluster mode holds it as assumed,
    then creates the Binding carrying the allocation annotations (``extender.cluster``).
    """
    with metrics.timer("bind"):
        try:
            binder(args.PodUID, args.PodNamespace, args.PodName, args.Node)
        except BindError as exc:
            metrics.binds.labels("error").inc()
            return json_response(ExtenderBindingResult(Error=str(exc)))
        metrics.binds.labels("ok").inc()
        return json_response(ExtenderBindingResult())
