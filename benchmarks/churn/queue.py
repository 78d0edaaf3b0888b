"""kube-scheduler's scheduling queue over time, emulated for the churn replay.

Events, in time order (a departure before a scheduling attempt at the same instant):

- **arrival**: the pod watch hears of the pod (``pod_events`` ADDED), and the pod is tried at
  once (``activeQ``);
- **attempt**: one scheduling cycle as the arrivals-only replay runs it (in-tree fit,
  ``filter``, ``prioritize`` unless one node is left, ``selectHost``, ``bind``:
  ``benchmarks.scheduler_emulation.schedule_with_extender``). A pod that fits nowhere goes to the
  unschedulable pods with ``attempts += 1``;
- **departure**: the pod ends after its lifetime (``pod_events`` DELETED); what it held is free.

kube-scheduler moves unschedulable pods back to the queue when a pod is deleted, retries them
after their back-off (``podInitialBackoffSeconds`` 1 s, doubling per attempt up to
``podMaxBackoffSeconds`` 10 s), oldest queue timestamp first (``PrioritySort``; the timestamp
is the last attempt), and flushes the unschedulable pods every 5 minutes. The emulation keeps
the order and the back-off, and skips only what cannot change an outcome:

- a pending pod is woken (its retry queued) only by a departure from a node on which it could
  now fit by the emulator's own count (CPU, memory, pod slots, ``gpufrac.io/gpu`` slots, and
  ``num_gpu`` GPUs each with ``gpu_milli`` free); placement only ever takes capacity, so a
  pod that fitted nowhere stays unplaceable until some node frees enough for it;
- when its retry comes, a pod that fits none of the nodes freed since its last attempt (someone
  earlier in the queue took the room) fails without calling the extender: it is counted as a
  failed attempt, as kube-scheduler's would be.

The emulator's count is looser than the extender's fit (it ignores QoS isolation, replica slots
per GPU and GPU models), so it may wake a pod the extender then refuses, never the reverse. The
5-minute flush is not emulated: a pod retried with no capacity freed for it fails again.

With starvation protection (``extender.cache.reservations``) the emulation runs gpufrac's
housekeeping every ``HOUSEKEEPING_S`` of simulated time, and a reservation that ends (its pod
bound, or expired) counts as room freed on its node: pods are woken as by a departure there.

Acting on the defragmentation plan (``extender.cache.defrag``; the policy's ``evict``): every
``plan_every_s`` (an event of its own) while a GPU pod waits, the plan is made on the extender's cache, as cluster
mode's ``Defragmenter`` makes it, and each step whose pod has waited ``evict_after_s`` since it
arrived is acted on within ``max_evictions_per_hour``: the target node is held, each moved pod
departs at once and its controller's replacement (the same shape, renamed) arrives at once
with the lifetime the pod had left. Every trace pod counts as controller-owned here. The
replacements' own pending time is reported apart (``moved_pending``), not in ``pending``.
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from collections import deque
from typing import Any

import numpy as np
from numpy.typing import NDArray

from benchmarks.churn.measures import RunResult, pending_stats, window_waits
from benchmarks.churn.terms import readings
from benchmarks.churn.workload import Arrival
from benchmarks.extender_client import InProcessClient
from benchmarks.scheduler_emulation import (
    DEFAULT_PODS_PER_NODE,
    ClusterNames,
    Profile,
    SchedulerView,
    schedule_with_extender,
)
from extender.cache import NO_DEFRAG, NO_RESERVATIONS, DefragPolicy, StarvationPolicy, plan_defrag
from extender.cluster.defragmenter import HOLD_TTL_S
from scoring.request import MILLI_PER_GPU
from scoring.specs import NodeSpec

INITIAL_BACKOFF_S = 1.0
"""kube-scheduler's ``podInitialBackoffSeconds`` default."""
MAX_BACKOFF_S = 10.0
"""kube-scheduler's ``podMaxBackoffSeconds`` default."""

HOUSEKEEPING_S = 2.0
"""Cluster mode's housekeeping period (``extender.cluster.objects.SyncOptions.housekeeping_s``)."""

SERIES_POINTS = 400
"""Samples of allocation and queue length per run (the plots' resolution)."""

TERMS_EVERY = 4
"""With ``terms``: every 4th sample reads the strategies' inputs (about 15 ms each on 152 nodes)."""

_DEPART, _ATTEMPT, _PLAN = 0, 1, 2
"""Event kinds, in their order at one instant (a plan sees the attempts made at its time)."""

OWNER = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "churn", "uid": "churn", "controller": True}
"""The controller every trace pod has when the plan is acted on (module notes)."""


