"""``bind``: choose the GPUs on the node kube-scheduler picked and record them.

Request ``ExtenderBindingArgs``; reply ``ExtenderBindingResult``, empty ``Error`` when the
allocation is recorded. Standalone mode records it in memory (``GpuCache.bind``); cluster mode
holds it as assumed, then creates the Binding carrying the allocation annotations, one API
write (``extender.cluster.KubeBinder``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
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


LoopBinder = Callable[[str, str, str, str], Awaitable[None] | None]
"""``bind_on_loop(pod_uid, namespace, name, node)``: the bind as an awaitable for the event loop
(``extender.cluster.KubeBinder.bind_on_loop``; raises ``extender.cache.BindError``), or None
where it must run as ``Binder`` in a worker thread."""


def bind(binder: Binder, args: ExtenderBindingArgs) -> Reply:
    """Answer ``bind``: ``Error`` is the ``BindError`` message when the bind is refused, or
    names the internal error (logged with its traceback) that stopped it; never an HTTP 500.
    ``Reply.result`` is the label ``gpufrac_bind_total`` counts it under."""
    try:
        binder(args.PodUID, args.PodNamespace, args.PodName, args.Node)
    except Exception as exc:  # noqa: BLE001 - a bug must still answer kube-scheduler, and be counted
        return _refused(exc, args)
    return _bound()


async def bind_awaiting(pending: Awaitable[None], args: ExtenderBindingArgs) -> Reply:
    """``bind``'s answer for a bind running on the event loop (``LoopBinder``'s awaitable)."""
    try:
        await pending
    except Exception as exc:  # noqa: BLE001 - as ``bind``
        return _refused(exc, args)
    return _bound()


def _bound() -> Reply:
    body: ExtenderBindingResult = {"Error": ""}
    return Reply(body, result="ok")


def _refused(exc: Exception, args: ExtenderBindingArgs) -> Reply:
    if isinstance(exc, BindError):
        refused: ExtenderBindingResult = {"Error": str(exc)}
        return Reply(refused, result=exc.reason)
    log.error("bind of %s/%s to %s failed", args.PodNamespace, args.PodName, args.Node, exc_info=exc)
    failed: ExtenderBindingResult = {"Error": f"gpufrac: internal error binding pod {args.PodNamespace}/"
                                              f"{args.PodName}: {type(exc).__name__}; see gpufrac's log"}
    return Reply(failed, result="error")
