"""Cluster mode: the Kubernetes API side of the extender.

``ClusterSync`` feeds the cache from the API: list-then-watch on Nodes, on Pods and on
Namespaces (their labels, for the admin config's ``tenant_label``) (from the
list's ``resourceVersion``, with bookmarks; a new list on ``410 Gone``; bounded exponential
backoff on any other error), plus a housekeeping loop that marks nodes whose inventory
heartbeat went stale and frees assumed allocations that were never confirmed.

``KubeBinder`` is the cluster-mode bind: hold the allocation as assumed in the cache (the fit
re-checked under the cache lock), then create the Binding carrying the allocation record as
annotations, which the API server writes onto the pod together with ``spec.nodeName``. If
the call fails the assumed allocation is given back and the error goes to kube-scheduler.
With a ``ClaimFence`` (``--fence-namespace``, for more than one replica) the allocation is
first claimed on the node's ledger by compare-and-swap (``extender.fence``), and a claims
watch counts other replicas' claims as they are written.

Every object is handled as plain API JSON (``_preload_content=False``; watch events not
deserialized, see ``raw_watch_target``): ``podspec`` parses it, as it parses the
Pod inside an extender request.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import urllib3
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from extender.cache import BindError, ClaimedAllocation, EventType, GpuCache, PodRecord
from extender.fence import CLAIMS_LABEL, Claim, ClaimFence, FenceConflict, Ledger
from extender.gpu_owners import GpuOwners, rank
from extender.quarantine import Quarantine
from podspec import annotations as ann
from podspec.kubeio import core_path, drain, response_json, write_json
from podspec.nodes import MAX_CLOCK_SKEW_S, NodeObservation, node_observation
from podspec.pods import PodIntent, allocation_annotations, pod_intent, quote

log = logging.getLogger(__name__)

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
        ``resourceVersion``).
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
    """

    inventory_stale_after_s: float = 180.0
    assume_ttl_s: float = 60.0
    watch_timeout_s: int = 300
    housekeeping_s: float = 2.0
    backoff_max_s: float = 30.0
    scheduler_name: str = "gpufrac-scheduler"
    requeue_max_pods: int = 100
    requeue_delay_s: float = 0.5


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


class _Gone(Exception):
    """The watch's resourceVersion is too old: list again."""