def backoff_s(attempts: int) -> float:
    """kube-scheduler's back-off after ``attempts`` failed attempts, seconds."""
    return min(MAX_BACKOFF_S, INITIAL_BACKOFF_S * 2.0 ** min(max(0, attempts - 1), 30))


class _Pending:
    """The unschedulable pods as arrays, so a departure checks them all at once."""

    def __init__(self) -> None:
        self.arrival = np.zeros(0, dtype=np.int64)
        self.cpu = np.zeros(0, dtype=np.int64)
        self.mem = np.zeros(0, dtype=np.int64)
        self.ngpu = np.zeros(0, dtype=np.int64)
        self.milli = np.zeros(0, dtype=np.int64)
        self.last_s = np.zeros(0, dtype=np.float64)
        self.attempts = np.zeros(0, dtype=np.int64)
        self.alive = np.zeros(0, dtype=bool)
        self.woken = np.zeros(0, dtype=bool)
        self.slot_of: dict[int, int] = {}
        self._free: list[int] = []

    def __len__(self) -> int:
        return len(self.slot_of)

    def _grow(self) -> None:
        n = max(64, 2 * self.alive.shape[0])
        for name in ("arrival", "cpu", "mem", "ngpu", "milli", "last_s", "attempts", "alive", "woken"):
            old = getattr(self, name)
            new = np.zeros(n, dtype=old.dtype)
            new[:old.shape[0]] = old
            setattr(self, name, new)

    def add(self, arrival: int, cpu: int, mem: int, ngpu: int, milli: int, t_s: float) -> None:
        if not self._free:
            old = self.alive.shape[0]
            self._grow()
            self._free = list(range(self.alive.shape[0] - 1, old - 1, -1))
        s = self._free.pop()
        self.arrival[s], self.cpu[s], self.mem[s], self.ngpu[s], self.milli[s] = arrival, cpu, mem, ngpu, milli
        self.last_s[s], self.attempts[s], self.alive[s], self.woken[s] = t_s, 1, True, False
        self.slot_of[arrival] = s

    def remove(self, arrival: int) -> None:
        s = self.slot_of.pop(arrival)
        self.alive[s] = self.woken[s] = False
        self._free.append(s)

    def fragmentation_waits(self, free_milli: int) -> int:
        """Pending GPU pods whose request (``num_gpu * gpu_milli``) is at most ``free_milli``."""
        req = self.ngpu * self.milli
        return int((self.alive & (req > 0) & (req <= free_milli)).sum())


