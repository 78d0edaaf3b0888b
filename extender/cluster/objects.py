"""What cluster mode reads from the API before anything is decided: its options, the watch
target that keeps events as plain JSON, and the few metadata fields every watch needs
(revision, a key for logs and the quarantine, a Namespace's labels), read defensively.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from podspec.quantities import quote

HTTP_GONE = 410
HTTP_CONFLICT = 409
MERGE_PATCH = "application/merge-patch+json"
CLAIM_READ_BUDGET_S = 2.0
"""Most time one fenced bind spends reading claimed pods the pod watch has not shown yet
(kube-scheduler's bind timeout is longer); a ledger naming more is read over several tries."""
MAX_ABSENT = 4096
"""Claimed pods remembered as gone (not read again while their claim lives), at most."""
WATERMARK_WAIT_S = 1.0
"""Most time a fenced bind waits for the pod watch to reach a ledger's watermark."""


@dataclass(frozen=True, slots=True)
class SyncOptions:
    """Timing of cluster mode; all seconds.

    Attributes
    ----------
    inventory_stale_after_s : float
        A node whose inventory heartbeat is older is infeasible (reason ``inventory stale``).
    assume_ttl_s : float
        How long a bind's allocation is held before the pod watch confirms it.
    watch_timeout_s : int
        Server-side timeout of one watch request (then it is resumed from the last
        ``resourceVersion``): a healthy watch shows a sign of life at least this often.
    watch_read_margin_s : float
        The client reads a watch with a deadline this much past ``watch_timeout_s``: a
        connection that went silent (a NAT or load balancer dropping the flow, no FIN, no
        RST) is given up and the watch resumed on a new one within ``watch_timeout_s +
        watch_read_margin_s``; a watch with no sign of life for that long is *silent*
        (``/readyz`` names it).
    housekeeping_s : float
        Period of the staleness and expiry checks.
    backoff_max_s : float
        Longest wait between retries after an API error (starting at 0.5 s, doubling).
    scheduler_name : str
        The kube-scheduler profile that calls this extender (whose pods are requeued).
    requeue_max_pods : int
        At most this many pending GPU pods are requeued per release (0: never).
    requeue_delay_s : float
        Releases within this window are coalesced into one requeue.
    resource_claims : bool
        Also watch ResourceClaims (``resource.k8s.io/v1``) and count the shares they hold of
        gpufrac's DRA driver (``extender.cluster.resource_claims``).
    """

    inventory_stale_after_s: float = 180.0
    assume_ttl_s: float = 60.0
    watch_timeout_s: int = 30
    watch_read_margin_s: float = 15.0
    housekeeping_s: float = 2.0
    backoff_max_s: float = 30.0
    scheduler_name: str = "gpufrac-scheduler"
    requeue_max_pods: int = 100
    requeue_delay_s: float = 0.5
    resource_claims: bool = False


def raw_watch_target(func: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a ``list_*`` API method so that ``kubernetes.watch.Watch.stream`` yields plain dicts.

    The watch infers the model to deserialize into from the method's docstring; a wrapper
    without one makes it skip that (each event stays API JSON for ``translate``), while
    ``ERROR`` events still become ``ApiException`` (its ``deserialize=False`` mode fails on
    them with a KeyError instead).
    """
    def call(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    return call


class Gone(Exception):
    """The watch's resourceVersion is too old: list again."""


def revision(obj: Any) -> int | None:
    """An object's (or list's) ``metadata.resourceVersion`` as an integer (an etcd revision),
    or None when it is not one."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    rv = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    if isinstance(rv, str) and rv.isascii() and rv.isdigit() and len(rv) <= 20:
        return int(rv)
    return None


def object_key(obj: Any, namespaced: bool = True) -> str:
    """``namespace/name`` (or the name) of an API object for logs, whatever its shape."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    name = quote(meta.get("name", "?"), 253)[1:-1]
    if not namespaced:
        return name
    return f"{quote(meta.get('namespace', '?'), 63)[1:-1]}/{name}"


def namespace_labels(obj: Any) -> tuple[str, dict[str, str]] | None:
    """A Namespace's name and string labels; None when it has no name."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        return None
    labels = meta.get("labels")
    labels = labels if isinstance(labels, Mapping) else {}
    return meta["name"], {str(k): str(v) for k, v in labels.items()}
