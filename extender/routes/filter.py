"""``POST /filter``: which candidate nodes can take the pod. No side effects."""

from __future__ import annotations

from fastapi import APIRouter, Response

from extender import translate
from extender.deps import CacheDep, MetricsDep
from extender.routes.jsonresp import json_response
from extender.wire import ExtenderArgs, ExtenderFilterResult, NodeList
from scoring.fit import Reason

router = APIRouter()


@router.post("/filter")
def filter_nodes(args: ExtenderArgs, cache: CacheDep, metrics: MetricsDep) -> Response:
    """Answer ``ExtenderFilterResult``; a bad pod gets ``Error`` naming annotation and rule."""
    with metrics.timer("filter"):
        try:
            names = translate.node_names_from_args(
                args.Nodes.model_dump() if args.Nodes is not None else None, args.NodeNames)
            intent = translate.pod_intent(args.Pod)
        except ValueError as exc:
            metrics.filter_errors.inc()
            return json_response(ExtenderFilterResult(Error=str(exc)))
        ce = cache.evaluate(intent, names)
        ctx = ce.evaluation.context
        messages = translate.failure_messages(ce.evaluation, intent, ce.request_state)
        failed = dict.fromkeys(ce.unknown, translate.NODE_UNKNOWN_MESSAGE)
        unresolvable: dict[str, str] = {}
        for pos, msg in messages.items():
            reason = Reason(int(ctx.reason[pos]))
            target = unresolvable if reason in translate.UNRESOLVABLE else failed
            target[ce.names[pos]] = msg
            metrics.filter_nodes.labels(reason.name.lower()).inc()
        if ce.unknown:
            metrics.filter_nodes.labels("node_unknown").inc(len(ce.unknown))
        passed = [ce.names[i] for i in range(len(ce.names)) if ctx.node_fits[i]]
        metrics.filter_nodes.labels("passed").inc(len(passed))
        if args.Nodes is not None:
            keep = set(passed)
            items = [it for it in args.Nodes.items if it.get("metadata", {}).get("name") in keep]
            result = ExtenderFilterResult(Nodes=NodeList(items=items), FailedNodes=failed,
                                          FailedAndUnresolvableNodes=unresolvable)
        else:
            result = ExtenderFilterResult(NodeNames=passed, FailedNodes=failed,
                                          FailedAndUnresolvableNodes=unresolvable)
        return json_response(result)