class ClusterSync:
    """Keep a ``GpuCache`` equal to the API's Nodes and Pods.

    Parameters
    ----------
    api : kubernetes.client.CoreV1Api
    cache : GpuCache
    options : SyncOptions
    now : callable returning a timezone-aware datetime, optional
        Wall clock for heartbeat ages (injected by tests).
    quarantine : Quarantine, optional
        Where objects that cannot be read are recorded (and skipped): one bad Pod, Node or
        Namespace never stops a list, a watch or readiness.
    """

    def __init__(self, api: client.CoreV1Api, cache: GpuCache, options: SyncOptions,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC),
                 quarantine: Quarantine | None = None, binder: KubeBinder | None = None) -> None:
        self._api = api
        self._cache = cache
        self._binder = binder if binder is not None and binder.fence is not None else None
        self.quarantine = quarantine if quarantine is not None else Quarantine()
        self._opts = options
        self._now = now
        self._stop = threading.Event()
        self._observations: dict[str, NodeObservation] = {}
        self._owners = GpuOwners()
        self._flagged_gpus: dict[str, set[str]] = {}
        self._obs_lock = threading.Lock()
        self.nodes_synced = threading.Event()
        self.pods_synced = threading.Event()
        self.namespaces_synced = threading.Event()
        self.claims_synced = threading.Event()
        if self._binder is None:
            self.claims_synced.set()
        self._threads: list[threading.Thread] = []
        self._watches: list[watch.Watch] = []
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
                and self.claims_synced.is_set())

    def start(self) -> None:
        """Start the node watch, the pod watch (after the first node list), the namespace
        watch and housekeeping."""
        for target, name in ((self._run_nodes, "gpufrac-nodes"), (self._run_pods, "gpufrac-pods"),
                             (self._run_namespaces, "gpufrac-namespaces"),
                             (self._run_housekeeping, "gpufrac-housekeeping"),
                             (self._run_requeue, "gpufrac-requeue"),
                             *(((self._run_claims, "gpufrac-claims"),) if self._binder is not None else ())):
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
            try:
                list_and_watch()
                delay = 0.5
            except _Gone:
                log.info("%s watch expired (410 Gone); listing again", what)
            except Exception as exc:  # noqa: BLE001 - any API or network failure: retry
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
        labels = dict(filter(None, (_namespace_labels(item) for item in data.get("items", []))))
        self._cache.set_namespaces(labels)
        self.namespaces_synced.set()
        for kind, obj in self._stream(self._api.list_namespace, data["metadata"]["resourceVersion"]):
            got = _namespace_labels(obj)
            if got is not None:
                self._cache.upsert_namespace(got[0], None if kind == "DELETED" else got[1])

    def _run_claims(self) -> None:
        # Claims are folded into pods' records: list them after the pods.
        while not self.pods_synced.wait(0.2):
            if self._stop.is_set():
                return
        self._loop(self._list_and_watch_claims, "claim ledger")

    def _list_and_watch_claims(self) -> None:
        """Fold other instances' claims as they are written (``extender.fence``), so that
        filter and prioritize already count them; a bind re-checks against the ledger."""
        binder = self._binder
        assert binder is not None and binder.fence is not None
        fence = binder.fence

        def listing(**kw: Any) -> Any:
            return self._api.list_namespaced_config_map(fence.namespace, label_selector=f"{CLAIMS_LABEL}=true",
                                                        **kw)

        data = response_json(listing(_preload_content=False))
        for obj in data.get("items", []):
            self._apply_ledger("ADDED", obj)
        self.quarantine.retain("claims", {_object_key(obj) for obj in data.get("items", [])})
        self.claims_synced.set()
        for kind, obj in self._stream(listing, data["metadata"]["resourceVersion"]):
            self._apply_ledger(kind, obj)

    def _apply_ledger(self, kind: str, obj: Mapping[str, Any]) -> None:
        """One ledger event: folded into the cache; what was skipped of it quarantined
        (kind ``claims``, ``namespace/name``). Never raises: one ledger never stops the watch."""
        binder = self._binder
        assert binder is not None and binder.fence is not None
        key = _object_key(obj)
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

    def _run_housekeeping(self) -> None:
        while not self._stop.wait(self._opts.housekeeping_s):
            try:
                self.housekeeping()
            except Exception:  # noqa: BLE001 - never let the loop die
                log.exception("housekeeping failed")

    def inventory_ages(self) -> dict[str, float | None]:
        """Seconds since each node's inventory heartbeat (None: no valid inventory), for metrics."""
        now = self._now()
        with self._obs_lock:
            return {name: obs.age_s(now) for name, obs in self._observations.items()}

    def housekeeping(self) -> None:
        """Re-judge inventory staleness and expire assumed allocations (one pass)."""
        now = self._now()
        with self._obs_lock:
            specs = [self._usable(obs).spec(now, self._opts.inventory_stale_after_s)
                     for obs in self._observations.values()]
        self._cache.upsert_nodes(specs)
        expired = self._cache.expire_assumed()
        for key in expired:
            log.warning("assumed allocation expired: pod %s never showed up bound", key)
        if expired:
            self._released.set()  # share freed: pending pods are retried (_run_requeue)

    def _run_requeue(self) -> None:
        """Requeue pending GPU pods in kube-scheduler after GPU share is freed.

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
            pending = [i for i in self._cache.pending_gpu_pods(opts.requeue_max_pods * 4)
                       if i.scheduler_name == opts.scheduler_name][:opts.requeue_max_pods]
            for intent in pending:
                body = {"metadata": {"uid": intent.uid, "annotations": {ann.REQUEUE: stamp}}}
                try:
                    drain(self._api.patch_namespaced_pod(intent.name, intent.namespace, body,
                                                          _content_type=MERGE_PATCH, _preload_content=False))
                except ApiException as exc:
                    log.info("requeue of %s skipped: %s %s", intent.key, exc.status, exc.reason)

    def _stream(self, func: Callable[..., Any], rv: str) -> Iterator[tuple[str, dict[str, Any]]]:
        """Watch from ``rv`` until the server's timeout; yields (type, object), raises _Gone."""
        w = watch.Watch()
        self._watches.append(w)
        try:
            while not self._stop.is_set():
                stream = w.stream(raw_watch_target(func), resource_version=rv, allow_watch_bookmarks=True,
                                  timeout_seconds=self._opts.watch_timeout_s)
                try:
                    for event in stream:
                        kind, obj = event["type"], event["object"]
                        rv = obj.get("metadata", {}).get("resourceVersion", rv)
                        if kind != "BOOKMARK":
                            yield kind, obj
                except ApiException as exc:
                    if exc.status == HTTP_GONE:
                        raise _Gone() from None
                    raise
        finally:
            self._watches.remove(w)

    # -- nodes ---------------------------------------------------------------------------

    def _observe(self, obj: Mapping[str, Any]) -> NodeObservation | None:
        """The node as gpufrac reads it; None (quarantined) when it has no usable name.

        An unusable inventory, or a heartbeat more than ``MAX_CLOCK_SKEW_S`` ahead of this
        clock, quarantines the node (kind ``node``); it keeps its CPU and memory and takes
        no GPU pod.
        """
        try:
            obs = node_observation(obj)
        except ValueError as exc:
            self.quarantine.reject("node", _object_key(obj, namespaced=False), str(exc))
            return None
        if obs.heartbeat is not None and not obs.problem and obs.age_s(self._now()) is None:
            obs = replace(obs, problem=f"{ann.INVENTORY}.heartbeat: {obs.heartbeat.isoformat()} is more than "
                                       f"{MAX_CLOCK_SKEW_S:.0f} s ahead of this clock")
        if obs.problem and not obs.problem.startswith("no "):
            self.quarantine.reject("node", obs.name, obs.problem)
        else:
            self.quarantine.clear("node", obs.name)
            if obs.problem:
                log.info("node %s: no usable GPUs: %s", obs.name, obs.problem)
        return obs

    def _usable(self, obs: NodeObservation) -> NodeObservation:
        """``obs`` without the GPUs another node keeps (``extender.gpu_owners``); under
        ``_obs_lock``."""
        lost = self._owners.lost(obs.name)
        return replace(obs, gpus=tuple(g for g in obs.gpus if g.uuid not in lost)) if lost else obs

    def _judge_gpus(self, name: str) -> None:
        """Quarantine ``name``'s GPUs with impossible readings or a UUID another node keeps
        (kind ``gpu``, key ``node/UUID``), and clear its entries that no longer hold; under
        ``_obs_lock``."""
        obs = self._observations.get(name)
        entries: dict[str, str] = {}
        if obs is not None:
            field = f"{ann.INVENTORY}.gpus"
            for uuid, why in obs.flagged:
                entries[f"{name}/{uuid}"] = f"{field}[{quote(uuid)}].{why}; the GPU takes no pods"
            for uuid, keeper in self._owners.lost(name).items():
                entries[f"{name}/{uuid}"] = (
                    f"{field}[{quote(uuid)}].uuid: also listed by node {quote(keeper)}, which keeps it "
                    f"(the older Node); not usable on this node until one of the two stops listing it")
        for key in self._flagged_gpus.pop(name, set()) - entries.keys():
            self.quarantine.clear("gpu", key)
        for key, message in entries.items():
            self.quarantine.reject("gpu", key, message)
        if entries:
            self._flagged_gpus[name] = set(entries)

    def _list_and_watch_nodes(self) -> None:
        data = response_json(self._api.list_node(_preload_content=False))
        now = self._now()
        observations = {o.name: o for o in map(self._observe, data.get("items", [])) if o is not None}
        listed = {_object_key(obj, namespaced=False) for obj in data.get("items", [])}
        with self._obs_lock:
            gone = set(self._observations) - set(observations)
            self._observations = observations
            self._owners.clear()
            for o in observations.values():
                self._owners.put(o.name, rank(o.name, o.created), (g.uuid for g in o.gpus))
            for name in set(observations) | set(self._flagged_gpus):
                self._judge_gpus(name)
            specs = [self._usable(o).spec(now, self._opts.inventory_stale_after_s) for o in observations.values()]
        # Nodes deleted while the watch was down are no longer quarantined.
        self.quarantine.retain("node", listed)
        if gone:
            log.info("relist: %d nodes gone", len(gone))
        self._cache.set_nodes(specs)
        self.nodes_synced.set()
        for kind, obj in self._stream(self._api.list_node, data["metadata"]["resourceVersion"]):
            self._apply_node(kind, obj)

    def _apply_node(self, kind: str, obj: Mapping[str, Any]) -> None:
        """One node watch event; the nodes sharing a GPU UUID with it are updated with it."""
        if kind == "DELETED":
            name = _object_key(obj, namespaced=False)
            self.quarantine.clear("node", name)
            with self._obs_lock:
                self._observations.pop(name, None)
                touched = self._owners.remove(name)
                self._judge_gpus(name)
            self._cache.remove_node(name)
        else:
            obs = self._observe(obj)
            if obs is None:
                return
            with self._obs_lock:
                self._observations[obs.name] = obs
                touched = self._owners.put(obs.name, rank(obs.name, obs.created), (g.uuid for g in obs.gpus))
        now = self._now()
        with self._obs_lock:
            for name in touched:
                self._judge_gpus(name)
            specs = [self._usable(self._observations[n]).spec(now, self._opts.inventory_stale_after_s)
                     for n in sorted(touched) if n in self._observations]
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
            self.quarantine.reject("pod", _object_key(obj), str(exc))
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
            if (rv := _revision(obj)) is not None:
                self._pods_rv = rv

    def _apply_pod_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind == "DELETED":
            meta = obj.get("metadata") if isinstance(obj, Mapping) else None
            uid = meta.get("uid") if isinstance(meta, Mapping) else None
            self.quarantine.clear("pod", _object_key(obj))
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
        if intent.node_name and (rv := _revision(obj)) is not None:
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
        self.quarantine.retain("pod", {_object_key(obj) for obj in items})
        self._cache.set_pods(intents, on_error=self._reject_failed)
        bound = {i.uid for i in intents if i.node_name}
        self._bound_rv = {obj["metadata"]["uid"]: rv for obj in items
                          if (rv := _revision(obj)) is not None and obj["metadata"].get("uid") in bound}
        self._pods_rv = _revision(data)
        self.pods_synced.set()
        for kind, obj in self._stream(self._api.list_pod_for_all_namespaces,
                                      data["metadata"]["resourceVersion"]):
            self._apply_pod(kind, obj)


