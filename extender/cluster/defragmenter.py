"""The defragmentation plan in cluster mode: PodDisruptionBudgets read from the API, the plan
made every ``plan_every_s`` in housekeeping, and, behind ``DefragPolicy.evict`` (off by
default), its moves made through the Eviction API (``extender.cache.defrag`` decides).

Acting on a step: its target node is held for the waiting pod first (``GpuCache.hold_for``;
filter keeps every other pod off it, so the recreated pods land elsewhere), then each move
is an Eviction (``policy/v1``, with the pod's UID as precondition). The API server checks
the PodDisruptionBudgets again: a ``429`` is a budget that refused (counted ``blocked``; the
step stops there). At most ``max_evictions_per_hour`` in any hour; a step is acted on once its
waiting pod has been seen pending ``evict_after_s``, and never while a hold for it stands.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from extender.cache import (
    EMPTY_PLAN,
    DefragPlan,
    DisruptionBudget,
    GpuCache,
    Labels,
    Move,
    Step,
    is_pending,
    plan_defrag,
)
from extender.cluster.node_reader import NodeReader
from extender.quarantine import Quarantine
from podspec.kubeio import core_path, response_json, write_json
from podspec.pods import pod_intent
from scoring.scorer import Scorer

log = logging.getLogger(__name__)

MAX_BUDGET_PAGES = 10
"""Pages of 500 PodDisruptionBudgets read per plan; past that, every pod counts as protected."""
HOLD_TTL_S = 600.0
"""How long a step's target node is held for its waiting pod."""
HTTP_TOO_MANY_REQUESTS = 429
HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409


def label_selector_matches(selector: Any, labels: Mapping[str, str]) -> bool | None:
    """A ``LabelSelector`` (``matchLabels`` and ``matchExpressions``) against a pod's labels;
    None when the selector cannot be read (the caller then protects every pod it may cover)."""
    if not isinstance(selector, Mapping):
        return None
    match = selector.get("matchLabels") or {}
    exprs = selector.get("matchExpressions") or []
    if not isinstance(match, Mapping) or not isinstance(exprs, list):
        return None
    if any(labels.get(k) != v for k, v in match.items()):
        return False
    for e in exprs:
        if not isinstance(e, Mapping) or not isinstance(e.get("key"), str):
            return None
        key, op, values = e["key"], e.get("operator"), e.get("values") or []
        if not isinstance(values, list):
            return None
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return None
    return True


def _object(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """``obj[key]`` when it is an object, else an empty one."""
    value = obj.get(key)
    return value if isinstance(value, Mapping) else {}


def budget_of(pdb: Mapping[str, Any], pods: Sequence[tuple[str, Mapping[str, str]]]) -> DisruptionBudget | None:
    """One PodDisruptionBudget (API JSON) as the plan counts it, over the pods of its
    namespace ``(uid, labels)``; None when it has no name.

    ``allowed`` is ``status.disruptionsAllowed`` once the disruption controller has processed
    the budget's generation (``status.observedGeneration``), else 0 (as the Eviction API
    counts it). A ``null`` selector covers no pod; ``{}`` every pod of the namespace; one that
    cannot be read, every pod of the namespace, with ``allowed`` 0.
    """
    meta, spec, status = (_object(pdb, k) for k in ("metadata", "spec", "status"))
    name, ns = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str) or not isinstance(ns, str):
        return None
    allowed = status.get("disruptionsAllowed")
    generation, observed = meta.get("generation"), status.get("observedGeneration")
    if (not isinstance(allowed, int) or isinstance(allowed, bool) or not isinstance(observed, int)
            or not isinstance(generation, int) or observed < generation):
        allowed = 0
    allowed = max(0, min(allowed, 1 << 20))
    selector = spec.get("selector")
    if selector is None:
        return DisruptionBudget(f"{ns}/{name}", allowed, frozenset())
    covered = set()
    for uid, labels in pods:
        m = label_selector_matches(selector, labels)
        if m is None:
            return DisruptionBudget(f"{ns}/{name}", 0, frozenset(u for u, _ in pods))
        if m:
            covered.add(uid)
    return DisruptionBudget(f"{ns}/{name}", allowed, frozenset(covered))


