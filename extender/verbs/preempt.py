"""``preempt``: on each node kube-scheduler proposes, the fewest lowest-class victims that make
the pod fit on the GPUs (``GpuCache.preempt``). No side effects: kube-scheduler deletes the
victims it then picks, and the pod watch frees their share.

Request ``ExtenderPreemptionArgs``; reply ``ExtenderPreemptionResult`` with victims by UID
(the nodeCacheCapable form, which kube-scheduler reads whatever ``nodeCacheCapable`` says). A
pod that cannot be read gets a 400 with ``Error``: kube-scheduler then gives up this attempt.
"""

from __future__ import annotations

from typing import Any, TypedDict

from pydantic import Field

from extender.cache import GpuCache
from extender.verbs import Reply, WireModel
from podspec.pods import pod_intent


class MetaPod(WireModel):
    """``extender/v1.MetaPod``: a pod by UID (nodeCacheCapable preemption)."""

    UID: str = Field(min_length=1)


class MetaVictims(WireModel):
    """``extender/v1.MetaVictims``: victims on one node, by UID."""

    Pods: list[MetaPod] = Field(default_factory=list)
    NumPDBViolations: int = Field(0, ge=0, le=2**63 - 1)
    """Go ``int64``: larger values cannot be answered back (and cannot be real)."""


class Victims(WireModel):
    """``extender/v1.Victims``: victims on one node as full Pod objects (nodeCacheCapable false)."""

    Pods: list[dict[str, Any]] = Field(default_factory=list)
    NumPDBViolations: int = Field(0, ge=0, le=2**63 - 1)


class ExtenderPreemptionArgs(WireModel):
    """Body of ``preempt``: the preemptor and, per candidate node, kube-scheduler's victims."""

    Pod: dict[str, Any]
    NodeNameToVictims: dict[str, Victims] | None = None
    NodeNameToMetaVictims: dict[str, MetaVictims] | None = None


class ExtenderPreemptionResult(TypedDict):
    """Reply to ``preempt``: node name -> ``{"Pods": [{"UID"}], "NumPDBViolations"}``."""

    NodeNameToMetaVictims: dict[str, dict[str, Any]]


def preempt(cache: GpuCache, args: ExtenderPreemptionArgs) -> Reply:
    """Answer ``preempt``; only nodes where preemption works are in the reply."""
    try:
        intent = pod_intent(args.Pod, defrag_fields=False)
    except ValueError as exc:
        return Reply({"Error": str(exc)}, status=400)
    proposed = args.NodeNameToMetaVictims or args.NodeNameToVictims or {}
    victims = cache.preempt(intent, list(proposed))
    body: ExtenderPreemptionResult = {"NodeNameToMetaVictims": {
        node: {"Pods": [{"UID": uid} for uid in uids],
               # gpufrac does not see PodDisruptionBudgets: kube-scheduler's count for the
               # node is passed on (it ranks candidates by it).
               "NumPDBViolations": proposed[node].NumPDBViolations}
        for node, uids in victims.items()}}
    return Reply(body, result="possible" if victims else "impossible",
                 victims=min((len(uids) for uids in victims.values()), default=0))
