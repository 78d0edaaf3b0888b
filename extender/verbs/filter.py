"""``filter``: which candidate nodes can take the pod. No side effects.

Request ``ExtenderArgs``; reply ``ExtenderFilterResult`` (``extender/v1``): passing nodes in
``NodeNames`` (nodeCacheCapable true) or ``Nodes`` (false, the passing Node objects echoed),
the others in ``FailedNodes`` or, where preemption cannot help, ``FailedAndUnresolvableNodes``,
each with the reason kube-scheduler shows in the pod's FailedScheduling event. A pod that
cannot be read gets ``Error`` naming the field and the rule.

With ``decide`` (``Settings.decision == "filter"``, the default) only gpufrac's chosen node
(``Evaluation.best``) passes: kube-scheduler then skips ``prioritize`` and its own score
plugins ("When only one node after predicate, just use it", ``schedule_one.go``), as HAMi's
filter does. The other feasible nodes are left out of the reply, not failed: they did not
fail, and kube-scheduler shows no reason for them. Still no side effect: ``bind`` chooses
and records the GPUs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict

import numpy as np
from pydantic import Field

from extender.cache import GpuCache
from extender.translate import inbound, outbound
from extender.verbs import Reply, WireModel
from podspec.pods import PodIntent, item_name


class NodeList(WireModel):
    """``v1.NodeList`` as sent when ``nodeCacheCapable`` is false."""

    items: list[dict[str, Any]] = Field(default_factory=list)


class ExtenderArgs(WireModel):
    """Body of ``filter`` and ``prioritize``."""

    Pod: dict[str, Any]
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None


class ExtenderFilterResult(TypedDict):
    """Reply to ``filter``."""

    Nodes: dict[str, Any] | None
    NodeNames: list[str] | None
    FailedNodes: dict[str, str]
    FailedAndUnresolvableNodes: dict[str, str]
    Error: str


def error_reply(message: str) -> ExtenderFilterResult:
    """The ``ExtenderFilterResult`` of a filter that decided nothing: ``Error`` says why."""
    return {"Nodes": None, "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
            "Error": message}


Refuse = Callable[[Mapping[str, Any], Sequence[str]], dict[str, str]]
"""(pod, nodes that passed) -> the nodes to fail and why: ``ResourceClaimBook.refusals``."""


Shape = Callable[[PodIntent], PodIntent]
"""The pod as gpufrac places it, asking what its ResourceClaims ask (``--allocate-claims``:
``ClaimPlacement.shape``); raises ``ValueError`` with the reason it cannot be placed."""


def filter(cache: GpuCache, args: ExtenderArgs, decide: bool = True,  # noqa: A001 - the verb's name
           refuse: Refuse | None = None, shape: Shape | None = None) -> Reply:
    """Answer ``filter`` from one evaluation of the pod on the candidates.

    Parameters
    ----------
    cache : GpuCache
    args : ExtenderArgs
    decide : bool
        Pass only the chosen node (module notes); False: every feasible node.
    refuse : callable, optional
        Fails some of the nodes that passed, with a reason (cluster mode with
        ``--resource-claims``: the nodes where kube-scheduler's DRA allocator would over-commit
        a GPU for the pod's claims); the chosen node is the best of the others.
    shape : callable, optional
        Applied to the pod before it is evaluated (``Shape``); its ``ValueError`` is the
        reply's ``Error``.

    Returns
    -------
    Reply
        ``ExtenderFilterResult``; ``reasons`` and ``unknown`` for the filter metrics.
    """
    node_items = args.Nodes.items if args.Nodes is not None else None
    try:
        intent, names = inbound.extender_args(args.Pod, node_items, args.NodeNames)
        if shape is not None:
            intent = shape(intent)
    except ValueError as exc:
        return Reply(error_reply(str(exc)))
    ce = cache.evaluate(intent, names)
    if ce.rejection is not None:
        passed: list[str] = []
        failed: dict[str, str] = {}
        unresolvable = dict.fromkeys([*ce.names, *ce.unknown], ce.rejection)
        unknown: list[str] = []
    else:
        names_or_array = ce.names if ce.names_array is None else ce.names_array
        passed, failed, unresolvable = outbound.filter_result(ce.evaluation, intent, names_or_array, ce.pieces)
        refused = refuse(args.Pod, passed) if refuse is not None and passed else {}
        if refused:
            failed.update(refused)
            passed = [n for n in passed if n not in refused]
        if decide and len(passed) > 1:
            if refused:
                allowed = set(passed)
                positions = np.array([i for i, n in enumerate(ce.names) if n in allowed], dtype=np.int64)
                passed = [ce.names[int(positions[ce.evaluation.take(positions).best()])]]
            else:
                passed = [ce.names[ce.evaluation.best()]]
        unknown = ce.unknown
    failed.update(dict.fromkeys(unknown, outbound.NODE_UNKNOWN_MESSAGE))
    failed.update(ce.reserved)
    nodes: dict[str, Any] | None = None
    node_names: list[str] | None = passed
    if node_items is not None:
        keep = set(passed)
        nodes = {"metadata": {}, "items": [it for it in node_items if item_name(it) in keep]}
        node_names = None
    body = {"Nodes": nodes, "NodeNames": node_names, "FailedNodes": failed,
            "FailedAndUnresolvableNodes": unresolvable, "Error": ""}
    return Reply(body, reasons=ce.evaluation.reason, unknown=len(ce.unknown))