def read_budgets(api: client.CoreV1Api, pods_by_namespace: Mapping[str, Sequence[tuple[str, Mapping[str, str]]]],
                 timeout_s: float = 10.0) -> list[DisruptionBudget]:
    """Every PodDisruptionBudget of the namespaces in ``pods_by_namespace`` (pages of 500, at
    most ``MAX_BUDGET_PAGES``; past that, one budget allowing nothing over every pod listed).

    Raises
    ------
    kubernetes.client.rest.ApiException
        The list failed (the caller plans nothing this time).
    """
    policy = client.PolicyV1Api(api.api_client)
    out: list[DisruptionBudget] = []
    token: str | None = None
    for _ in range(MAX_BUDGET_PAGES):
        kw: dict[str, Any] = {"limit": 500, "_preload_content": False, "_request_timeout": timeout_s}
        if token:
            kw["_continue"] = token
        page = response_json(policy.list_pod_disruption_budget_for_all_namespaces(**kw))
        items = page.get("items")
        items = items if isinstance(items, list) else []
        for pdb in items:
            ns = ((pdb.get("metadata") or {}).get("namespace") if isinstance(pdb, Mapping) else None)
            if isinstance(ns, str) and ns in pods_by_namespace:
                b = budget_of(pdb, pods_by_namespace[ns])
                if b is not None:
                    out.append(b)
        meta = _object(page, "metadata")
        token = meta.get("continue") if isinstance(meta.get("continue"), str) else None
        if not token:
            return out
    log.warning("more than %d PodDisruptionBudgets: every pod counts as protected", MAX_BUDGET_PAGES * 500)
    return [DisruptionBudget("(too many PodDisruptionBudgets to read)", 0,
                             frozenset(u for pods in pods_by_namespace.values() for u, _ in pods))]


def evict(api: client.CoreV1Api, move: Move, timeout_s: float = 10.0) -> str:
    """Evict one moved pod (``policy/v1`` Eviction, its UID as precondition).

    Returns
    -------
    str
        ``evicted``; ``blocked`` (429: a PodDisruptionBudget refused); ``gone`` (404, or 409:
        the pod with that UID no longer exists); ``error`` (anything else, logged).
    """
    ns, name = move.pod.split("/", 1)
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": ns},
            "deleteOptions": {"preconditions": {"uid": move.uid}}}
    try:
        write_json(api, "POST", core_path("namespaces", ns, "pods", name, "eviction"), body, timeout_s)
    except ApiException as exc:
        if exc.status == HTTP_TOO_MANY_REQUESTS:
            log.info("eviction of %s refused by a PodDisruptionBudget", move.pod)
            return "blocked"
        if exc.status in (HTTP_NOT_FOUND, HTTP_CONFLICT):
            return "gone"
        log.warning("eviction of %s failed: %s %s", move.pod, exc.status, exc.reason)
        return "error"
    log.info("evicted %s from %s (defragmentation; it fits on %s)", move.pod, move.node, move.fits_on)
    return "evicted"


def plan_from_api(api: client.CoreV1Api, scorer: Scorer, stale_after_s: float) -> DefragPlan:
    """The plan as the extender would make it, from the API's Nodes, Pods and
    PodDisruptionBudgets (``gpufrac inspect --defrag``): a cache filled from one list of each
    (oldest pods first), read by the same code as cluster mode's."""
    reader = NodeReader(Quarantine(), lambda: datetime.now(UTC), stale_after_s)
    cache = GpuCache(scorer)
    cache.set_nodes(reader.relist(response_json(api.list_node(_preload_content=False)).get("items") or []))
    pods = response_json(api.list_pod_for_all_namespaces(_preload_content=False)).get("items") or []
    intents = []
    for pod in sorted(pods, key=_age_key):
        try:
            intents.append(pod_intent(pod))
        except ValueError:
            continue  # unreadable: gpufrac skips it (inspect lists it)
    cache.set_pods(intents)
    made = Defragmenter(api, cache, reader.labels).run()
    if made is None:
        raise RuntimeError("PodDisruptionBudgets could not be read; no plan")
    return made


def _age_key(pod: Any) -> tuple[str, str]:
    """Oldest first: ``creationTimestamp`` (RFC 3339, so text order is time order), then name."""
    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    created, name = meta.get("creationTimestamp"), meta.get("name")
    return (created if isinstance(created, str) else "", name if isinstance(name, str) else "")