def _revision(obj: Any) -> int | None:
    """An object's (or list's) ``metadata.resourceVersion`` as an integer (an etcd revision),
    or None when it is not one."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    rv = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    if isinstance(rv, str) and rv.isascii() and rv.isdigit() and len(rv) <= 20:
        return int(rv)
    return None


def _object_key(obj: Any, namespaced: bool = True) -> str:
    """``namespace/name`` (or the name) of an API object for logs, whatever its shape."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    name = quote(meta.get("name", "?"), 253)[1:-1]
    if not namespaced:
        return name
    return f"{quote(meta.get('namespace', '?'), 63)[1:-1]}/{name}"


def _namespace_labels(obj: Any) -> tuple[str, dict[str, str]] | None:
    """A Namespace's name and string labels; None when it has no name."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        return None
    labels = meta.get("labels")
    labels = labels if isinstance(labels, Mapping) else {}
    return meta["name"], {str(k): str(v) for k, v in labels.items()}


@dataclass(eq=False)
class _Queued:
    """One fenced bind waiting in its node's group commit."""

    uid: str
    namespace: str
    name: str
    done: bool = False
    record: PodRecord | None = None
    error: BindError | None = None


class _NodeGroup:
    """A node's group commit: binds queued for the next claim write, and whether one is
    being written (``cond`` guards both and is the node's lock for fenced binds)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.queue: list[_Queued] = []
        self.writing = False


class KubeBinder:
    """Cluster-mode bind: assume, then one Binding that also writes the allocation record.

    Parameters
    ----------
    api : kubernetes.client.CoreV1Api
    cache : GpuCache
    assume_ttl_s : float
        Passed to ``GpuCache.assume``.
    now : callable returning a timezone-aware datetime, optional
        For the ``gpufrac.io/assigned-at`` timestamp.
    fence : ClaimFence, optional
        Fence every bind with a claim on the node's ledger first (two writes per bind).
        None: one write, safe only while one instance binds.
    api_timeout_s : float, optional
        Limit of each API call a bind makes, seconds (``Settings.bind_api_timeout_s``).
    """

    def __init__(self, api: client.CoreV1Api, cache: GpuCache, assume_ttl_s: float,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC),
                 fence: ClaimFence | None = None, api_timeout_s: float = 4.0) -> None:
        self._api = api
        self._timeout_s = api_timeout_s
        self._cache = cache
        self._ttl = assume_ttl_s
        self._now = now
        self.fence = fence
        self._groups_guard = threading.Lock()
        self._absent: dict[str, float] = {}
        self._groups: dict[str, _NodeGroup] = {}
        # The pod watch's progress (set by ClusterSync): fenced binds wait for a ledger's
        # watermark, and drop claims of pods it shows bound (extender.fence).
        self.pods_rv: Callable[[], int | None] = lambda: None
        self.bound_rv: Callable[[str], int | None] = lambda uid: None

    def _node_lock(self, node: str) -> threading.Lock:
        """The node's lock: unfenced binds hold it around assume; fenced ones go through
        the same node's group commit (``_NodeGroup.cond`` wraps this lock)."""
        return self._group(node).lock

    def _ensure_known(self, uid: str, namespace: str, name: str) -> None:
        """Bind may come before the pod watch delivered the pod: read it once.

        Raises
        ------
        BindError
            The pod cannot be read, is not the pod ``uid`` (recreated), or does not parse.
        """
        if self._cache.knows_pod(uid):
            return
        try:
            obj = response_json(self._api.read_namespaced_pod(name, namespace, _preload_content=False,
                                                               _request_timeout=self._timeout_s))
        except ApiException as exc:
            raise BindError(f"gpufrac: reading pod {namespace}/{name}: {exc.status} {exc.reason}") from None
        except (OSError, ValueError, urllib3.exceptions.HTTPError) as exc:
            raise BindError(f"gpufrac: reading pod {namespace}/{name}: {type(exc).__name__}") from None
        meta = obj.get("metadata")
        if not isinstance(meta, Mapping) or meta.get("uid") != uid:
            raise BindError(f"gpufrac: pod {namespace}/{name} has another UID than {uid} (recreated)")
        try:
            intent = pod_intent(obj)
        except ValueError as exc:
            raise BindError(f"gpufrac: pod {namespace}/{name}: {exc}") from None
        self._cache.apply_pod_event("ADDED", intent)

    def bind(self, uid: str, namespace: str, name: str, node: str) -> None:
        """Bind one pod to ``node`` with the GPUs gpufrac chooses there.

        Fenced, every API read (the ledger the first time, claimed pods the pod watch has
        not shown yet) happens before the node lock is taken; under it, only the claim's
        compare-and-swap write.

        Raises
        ------
        BindError
            The pod does not fit any more (another bind took the share), is unknown to the
            API, or the Binding failed; nothing stays held, and nothing was written.
        """
        self._ensure_known(uid, namespace, name)
        if self.fence is not None:
            self._read_claimed_pods(node)
            rec = self._assume_and_claim(uid, namespace, name, node)
        else:
            with self._node_lock(node):
                # Choose and hold: serialized per node here and by the cache lock inside,
                # so of two binds racing for the last share exactly one gets it.
                rec = self._cache.assume(uid, namespace, name, node, hold_s=self._ttl)
        alloc = rec.allocation
        assert alloc is not None
        # The Binding runs outside the node lock: the share is already held (and claimed),
        # and binds of other pods to the same node proceed in parallel.
        record = allocation_annotations(rec.gpu_uuids, alloc.gpu_milli,
                                                  alloc.gpu_memory_mib, self._now())
        try:
            self._create_binding(uid, namespace, name, node, record)
        except ApiException as exc:
            if exc.status == HTTP_CONFLICT and self._bound_there(uid, namespace, name, node):
                return  # a retried bind whose first attempt went through, or another instance's
            self._cache.forget(uid)
            raise BindError(f"gpufrac: binding pod {namespace}/{name} to {node}: "
                            f"{exc.status} {exc.reason}") from None

    def _unseen_claims(self, ledger: Ledger) -> list[ClaimedAllocation]:
        """Live foreign claims of pods neither the cache knows nor a read found absent."""
        now = time.monotonic()
        return [c for c in self._claimed(ledger)
                if not self._cache.knows_pod(c.uid) and self._absent.get(c.uid, 0.0) <= now]

    def _read_claimed_pods(self, node: str) -> None:
        """Before the node lock: read ``node``'s ledger if never seen, and the pods its live
        claims name that the cache has not seen (newest first, for at most
        ``CLAIM_READ_BUDGET_S``). A pod that is gone or recreated holds nothing, and is not
        read again while its claim lives.

        Raises
        ------
        BindError
            The ledger cannot be read, or the budget ran out with pods left to read (the
            next try goes on where this one stopped).
        """
        fence = self.fence
        assert fence is not None
        try:
            ledger = fence.view(node)
        except ApiException as exc:
            raise BindError(f"gpufrac: reading the claim ledger of {node}: {exc.status} {exc.reason}") from None
        deadline = time.monotonic() + WATERMARK_WAIT_S
        while not self._reached(ledger):  # the watch moves on in its own thread
            if time.monotonic() > deadline:
                raise BindError(f"gpufrac: the pod watch is behind the claim ledger of {node} (revision "
                                f"{self.pods_rv()} < {ledger.watermark}); kube-scheduler retries the pod")
            time.sleep(0.002)
            ledger = fence.view(node)
        unseen = self._unseen_claims(ledger)
        deadline = time.monotonic() + CLAIM_READ_BUDGET_S
        for i, c in enumerate(reversed(unseen)):
            if time.monotonic() > deadline:
                raise BindError(f"gpufrac: the claim ledger of {node} names {len(unseen) - i} pods not read yet "
                                f"(read {i} in {CLAIM_READ_BUDGET_S:.0f} s); kube-scheduler retries the pod")
            try:
                self._ensure_known(c.uid, c.namespace, c.name)
            except BindError:
                # Deleted or recreated: counted as nothing (ClaimHold.UNKNOWN).
                if len(self._absent) >= MAX_ABSENT:
                    self._absent = {u: t for u, t in list(self._absent.items()) if t > time.monotonic()}
                self._absent[c.uid] = time.monotonic() + c.hold_s

    def _reached(self, ledger: Ledger) -> bool:
        """True when this instance's pod watch has applied every pod event up to the
        ledger's watermark, so the claims dropped below it are counted by the pods."""
        if ledger.watermark == 0:
            return True
        rv = self.pods_rv()
        return rv is not None and rv >= ledger.watermark

    def _shown_bound(self, claim: Claim) -> int | None:
        """The pod-event revision at which the pod watch showed ``claim`` bound as claimed;
        None while it has not (the claim stays in the ledger)."""
        rv = self.bound_rv(claim.uid)
        if rv is None or not self._cache.shows_bound(claim.uid, claim.node, claim.gpu_uuids):
            return None
        return rv

    def _live_claims(self, node: str) -> tuple[Ledger, list[ClaimedAllocation]]:
        """Under the node lock, no API call: ``node``'s ledger as last seen, and its live
        claims by other instances, for ``GpuCache.assume`` to count under its lock.

        Raises
        ------
        BindError
            A live claim names a pod that was neither read nor found absent (its claim
            arrived after ``_read_claimed_pods``): counting nothing for it could
            over-commit, so the bind is refused and retried.
        """
        fence = self.fence
        assert fence is not None
        ledger = fence.view(node)  # kept since _read_claimed_pods: no API read
        if not self._reached(ledger):
            raise BindError(f"gpufrac: the claim ledger of {node} moved past this instance's pod watch; "
                            "kube-scheduler retries the pod")
        if unseen := self._unseen_claims(ledger):
            c = unseen[-1]
            raise BindError(f"gpufrac: the claim ledger of {node} names pod {c.namespace}/{c.name}, "
                            "not seen yet; kube-scheduler retries the pod")
        return ledger, self._claimed(ledger)

    def _claimed(self, ledger: Ledger) -> list[ClaimedAllocation]:
        """The live claims of ``ledger`` made by other instances (ours are held by our own
        assume, or were given back when their Binding failed)."""
        fence = self.fence
        assert fence is not None
        return [c.counted(left) for c, left in fence.live(ledger) if c.owner != fence.identity]

    def fold(self, ledger: Ledger) -> None:
        """Count other instances' live claims of ``ledger`` in the cache now (the claims
        watch), so that filter and prioritize see them before any bind re-counts them."""
        for c in self._claimed(ledger):
            self._cache.hold_claim(c)

    def _assume_and_claim(self, uid: str, namespace: str, name: str, node: str) -> PodRecord:
        """Fenced: choose and hold the pod's GPUs, and commit its claim, in a group commit.

        Binds to one node queue up; the first one not waiting on a write becomes the
        leader and, under the node lock, assumes every queued pod against one view of the
        ledger (each counting the others' holds), then writes all their claims in one
        compare-and-swap with the lock released, so binds arriving meanwhile queue for the
        next write. One write covers every bind that came while the previous one was in
        flight, and the choice is the same as one bind at a time: each pod was assumed
        against the ledger version the write is conditioned on. A conflict refuses the
        whole group (each is retried by kube-scheduler); a pod that no longer fits is
        refused alone.

        Raises
        ------
        BindError
            The pod does not fit, or its group's claim could not be written.
        """
        group = self._group(node)
        me = _Queued(uid, namespace, name)
        with group.cond:
            group.queue.append(me)
            while not me.done:
                if group.writing:
                    group.cond.wait()
                    continue
                group.writing = True
                batch, group.queue = group.queue, []
                try:
                    self._commit_group(node, group, batch)
                finally:
                    for q in batch:
                        q.done = True
                    group.writing = False
                    group.cond.notify_all()
        if me.error is not None:
            raise me.error
        assert me.record is not None
        return me.record

    def _commit_group(self, node: str, group: _NodeGroup, batch: list[_Queued]) -> None:
        """Assume ``batch`` against one view of ``node``'s ledger and write their claims;
        called with ``group.cond`` held, released around the write only."""
        fence = self.fence
        assert fence is not None
        try:
            seen, claims = self._live_claims(node)
        except BindError as exc:
            for q in batch:
                q.error = exc
            return
        for q in batch:
            try:
                q.record = self._cache.assume(q.uid, q.namespace, q.name, node, hold_s=self._ttl, claims=claims)
            except BindError as exc:
                q.error = exc
        assumed = [q for q in batch if q.error is None]
        if not assumed:
            return
        ours = []
        for q in assumed:
            rec = q.record
            assert rec is not None and rec.allocation is not None
            ours.append(fence.claim_of(q.uid, q.namespace, q.name, node, rec.gpu_uuids,
                                       rec.allocation.gpu_milli, rec.allocation.gpu_memory_mib))
        failed: BindError | None = None
        group.cond.release()
        try:
            fence.commit_all(seen, ours, bound_rv=self._shown_bound)
        except FenceConflict as exc:
            failed = BindError(f"gpufrac: {exc}: another gpufrac instance bound there first; "
                               "kube-scheduler retries the pod", "conflict")
        except ApiException as exc:
            failed = BindError(f"gpufrac: writing the claim ledger of {node}: {exc.status} {exc.reason}")
        finally:
            group.cond.acquire()
        if failed is not None:
            for q in assumed:
                self._cache.forget(q.uid)
                q.error = failed

    def _group(self, node: str) -> _NodeGroup:
        with self._groups_guard:
            return self._groups.setdefault(node, _NodeGroup())

    def _create_binding(self, uid: str, namespace: str, name: str, node: str,
                        annotations: Mapping[str, str]) -> None:
        # One call, atomic: the API server copies a Binding's annotations onto the pod in
        # the same write that sets spec.nodeName (BindingREST.setPodNodeAndMetadata in
        # pkg/registry/core/pod/storage/storage.go). A pod is never bound without its
        # allocation record, nor annotated without being bound, so a failure leaves nothing
        # to undo in the API. metadata.uid makes it fail rather than bind a recreated pod.
        body = {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": name, "namespace": namespace, "uid": uid,
                             "annotations": dict(annotations)},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        # The API answers a Status, which is not read further.
        write_json(self._api, "POST", core_path("namespaces", namespace, "pods", name, "binding"), body,
                   timeout_s=self._timeout_s)

    def _bound_there(self, uid: str, namespace: str, name: str, node: str) -> bool:
        """After a 409: True when the pod is bound to ``node`` already. The cache then counts
        the allocation record the pod carries (another instance's Binding of the same pod
        may have landed first, on other GPUs)."""
        try:
            intent = pod_intent(response_json(self._api.read_namespaced_pod(
                name, namespace, _preload_content=False, _request_timeout=self._timeout_s)))
        except (ApiException, OSError, ValueError, urllib3.exceptions.HTTPError):
            return False
        if intent.uid != uid or intent.node_name != node:
            return False
        self._cache.apply_pod_event("MODIFIED", intent)
        return True
