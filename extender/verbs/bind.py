"""``bind``: choose the GPUs on the node kube-scheduler picked and record them.

Request ``ExtenderBindingArgs``; reply ``ExtenderBindingResult``, empty ``Error`` when the
allocation is recorded. Standalone mode records it in memory (``GpuCache.bind``); cluster mode
holds it as assumed, then creates the Binding carrying the allocation annotations, one API
write (``extender.cluster.KubeBinder``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypedDict

from pydantic import Field

from extender.cache import BindError
from extender.verbs import Reply, WireModel

log = logging.getLogger(__name__)

Binder = Callable[[str, str, str, str], object]
"""``bind(pod_uid, namespace, name, node)``; raises ``extender.cache.BindError``."""


class ExtenderBindingArgs(WireModel):
    """Body of ``bind``."""

    PodName: str = Field(min_length=1)
    PodNamespace: str = Field(min_length=1)
    PodUID: str = Field(min_length=1)
    Node: str = Field(min_length=1)


class ExtenderBindingResult(TypedDict):
    """Reply to ``bind``."""

    Error: str


def bind(binder: Binder, args: ExtenderBindingArgs) -> Reply:
    """Answer ``bind``: ``Error`` is the ``BindError`` message when the bind is refused, or
    names the internal error (logged with its traceback) that stopped it; never an HTTP 500.
    ``Reply.result`` is the label ``gpufrac_bind_total`` counts it under."""
    try:
        binder(args.PodUID, args.PodNamespace, args.PodName, args.Node)
    except BindError as exc:
        refused: ExtenderBindingResult = {"Error": str(exc)}
        return Reply(refused, result=exc.reason)
    except Exception as exc:  # noqa: BLE001 - a bug must still answer kube-scheduler, and be counted
        log.exception("bind of %s/%s to %s failed", args.PodNamespace, args.PodName, args.Node)
        failed: ExtenderBindingResult = {"Error": f"gpufrac: internal error binding pod {args.PodNamespace}/"
                                                  f"{args.PodName}: {type(exc).__name__}; see gpufrac's log"}
        return Reply(failed, result="error")
    body: ExtenderBindingResult = {"Error": ""}
    return Reply(body, result="ok")