class ChurnSim:
    """One run: a cluster, a policy's extender (in process), one seed's arrivals.

    Parameters
    ----------
    client : InProcessClient
        The extender's verbs on its own cache (the churn replay reads each bind's GPUs).
    specs : list of NodeSpec
    profile : Profile
        The kube-scheduler profile to emulate.
    seed : int
        ``selectHost`` tie-breaks and pod UIDs.
    starvation : StarvationPolicy
        The extender's starvation protection (off by default).
    defrag : DefragPolicy
        Acting on the defragmentation plan (module notes) when ``evict``; off by default.
    terms : bool
        Read what each strategy takes from the running and the arrival mix
        (``benchmarks.churn.terms``) at every ``TERMS_EVERY``-th sample of the measured window.
    """

    def __init__(self, client: InProcessClient, specs: list[NodeSpec], profile: Profile, seed: int,
                 starvation: StarvationPolicy = NO_RESERVATIONS, defrag: DefragPolicy = NO_DEFRAG, terms: bool = False) -> None:
        self.client = client
        self.terms = terms
        self.starvation = starvation
        self.defrag = defrag
        self.profile = profile
        self.seed = seed
        self.cluster = ClusterNames.build(specs, profile.node_cache_capable)
        self.view = SchedulerView(
            np.array([s.cpu_milli for s in specs]), np.array([s.memory_mib for s in specs]),
            np.array([sum(g.replicas for g in s.gpus) for s in specs]), profile, np.random.default_rng(seed))
        width = max(len(s.gpus) for s in specs)
        self.free = np.full((len(specs), width), -1, dtype=np.int64)
        for i, s in enumerate(specs):
            self.free[i, :len(s.gpus)] = MILLI_PER_GPU
        self.free_desc = -np.sort(-self.free, axis=1)
        self.freed_at = np.full(len(specs), -np.inf)
        self.row_of = {s.name: i for i, s in enumerate(specs)}
        self.reserved: set[str] = set()
        self.capacity_milli = MILLI_PER_GPU * sum(len(s.gpus) for s in specs)

    # -- the emulator's own count of what fits where ------------------------------------------

    def _fits(self, rows: NDArray[np.int64] | int, cpu: Any, mem: Any, ngpu: Any, milli: Any) -> NDArray[np.bool_]:
        """The emulator's count (module notes): several nodes against one pod shape (``rows`` an
        array, the rest ints), or one node against several pods (``rows`` an int, the rest arrays)."""
        v = self.view
        width = self.free.shape[1]
        kth = self.free_desc[rows][..., np.clip(np.asarray(ngpu) - 1, 0, width - 1)]
        ok: NDArray[np.bool_] = (
            (v.cpu_alloc[rows] - v.cpu_req[rows] >= cpu) & (v.mem_alloc[rows] - v.mem_req[rows] >= mem)
            & (v.pods[rows] < DEFAULT_PODS_PER_NODE) & (v.slot_alloc[rows] - v.slots[rows] >= ngpu)
            & ((np.asarray(ngpu) == 0) | ((np.asarray(ngpu) <= width) & (kth >= milli))))
        return ok

    def _wake_on(self, node: int, pend: _Pending) -> NDArray[np.int64]:
        return np.flatnonzero(pend.alive & ~pend.woken & self._fits(node, pend.cpu, pend.mem, pend.ngpu, pend.milli))

    def _freed(self, node: int, t: float, pend: _Pending, heap: list[tuple[float, int, float, int, int]],
               seq: int) -> int:
        """Room freed on ``node`` at ``t``: queue the retries of the pods it may now fit."""
        self.freed_at[node] = t
        for s in self._wake_on(node, pend).tolist():
            pend.woken[s] = True
            ready = max(t, float(pend.last_s[s]) + backoff_s(int(pend.attempts[s])))
            heapq.heappush(heap, (ready, _ATTEMPT, float(pend.last_s[s]), seq, int(pend.arrival[s])))
            seq += 1
        return seq

    def _take(self, node: int, cols: tuple[int, ...], milli: int, sign: int) -> None:
        if cols:
            self.free[node, list(cols)] -= sign * milli
            self.free_desc[node] = -np.sort(-self.free[node])

    # -- one cycle ----------------------------------------------------------------------------

    def _cycle(self, a: Arrival, pod: dict[str, Any]) -> tuple[int, tuple[int, ...]]:
        """One scheduling cycle; the node row and GPU columns, or (-1, ())."""
        tp, view, cluster = a.pod, self.view, self.cluster
        feasible = view.feasible(tp.cpu_milli, tp.memory_mib, tp.num_gpu)
        if not feasible.shape[0]:
            return -1, ()
        if tp.num_gpu == 0 and not self.profile.extender_all_pods:
            node = view.select(feasible, view.in_tree_scores(feasible, tp.cpu_milli, tp.memory_mib))
            bound = {**pod, "spec": {**pod["spec"], "nodeName": cluster.names[node]}, "status": {"phase": "Running"}}
            self.client.pod_events([{"type": "MODIFIED", "object": bound}])
            return node, ()
        node = schedule_with_extender(self.client, view, cluster, pod, tp.cpu_milli, tp.memory_mib, feasible,
                                      self.profile)
        if node < 0 or self.client.bind(pod, cluster.names[node]):
            return -1, ()
        rec = self.client.last_bound
        alloc = rec.allocation if rec is not None else None
        return node, tuple(alloc.gpu_cols) if alloc is not None else ()

    # -- the run ------------------------------------------------------------------------------

    def run(self, arrivals: list[Arrival], preset: str, load: float, run_s: float, warmup_s: float) -> RunResult:
        """Play ``arrivals`` for ``run_s`` seconds; measure over ``[warmup_s, run_s]``."""
        started = time.perf_counter()
        arrivals = list(arrivals)  # evictions append their replacements
        n = len(arrivals)
        start_s = [float("nan")] * n
        uid_index: dict[str, int] = {}
        evicted_at: deque[float] = deque()
        evictions = 0
        placed: dict[int, tuple[int, tuple[int, ...]]] = {}
        objects: dict[int, dict[str, Any]] = {}
        pend = _Pending()
        heap: list[tuple[float, int, float, int, int]] = []
        seq = 0
        for i, a in enumerate(arrivals):
            heap.append((a.t_s, _ATTEMPT, a.t_s, seq, i))
            seq += 1
        if self.defrag.evict:
            heap.append((0.0, _PLAN, 0.0, seq, 0))  # the plan's own clock (its arrival index unused)
            seq += 1
        heapq.heapify(heap)
        allocated = 0
        cycles = skipped = 0
        acc = {"alloc": 0.0, "frag": 0.0, "wait": 0.0, "frag_pods": 0.0, "wait_pods": 0.0}
        grid = np.linspace(0.0, run_s, SERIES_POINTS + 1)
        series: dict[str, list[float]] = {"t_h": (grid / 3600).round(4).tolist(), "allocation_pct": [],
                                          "pending_pods": [], "pending_gpu_pods": []}
        last_t, frag_now, wait_now, frag_pods = 0.0, False, False, 0
        term_sums: dict[str, dict[str, float]] = {}
        term_n: dict[str, int] = {}
        pending_gpu = 0
        next_sweep_s, reservations_made = 0.0, 0

        def evict(j: int) -> None:
            """Pod ``j`` evicted at ``t``: it departs, its replacement arrives (module notes)."""
            nonlocal allocated, seq, evictions
            node, cols = placed.pop(j)
            tpj = arrivals[j].pod
            self.client.pod_events([{"type": "DELETED", "object": objects.pop(j)}])
            self.view.release(node, tpj.cpu_milli, tpj.memory_mib, tpj.num_gpu)
            self._take(node, cols, tpj.gpu_milli, -1)
            allocated -= tpj.gpu_request_milli
            k = len(arrivals)
            left = max(start_s[j] + arrivals[j].lifetime_s - t, 1.0)
            arrivals.append(Arrival(t, dataclasses.replace(tpj, name=f"{tpj.name}-m{k}"), left))
            start_s.append(float("nan"))
            heapq.heappush(heap, (t, _ATTEMPT, t, seq, k))
            seq += 1
            seq = self._freed(node, t, pend, heap, seq)
            evictions += t >= warmup_s

        def advance(t: float) -> None:
            nonlocal last_t
            lo, hi = max(last_t, warmup_s), min(t, run_s)
            if hi > lo:
                acc["alloc"] += allocated * (hi - lo)
                acc["frag"] += (hi - lo) * frag_now
                acc["wait"] += (hi - lo) * wait_now
                acc["frag_pods"] += (hi - lo) * frag_pods
                acc["wait_pods"] += (hi - lo) * pending_gpu
            while len(series["allocation_pct"]) < grid.shape[0] and grid[len(series["allocation_pct"])] <= min(t, run_s):
                at = len(series["allocation_pct"])
                if self.terms and grid[at] >= warmup_s and at % TERMS_EVERY == 0:
                    for mix, read in readings(self.client.cache.state_copy()).items():
                        acc_mix = term_sums.setdefault(mix, {})
                        for name, v in read.items():
                            acc_mix[name] = acc_mix.get(name, 0.0) + v
                        term_n[mix] = term_n.get(mix, 0) + 1
                series["allocation_pct"].append(round(100.0 * allocated / self.capacity_milli, 3))
                series["pending_pods"].append(len(pend))
                series["pending_gpu_pods"].append(pending_gpu)
            last_t = t

        while heap and heap[0][0] < run_s:
            t, kind, _key, _seq, i = heapq.heappop(heap)
            advance(t)
            a = arrivals[i]
            tp = a.pod
            if kind == _DEPART and i not in placed:
                continue  # evicted before its end (its replacement runs on)
            if kind == _PLAN:
                heapq.heappush(heap, (t + self.defrag.plan_every_s, _PLAN, 0.0, seq, 0))
                seq += 1
                if pending_gpu:
                    for j in self._plan_evictions(t, arrivals, uid_index, evicted_at):
                        evict(j)
            elif kind == _DEPART:
                node, cols = placed.pop(i)
                self.client.pod_events([{"type": "DELETED", "object": objects.pop(i)}])
                self.view.release(node, tp.cpu_milli, tp.memory_mib, tp.num_gpu)
                self._take(node, cols, tp.gpu_milli, -1)
                allocated -= tp.gpu_request_milli
                seq = self._freed(node, t, pend, heap, seq)
            else:
                slot = pend.slot_of.get(i)
                if i not in objects:
                    objects[i] = tp.pod_object(self.seed)
                    if self.defrag.evict:
                        objects[i]["metadata"]["ownerReferences"] = [OWNER]
                        uid_index[objects[i]["metadata"]["uid"]] = i
                    self.client.pod_events([{"type": "ADDED", "object": objects[i]}])
                    node, cols = self._cycle(a, objects[i])
                    cycles += 1
                else:
                    assert slot is not None
                    pend.woken[slot] = False
                    changed = np.flatnonzero(self.freed_at > pend.last_s[slot])
                    if changed.shape[0] and self._fits(changed, tp.cpu_milli, tp.memory_mib, tp.num_gpu,
                                                       tp.gpu_milli).any():
                        node, cols = self._cycle(a, objects[i])
                        cycles += 1
                    else:
                        node, cols = -1, ()
                        skipped += 1
                if node >= 0:
                    start_s[i] = t
                    placed[i] = (node, cols)
                    self.view.assume(node, tp.cpu_milli, tp.memory_mib, tp.num_gpu)
                    self._take(node, cols, tp.gpu_milli, 1)
                    allocated += tp.gpu_request_milli
                    if slot is not None:
                        pend.remove(i)
                        pending_gpu -= tp.num_gpu > 0
                    heapq.heappush(heap, (t + a.lifetime_s, _DEPART, 0.0, seq, i))
                    seq += 1
                elif slot is None:
                    pend.add(i, tp.cpu_milli, tp.memory_mib, tp.num_gpu, tp.gpu_milli, t)
                    pending_gpu += tp.num_gpu > 0
                else:
                    pend.attempts[slot] += 1
                    pend.last_s[slot] = t
            if self.starvation.enabled or self.defrag.evict:
                if t >= next_sweep_s:
                    self.client.cache.reserve_for_waiting(t)
                    next_sweep_s = t + HOUSEKEEPING_S
                now = {r.node for r in self.client.cache.reservations()}
                for name in self.reserved - now:  # a reservation ended: its node is open again
                    seq = self._freed(self.row_of[name], t, pend, heap, seq)
                reservations_made += len(now - self.reserved)
                self.reserved = now
            frag_pods = pend.fragmentation_waits(self.capacity_milli - allocated) if pending_gpu else 0
            wait_now, frag_now = pending_gpu > 0, frag_pods > 0
        advance(run_s)
        self._drain(objects)
        window = max(run_s - warmup_s, 1e-9)
        arrive = np.array([a.t_s for a in arrivals])
        started_s = np.array(start_s)
        return RunResult(
            preset=preset, load=load, seed=self.seed, arrivals=n,
            allocation_pct=100.0 * acc["alloc"] / (self.capacity_milli * window),
            fragmentation_delay_pct=100.0 * acc["frag"] / window, waiting_pct=100.0 * acc["wait"] / window,
            fragmentation_waiting_pods=acc["frag_pods"] / window, waiting_gpu_pods=acc["wait_pods"] / window,
            pending=pending_stats(arrivals[:n], arrive[:n], started_s[:n], run_s, warmup_s), cycles=cycles,
            retries_skipped=skipped, seconds=time.perf_counter() - started, series=series,
            reservations_made=reservations_made, evictions_per_hour=3600.0 * evictions / window,
            moved_pending=window_waits(arrive[n:], started_s[n:], run_s, warmup_s),
            terms={mix: {k: v / term_n[mix] for k, v in sums.items()} for mix, sums in term_sums.items()})

    def _plan_evictions(self, t: float, arrivals: list[Arrival], uid_index: dict[str, int],
                        evicted_at: deque[float]) -> list[int]:
        """The defragmentation plan at ``t``, acted on as ``Defragmenter`` acts: for each step
        whose pod waited ``evict_after_s``, within ``max_evictions_per_hour`` (``evicted_at``:
        the eviction times of the last hour), its node held; the arrivals to evict."""
        policy, cache = self.defrag, self.client.cache
        while evicted_at and t - evicted_at[0] >= 3600:
            evicted_at.popleft()
        state, records, scorer = cache.defrag_snapshot()
        made = plan_defrag(state, records, scorer, node_labels={})
        holding = {r.uid for r in cache.reservations()}
        out: list[int] = []
        for step in made.steps:
            w = uid_index.get(step.uid)
            if w is None or step.uid in holding or t - arrivals[w].t_s < policy.evict_after_s:
                continue
            if len(evicted_at) + len(step.moves) > policy.max_evictions_per_hour:
                break
            if cache.hold_for(step.uid, step.node, HOLD_TTL_S, now_s=t) is None:
                continue
            out.extend(uid_index[m.uid] for m in step.moves)
            evicted_at.extend([t] * len(step.moves))
        return out

    def _drain(self, objects: dict[int, dict[str, Any]]) -> None:
        """Delete every pod through the event path; the extender must be back to empty."""
        gone = list(objects.values())
        for k in range(0, len(gone), 500):
            self.client.pod_events([{"type": "DELETED", "object": p} for p in gone[k:k + 500]])
        left = self.client.get("readyz")
        if left.get("pods") or left.get("pods_bound") or left.get("gpu_allocated_milli"):
            raise RuntimeError(f"extender not empty after deleting every pod: {left}")