class Defragmenter:
    """The plan made in housekeeping, kept for ``/defrag`` and the metrics, and acted on when
    the policy says so (module notes).

    Parameters
    ----------
    api : kubernetes.client.CoreV1Api
    cache : GpuCache
    node_labels : callable returning a mapping of node name to labels
        ``NodeReader.labels``.
    on_plan : callable of DefragPlan, optional
        Called with each new plan (the metrics' gauges).
    count : callable of str, optional
        Called with each eviction's result (``gpufrac_defrag_evictions_total``).
    clock : callable returning float
        Seconds, monotonic (injected by tests).
    evict_one, budgets_of : callable, optional
        ``evict`` and ``read_budgets`` on ``api`` by default (tests pass fakes).
    """

    def __init__(self, api: client.CoreV1Api, cache: GpuCache, node_labels: Callable[[], Labels],
                 on_plan: Callable[[DefragPlan], None] = lambda made: None,
                 count: Callable[[str], None] = lambda result: None,
                 clock: Callable[[], float] = time.monotonic,
                 evict_one: Callable[[Move], str] | None = None,
                 budgets_of: Callable[[Mapping[str, Sequence[tuple[str, Mapping[str, str]]]]],
                                      list[DisruptionBudget]] | None = None) -> None:
        self._evict = evict_one if evict_one is not None else (lambda move: evict(api, move))
        self._budgets_of = budgets_of if budgets_of is not None else (lambda by_ns: read_budgets(api, by_ns))
        self._cache = cache
        self._labels = node_labels
        self._count = count
        self._on_plan = on_plan
        self._clock = clock
        self._lock = threading.Lock()
        self._latest: DefragPlan = EMPTY_PLAN
        self._latest_at: float | None = None
        self._seen: dict[str, float] = {}
        self._evictions: deque[float] = deque()

    def latest(self) -> tuple[DefragPlan, float | None]:
        """The last plan and its age in seconds (None before the first)."""
        with self._lock:
            at = self._latest_at
            return self._latest, None if at is None else self._clock() - at

    def loop(self, stop: threading.Event, ready: Callable[[], bool] = lambda: True) -> None:
        """Plan every ``plan_every_s`` (re-read from the policy each time) until ``stop``; not
        before ``ready`` (the cache's first full sync)."""
        while not stop.wait(min(max(self._cache.defrag_policy.plan_every_s, 1.0), 3600.0)):
            if not ready():
                continue
            try:
                self.run()
            except Exception:  # noqa: BLE001 - never let the loop die
                log.exception("defragmentation plan failed")

    def run(self) -> DefragPlan | None:
        """One plan, kept and acted on when the policy says so; None when the PodDisruptionBudgets
        could not be read (nothing planned this time)."""
        policy = self._cache.defrag_policy
        now = self._clock()
        if not self._cache.pending_gpu_pods(1):  # the usual case: nothing waits, no copy of the cache
            self._seen.clear()
            with self._lock:
                self._latest, self._latest_at = EMPTY_PLAN, now
            self._on_plan(EMPTY_PLAN)
            return EMPTY_PLAN
        state, records, scorer = self._cache.defrag_snapshot()
        pending = {uid for uid, rec in records if is_pending(rec)}
        self._seen = {uid: self._seen.get(uid, now) for uid in pending}

        def budgets() -> list[DisruptionBudget]:
            by_ns: dict[str, list[tuple[str, Mapping[str, str]]]] = {}
            for uid, rec in records:
                if rec.allocation is not None:
                    by_ns.setdefault(rec.intent.namespace, []).append((uid, dict(rec.intent.labels)))
            return self._budgets_of(by_ns)

        try:
            made = plan_defrag(state, records, scorer, node_labels=self._labels(), budgets=budgets)
        except ApiException as exc:
            log.warning("defragmentation plan skipped: PodDisruptionBudgets not readable: %s %s",
                        exc.status, exc.reason)
            return None
        with self._lock:
            self._latest, self._latest_at = made, now
        self._on_plan(made)
        if policy.evict:
            self._act(made, now, policy.evict_after_s, policy.max_evictions_per_hour)
        return made

    def _act(self, made: DefragPlan, now: float, after_s: float, per_hour: int) -> None:
        """Evict the moves of the steps whose pods waited long enough, within the hour's budget."""
        while self._evictions and now - self._evictions[0] >= 3600:
            self._evictions.popleft()
        holding = {r.uid for r in self._cache.reservations()}
        for step in made.steps:
            if step.uid in holding or now - self._seen.get(step.uid, now) < after_s:
                continue
            if len(self._evictions) + len(step.moves) > per_hour:
                log.info("defragmentation: %d evictions this hour; %s waits for the next hour",
                         len(self._evictions), step.pod)
                return
            self._step(step, now)

    def _step(self, step: Step, now: float) -> None:
        """Hold the target node, then evict the step's moves in order until one is refused."""
        if self._cache.hold_for(step.uid, step.node, HOLD_TTL_S) is None:
            return
        log.info("defragmentation: freeing node %s for %s (%d move(s))", step.node, step.pod, len(step.moves))
        for move in step.moves:
            result = self._evict(move)
            self._count(result)
            if result == "evicted":
                self._evictions.append(now)
            elif result in ("blocked", "error"):
                if result == "blocked" and move is step.moves[0]:
                    self._cache.drop_hold(step.uid)  # nothing moved: the node is not held for nothing
                return
