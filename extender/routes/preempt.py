"""``POST /preempt``: on each node kube-scheduler proposes, the fewest lowest-class victims
that make the pod fit on the GPUs (``GpuCache.preempt``). No side effects: kube-scheduler
deletes the victims it then picks, and the pod watch frees their share."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Response

from extender.bodies import json_body, json_response
from extender.deps import CacheDep, MetricsDep
from extender.wire import ExtenderPreemptionArgs
from podspec.pods import pod_intent

router = APIRouter()
_parse, _openapi = json_body(ExtenderPreemptionArgs)


@router.post("/preempt", openapi_extra=_openapi)
def preempt(args: Annotated[ExtenderPreemptionArgs, Depends(_parse)], cache: CacheDep,
            metrics: MetricsDep) -> Response:
    """Answer ``ExtenderPreemptionResult`` (victims by UID, the nodeCacheCapable form, which
    kube-scheduler reads whatever ``nodeCacheCapable`` says). A bad pod gets a 400 with
    ``Error``: kube-scheduler then gives up this preemption attempt."""
    with metrics.timer("preempt"):
        try:
            intent = pod_intent(args.Pod)
        except ValueError as exc:
            return json_response({"Error": str(exc)}, status_code=400)
        proposed = args.NodeNameToMetaVictims or args.NodeNameToVictims or {}
        victims = cache.preempt(intent, list(proposed))
        return json_response({"NodeNameToMetaVictims": {
            node: {"Pods": [{"UID": uid} for uid in uids],
                   # gpufrac does not see PodDisruptionBudgets: kube-scheduler's count for the
                   # node is passed on (it ranks candidates by it).
                   "NumPDBViolations": proposed[node].NumPDBViolations}
            for node, uids in victims.items()}})
