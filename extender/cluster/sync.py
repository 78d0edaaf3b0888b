"""``ClusterSync``: the cache kept equal to the API's Nodes, Pods, Namespaces, claim ledgers and
ResourceClaims.

List-then-watch on each (from the list's ``resourceVersion``, with bookmarks; a new list on
``410 Gone``; bounded exponential backoff on any other error), plus a housekeeping loop that
marks nodes whose inventory heartbeat went stale and frees assumed allocations that were
never confirmed, and a requeue loop that retries pending GPU pods once share is freed. Nodes
are read by ``extender.cluster.node_reader.NodeReader``; one object that cannot be read is
quarantined, never a stopped watch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from functools import partial
from typing import Any

import urllib3
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from extender.cache import DefragPlan, EventType, GpuCache
from extender.cluster.binder import KubeBinder
from extender.cluster.defragmenter import Defragmenter
from extender.cluster.node_reader import NodeReader
from extender.cluster.objects import (
    HTTP_GONE,
    MERGE_PATCH,
    Gone,
    SyncOptions,
    namespace_labels,
    object_key,
    raw_watch_target,
    revision,
)
from extender.cluster.protobuf_watch import KubeProtos, PodWatch
from extender.cluster.resource_claims import RefusedPod, ResourceClaimBook
from extender.fence import CLAIMS_LABEL
from extender.quarantine import Quarantine
from podspec import annotations as ann
from podspec.kubeio import drain, response_json
from podspec.pods import PodIntent, pod_intent

log = logging.getLogger(__name__)

WATCH_CONNECT_TIMEOUT_S = 10.0
"""Connect timeout of a watch request, seconds."""


class ClusterSync:
    """Keep a ``GpuCache`` equal to the API's Nodes and Pods.

    Parameters
    ----------
    api : kubernetes.client.CoreV1Api
    cache : GpuCache
    options : SyncOptions
    now : callable returning a timezone-aware datetime, optional
        Wall clock: only for the agents' clock skew (injected by tests).
    monotonic : callable returning seconds, optional
        This process's clock for inventory ages (``NodeReader``; injected by tests).
    quarantine : Quarantine, optional
        Where objects that cannot be read are recorded (and skipped): one bad Pod, Node or
        Namespace never stops a list, a watch or readiness.
    on_plan, count_eviction : callable, optional
        The defragmentation plan's metric hooks (``Defragmenter``).
    """

    def __init__(self, api: client.CoreV1Api, cache: GpuCache, options: SyncOptions,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC),
                 quarantine: Quarantine | None = None, binder: KubeBinder | None = None,
                 on_plan: Callable[[DefragPlan], None] = lambda made: None,
                 count_eviction: Callable[[str], None] = lambda result: None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._api = api
        self._cache = cache
        self._binder = binder if binder is not None and binder.fence is not None else None
        self.quarantine = quarantine if quarantine is not None else Quarantine()
        self._opts = options
        self._stop = threading.Event()
        self._nodes = NodeReader(self.quarantine, now, options.inventory_stale_after_s, monotonic)
        self.defrag = Defragmenter(api, cache, self._nodes.labels, on_plan, count_eviction)
        """The defragmentation plan (``extender.cluster.defragmenter``), made in its own loop."""
        self.nodes_synced = threading.Event()
        self.pods_synced = threading.Event()
        self.namespaces_synced = threading.Event()
        self.claims_synced = threading.Event()
        if self._binder is None:
            self.claims_synced.set()
        self.resource_claims = ResourceClaimBook(cache, self.quarantine, self._nodes.gpus)
        """The shares ResourceClaims hold of gpufrac's DRA driver (``SyncOptions.resource_claims``)."""
        self.resource_claims_synced = threading.Event()
        if not options.resource_claims:
            self.resource_claims_synced.set()
        self._threads: list[threading.Thread] = []
        self._watches: list[watch.Watch | PodWatch] = []
        self._protos = KubeProtos()  # the pod watch reads protobuf (extender.cluster.protobuf_watch)
        self._alive_at: dict[str, float] = {}  # watch -> monotonic time of its last sign of life
        self._monotonic = monotonic
        self._released = threading.Event()
        self._pods_rv: int | None = None
        self._bound_rv: dict[str, int] = {}
        if self._binder is not None:
            self._binder.pods_rv, self._binder.bound_rv = self.pods_rv, self.bound_rv

    @property
    def synced(self) -> bool:
        """True once Nodes, then Pods, and Namespaces (and, fenced, the claim ledgers) have
        each been listed in full."""
        return (self.nodes_synced.is_set() and self.pods_synced.is_set() and self.namespaces_synced.is_set()
                and self.claims_synced.is_set() and self.resource_claims_synced.is_set())

    def silent_watches(self) -> dict[str, float]:
        """Watches with no sign of life (an event, a bookmark, the server closing the request
        at its timeout, a list) for longer than ``watch_timeout_s + watch_read_margin_s``,
        with the seconds since their last one (a watch not yet started is not silent)."""
        bound = self._opts.watch_timeout_s + self._opts.watch_read_margin_s
        now = self._monotonic()
        return {w: now - t for w, t in list(self._alive_at.items()) if now - t > bound}

    def watch_silences(self) -> dict[str, float]:
        """Seconds since each watch's last sign of life (``silent_watches``), for metrics."""
        now = self._monotonic()
        return {w: now - t for w, t in list(self._alive_at.items())}

    def _alive(self, what: str) -> None:
        self._alive_at[what] = self._monotonic()

    def start(self) -> None:
        """Start the node watch, the pod watch (after the first node list), the namespace
        watch and housekeeping."""
        for target, name in ((self._run_nodes, "gpufrac-nodes"), (self._run_pods, "gpufrac-pods"),
                             (self._run_namespaces, "gpufrac-namespaces"),
                             (self._run_housekeeping, "gpufrac-housekeeping"),
                             (self._run_requeue, "gpufrac-requeue"),
                             (lambda: self.defrag.loop(self._stop, lambda: self.synced), "gpufrac-defrag"),
                             *(((lambda: self._after_pods(self._list_and_watch_claims, "claim ledger"),
                                 "gpufrac-claims"),) if self._binder is not None else ()),
                             *(((lambda: self._after_pods(self._list_and_watch_resource_claims, "resourceclaim"),
                                 "gpufrac-resourceclaims"),) if self._opts.resource_claims else ())):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask every loop to stop and wait for them (watches are closed)."""
        self._stop.set()
        self._released.set()
        for w in list(self._watches):
            w.stop()
        for t in self._threads:
            t.join(timeout_s)

    # -- loops ---------------------------------------------------------------------------

    def _loop(self, list_and_watch: Callable[[], None], what: str) -> None:
        delay = 0.5
        while not self._stop.is_set():
            listed = self._alive_at.get(what)
            try:
                list_and_watch()
                delay = 0.5
            except Gone:
                log.info("%s watch expired (410 Gone); listing again", what)
            except Exception as exc:  # noqa: BLE001 - any API or network failure: retry
                if self._alive_at.get(what) != listed:
                    delay = 0.5  # it listed (and watched) before failing: start the back-off anew
                log.warning("%s sync failed (%s); retrying in %.1fs", what, exc, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, self._opts.backoff_max_s)

    def _run_nodes(self) -> None:
        self._loop(self._list_and_watch_nodes, "node")

    def _run_pods(self) -> None:
        # Pods are accounted on known nodes only: list them after the nodes.
        while not self.nodes_synced.wait(0.2):
            if self._stop.is_set():
                return
        self._loop(self._list_and_watch_pods, "pod")

    def _run_namespaces(self) -> None:
        self._loop(self._list_and_watch_namespaces, "namespace")

    def _list_and_watch_namespaces(self) -> None:
        data = response_json(self._api.list_namespace(_preload_content=False))
        labels = dict(filter(None, (namespace_labels(item) for item in data.get("items", []))))
        self._cache.set_namespaces(labels)
        self.namespaces_synced.set()
        for kind, obj in self._stream(self._api.list_namespace, data["metadata"]["resourceVersion"], "namespace"):
            got = namespace_labels(obj)
            if got is not None:
                self._cache.upsert_namespace(got[0], None if kind == "DELETED" else got[1])

    def _after_pods(self, list_and_watch: Callable[[], None], what: str) -> None:
        # Claims are folded into pods' records, on known nodes: list them after the pods.
        while not self.pods_synced.wait(0.2):
            if self._stop.is_set():
                return
        self._loop(list_and_watch, what)

    def _list_and_watch_claims(self) -> None:
        """Fold other instances' claims as they are written (``extender.fence``), so that
        filter and prioritize already count them; a bind re-checks against the ledger."""
        binder = self._binder
        assert binder is not None and binder.fence is not None
        fence = binder.fence
        listing = partial(self._api.list_namespaced_config_map, fence.namespace, label_selector=f"{CLAIMS_LABEL}=true")
        data = response_json(listing(_preload_content=False))
        for obj in data.get("items", []):
            self._apply_ledger("ADDED", obj)
        self.quarantine.retain("claims", {object_key(obj) for obj in data.get("items", [])})
        self.claims_synced.set()
        for kind, obj in self._stream(listing, data["metadata"]["resourceVersion"], "claim ledger"):
            self._apply_ledger(kind, obj)

    def _apply_ledger(self, kind: str, obj: Mapping[str, Any]) -> None:
        """One ledger event: folded into the cache; what was skipped of it quarantined
        (kind ``claims``, ``namespace/name``). Never raises: one ledger never stops the watch."""
        binder = self._binder
        assert binder is not None and binder.fence is not None
        key = object_key(obj)
        try:
            ledger = binder.fence.observe(kind, obj)
            if ledger is not None:
                binder.fold(ledger)
        except Exception as exc:  # noqa: BLE001 - one ledger must never stop the watch
            log.exception("claim ledger %s: fold failed", key)
            self.quarantine.reject("claims", key, f"internal: {type(exc).__name__}: {exc}")
            return
        if kind == "DELETED" or ledger is None or not ledger.problem:
            self.quarantine.clear("claims", key)
        else:
            self.quarantine.reject("claims", key, ledger.problem)

    def _list_and_watch_resource_claims(self) -> None:
        api = client.ResourceV1Api(self._api.api_client)
        data = response_json(api.list_resource_claim_for_all_namespaces(_preload_content=False))
        if self.resource_claims.relist(data.get("items", [])):
            self._released.set()
        self.resource_claims_synced.set()
        for kind, obj in self._stream(api.list_resource_claim_for_all_namespaces,
                                      data["metadata"]["resourceVersion"], "resourceclaim"):
            if self.resource_claims.apply(kind, obj):
                self._released.set()

    def _run_housekeeping(self) -> None:
        while not self._stop.wait(self._opts.housekeeping_s):
            try:
                self.housekeeping()
            except Exception:  # noqa: BLE001 - never let the loop die
                log.exception("housekeeping failed")

    def inventory_ages(self) -> dict[str, float | None]:
        """Seconds since this process saw each node's heartbeat change (None: no valid
        inventory), for metrics."""
        return self._nodes.ages()

    def clock_skews(self) -> dict[str, float]:
        """Each node's agent clock minus this one, seconds (``NodeReader.skews``), for metrics."""
        return self._nodes.skews()

    def housekeeping(self) -> None:
        """Re-judge inventory staleness, expire assumed allocations, and reserve nodes for
        pods that waited too long (``extender.cache.reservations``) (one pass)."""
        self._cache.upsert_nodes(self._nodes.specs())
        self.resource_claims.retry()
        expired = self._cache.expire_assumed()
        for key in expired:
            log.warning("assumed allocation expired: pod %s never showed up bound", key)
        made, ended = self._cache.reserve_for_waiting(node_labels=self._nodes.labels())
        for r in made:
            log.info("node %s reserved for pod %s, waiting longest for room", r.node, r.pod)
        if expired or ended:
            self._released.set()  # share freed or a node opened: pending pods are retried (_run_requeue)

    def _run_requeue(self) -> None:
        """Requeue pending GPU pods (and pods refused for their claims) after GPU share is freed.
        kube-scheduler retries a pod an extender rejected on the next cluster event of any
        kind (``schedule_one.go``: the pod gets the ``Extender`` unschedulable plugin, whose
        enqueue extension matches every event). The event that frees share, a pod deletion,
        usually reaches kube-scheduler before gpufrac's own watch has applied it, so that
        retry is refused again and the pod then waits for some unrelated event or
        kube-scheduler's periodic flush of unschedulable pods (up to 5 minutes). Updating
        an annotation on the waiting pods, after gpufrac has freed the share, is such an
        event: they are retried against the up-to-date cache.
        """
        opts = self._opts
        while not self._stop.is_set():
            self._released.wait()
            if self._stop.is_set() or opts.requeue_max_pods <= 0:
                return
            self._stop.wait(opts.requeue_delay_s)  # coalesce a burst of releases
            self._released.clear()
            stamp = datetime.now(UTC).isoformat(timespec="milliseconds")
            pending: list[RefusedPod | PodIntent] = [*self.resource_claims.refused_pods()[:opts.requeue_max_pods]]
            pending += [i for i in self._cache.pending_gpu_pods(opts.requeue_max_pods * 4)
                        if i.scheduler_name == opts.scheduler_name][:opts.requeue_max_pods - len(pending)]
            for intent in pending:
                body = {"metadata": {"uid": intent.uid, "annotations": {ann.REQUEUE: stamp}}}
                try:
                    drain(self._api.patch_namespaced_pod(intent.name, intent.namespace, body,
                                                          _content_type=MERGE_PATCH, _preload_content=False))
                except ApiException as exc:
                    log.info("requeue of %s skipped: %s %s", intent.key, exc.status, exc.reason)

    def _stream(self, func: Callable[..., Any], rv: str, what: str,
                new_watch: Callable[[], watch.Watch | PodWatch] = watch.Watch) -> Iterator[tuple[str, dict[str, Any]]]:
        """Watch from ``rv``, request after request; yields (type, object), raises ``Gone``.

        Each request ends at the server's ``watch_timeout_s``; the client reads it with a
        deadline ``watch_read_margin_s`` later, so a connection that went silent is given up
        and the watch resumed from the last ``resourceVersion`` on a new connection (not a
        relist). Every event, bookmark and clean end is a sign of life (``silent_watches``).
        """
        w = new_watch()  # JSON, or the pods' protobuf PodWatch
        self._watches.append(w)
        opts = self._opts
        self._alive(what)  # just listed
        try:
            while not self._stop.is_set():
                stream = w.stream(raw_watch_target(func), resource_version=rv, allow_watch_bookmarks=True,
                                  timeout_seconds=opts.watch_timeout_s,
                                  _request_timeout=(WATCH_CONNECT_TIMEOUT_S, opts.watch_timeout_s + opts.watch_read_margin_s))
                try:
                    for event in stream:
                        self._alive(what)
                        kind, obj = event["type"], event["object"]
                        rv = obj.get("metadata", {}).get("resourceVersion", rv)
                        if kind != "BOOKMARK":
                            yield kind, obj
                    self._alive(what)  # the server ended the request at its timeout
                except ApiException as exc:
                    if exc.status == HTTP_GONE:
                        raise Gone() from None
                    raise
                except (TimeoutError, urllib3.exceptions.ReadTimeoutError, urllib3.exceptions.ProtocolError) as exc:
                    log.warning("%s watch: nothing read for %.0f s (%s); resuming from resourceVersion %s on a "
                                "new connection", what, opts.watch_timeout_s + opts.watch_read_margin_s,
                                type(exc).__name__, rv)
        finally:
            self._watches.remove(w)

    # -- nodes ---------------------------------------------------------------------------

    def _list_and_watch_nodes(self) -> None:
        data = response_json(self._api.list_node(_preload_content=False))
        self._cache.set_nodes(self._nodes.relist(data.get("items", [])))
        self.nodes_synced.set()
        for kind, obj in self._stream(self._api.list_node, data["metadata"]["resourceVersion"], "node"):
            self._apply_node(kind, obj)

    def _apply_node(self, kind: str, obj: Mapping[str, Any]) -> None:
        """One node watch event; the nodes sharing a GPU UUID with it are updated with it."""
        removed, specs, touched = self._nodes.apply(kind, obj)
        if removed is not None:
            self._cache.remove_node(removed)
        try:
            # One batch: a UUID moving from one node to another never shows on both.
            self._cache.upsert_nodes(specs)
        except Exception as exc:  # noqa: BLE001 - one node must never stop the watch
            log.exception("node update failed: %s", sorted(touched))
            for n in touched:
                self.quarantine.reject("node", n, f"internal: {type(exc).__name__}: {exc}")

    # -- pods ----------------------------------------------------------------------------

    def _read_pod(self, obj: Mapping[str, Any]) -> PodIntent | None:
        """The pod as gpufrac reads it; None (quarantined, skipped) when it cannot be read.

        A pending pod that cannot be read also fails filter, which tells its owner why in
        the pod's events; one bound elsewhere is not counted (its CPU and memory included).
        """
        try:
            intent = pod_intent(obj)
        except ValueError as exc:
            self.quarantine.reject("pod", object_key(obj), str(exc))
            return None
        self.quarantine.clear("pod", intent.key)
        return intent

    def _reject_failed(self, intent: PodIntent, exc: Exception) -> None:
        """Quarantine a pod whose cache update raised (a bug, never the pod's fault alone)."""
        self.quarantine.reject("pod", intent.key, f"internal: {type(exc).__name__}: {exc}")

    def _apply_pod(self, kind: str, obj: Mapping[str, Any]) -> None:
        try:
            self._apply_pod_event(kind, obj)
        finally:
            # Applied (or skipped): the watch has passed this revision (extender.fence).
            if (rv := revision(obj)) is not None:
                self._pods_rv = rv

    def _apply_pod_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind == "DELETED":
            meta = obj.get("metadata") if isinstance(obj, Mapping) else None
            uid = meta.get("uid") if isinstance(meta, Mapping) else None
            self.quarantine.clear("pod", object_key(obj))
            if isinstance(uid, str):
                self._bound_rv.pop(uid, None)
                if self._cache.remove_pod(uid):
                    self._released.set()
            return
        intent = self._read_pod(obj)
        if intent is None:
            return
        try:
            # Watch and list events are ADDED or MODIFIED here (DELETED returned above); the
            # cache treats the two alike.
            event: EventType = "MODIFIED" if kind == "MODIFIED" else "ADDED"
            released = self._cache.apply_pod_event(event, intent)
        except Exception as exc:  # noqa: BLE001 - one pod must never stop the watch
            log.exception("pod %s: cache update failed", intent.key)
            self._reject_failed(intent, exc)
            return
        if intent.node_name and (rv := revision(obj)) is not None:
            self._bound_rv.setdefault(intent.uid, rv)
        if released:
            self._released.set()

    def pods_rv(self) -> int | None:
        """The revision of the last pod event (or pod list) applied; None before the first
        list or when revisions are not integers."""
        return self._pods_rv

    def bound_rv(self, uid: str) -> int | None:
        """The revision of the pod event that first showed pod ``uid`` bound; None when
        none has (or the pod is deleted)."""
        return self._bound_rv.get(uid)

    def _list_and_watch_pods(self) -> None:
        data = response_json(self._api.list_pod_for_all_namespaces(_preload_content=False))
        items = data.get("items", [])
        intents = [i for i in map(self._read_pod, items) if i is not None]
        # Pods deleted while the watch was down are no longer quarantined.
        self.quarantine.retain("pod", {object_key(obj) for obj in items})
        self._cache.set_pods(intents, on_error=self._reject_failed)
        bound = {i.uid for i in intents if i.node_name}
        self._bound_rv = {obj["metadata"]["uid"]: rv for obj in items
                          if (rv := revision(obj)) is not None and obj["metadata"].get("uid") in bound}
        self._pods_rv = revision(data)
        self.pods_synced.set()
        for kind, obj in self._stream(self._api.list_pod_for_all_namespaces, data["metadata"]["resourceVersion"],
                                      "pod", lambda: PodWatch(self._protos)):
            self._apply_pod(kind, obj)

