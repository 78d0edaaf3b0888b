"""The extender's cache: every node's GPUs and every pod's allocation, as one ``ClusterState``.

Two inputs change it, and only two: node events (``set_nodes``/``upsert_node``/``remove_node``)
and pod events (``apply_pod_event``, fed by the Kubernetes pod watch in cluster mode and by
the standalone pod-event endpoint otherwise), plus ``bind``, which records the allocation
gpufrac chose. Reads (filter, prioritize) go through ``evaluate`` under the same lock, so a
request never sees a half-applied change.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from extender import translate
from extender.translate import PodIntent
from scoring.fit import Reason, gpu_memory_request_mib
from scoring.state import Allocation, ClusterState, NodeSpec
from scoring.strategies import Evaluation, Scorer

log = logging.getLogger(__name__)

EventType = Literal["ADDED", "MODIFIED", "DELETED"]


class BindError(Exception):
    """Bind refused; the message goes to kube-scheduler in ``ExtenderBindingResult.Error``."""


@dataclass(frozen=True, slots=True)
class PodRecord:
    """A pod the cache knows, and what it holds (``allocation`` is None while pending)."""

    intent: PodIntent
    allocation: Allocation | None = None
    gpu_uuids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CandidateEvaluation:
    """Evaluation of one pod on the known candidates, plus the names the cache lacks."""

    names: list[str]
    """Known candidate names, aligned with ``evaluation`` rows."""
    unknown: list[str]
    evaluation: Evaluation


@dataclass(slots=True)
class _Candidates:
    """A node-name list as resolved against the state (valid until the node set changes)."""

    names: list[str]
    rows: np.ndarray
    unknown: list[str]
    known: list[str]
    pos: dict[str, int] | None = None

    def positions(self, names: Sequence[str]) -> np.ndarray | None:
        """Positions of ``names`` in ``known``; None if any is not there."""
        if self.pos is None:
            self.pos = {n: i for i, n in enumerate(self.known)}
        get = self.pos.get
        out = np.fromiter((get(n, -1) for n in names), dtype=np.int64, count=len(names))
        return out if (out >= 0).all() else None


class GpuCache:
    """Thread-safe owner of the cluster arrays and pod allocations."""

    def __init__(self, scorer: Scorer) -> None:
        self._lock = threading.RLock()
        self._scorer = scorer
        self._nodes: dict[str, NodeSpec] = {}
        self._state = ClusterState.from_nodes([])
        self._pods: dict[str, PodRecord] = {}
        # Memo of the last evaluation: kube-scheduler calls prioritize right after filter with
        # a subset of the same candidates, and node scores do not depend on the candidate set.
        # Any change to the state or the scorer bumps ``_generation`` and invalidates it.
        self._generation = 0
        self._memo: tuple[int, PodIntent, _Candidates, CandidateEvaluation] | None = None
        # kube-scheduler sends the same node list call after call: remember its rows.
        self._candidates: _Candidates | None = None

    # -- configuration -------------------------------------------------------------------

    def set_scorer(self, scorer: Scorer) -> None:
        """Swap the scorer (config reload); later requests use it."""
        with self._lock:
            self._scorer = scorer
            self._generation += 1

    # -- node events ---------------------------------------------------------------------

    def set_nodes(self, nodes: Sequence[NodeSpec]) -> None:
        """Replace the node set; allocations on nodes that are gone are dropped."""
        with self._lock:
            self._nodes = {n.name: n for n in nodes}
            self._rebuild()

    def upsert_node(self, node: NodeSpec) -> None:
        """Add a node or replace its spec (inventory or allocatable changed)."""
        with self._lock:
            if self._nodes.get(node.name) == node:
                return
            self._nodes[node.name] = node
            self._rebuild()

    def remove_node(self, name: str) -> None:
        """Forget a node and the allocations on it."""
        with self._lock:
            if self._nodes.pop(name, None) is not None:
                self._rebuild()

    def _rebuild(self) -> None:
        state = ClusterState.from_nodes(sorted(self._nodes.values(), key=lambda n: n.name))
        self._candidates = None
        for uid, rec in list(self._pods.items()):
            alloc = rec.allocation
            if alloc is None:
                continue
            if alloc.node not in state.node_index:
                log.info("node gone, dropping allocation", extra={"pod": rec.intent.key})
                self._pods[uid] = replace(rec, allocation=None, gpu_uuids=())
                continue
            if rec.gpu_uuids:
                # Columns may move when a node's GPU list changes: re-resolve by UUID.
                cols = self._cols_for_uuids(state, alloc.node, rec.gpu_uuids)
                if cols is None:
                    self._pods[uid] = replace(rec, allocation=None, gpu_uuids=())
                    continue
                alloc = replace(alloc, gpu_cols=cols)
                self._pods[uid] = replace(rec, allocation=alloc)
            state.apply(alloc)
        self._state = state
        self._generation += 1

    @staticmethod
    def _cols_for_uuids(state: ClusterState, node: str, uuids: Iterable[str]) -> tuple[int, ...] | None:
        row_uuids = state.gpu_uuid[state.node_index[node]]
        try:
            return tuple(row_uuids.index(u) for u in uuids)
        except ValueError:
            return None

    # -- pod events ----------------------------------------------------------------------

    def apply_pod_event(self, event: EventType, intent: PodIntent) -> None:
        """The one path by which the cache learns of pods it did not bind itself.

        ``DELETED`` or a finished pod frees what it held. A bound pod (``node_name`` set)
        not yet accounted for is accounted for: its GPUs from ``gpufrac.io/assigned-gpus``,
        its CPU and memory always. A pending pod is remembered so that ``bind`` can place it.
        Replaying the same event twice changes nothing.
        """
        with self._lock:
            old = self._pods.get(intent.uid)
            if event == "DELETED" or intent.finished:
                if old is not None:
                    self._release(old)
                    del self._pods[intent.uid]
                    self._generation += 1
                return
            if old is not None and old.allocation is not None:
                if old.allocation.node == intent.node_name or not intent.node_name:
                    self._pods[intent.uid] = replace(old, intent=intent)
                    return
                self._release(old)  # moved (deleted and recreated with the same UID)
            rec = PodRecord(intent)
            if intent.node_name and intent.node_name in self._state.node_index:
                rec = self._account(intent)
                self._generation += 1
            elif old is not None and old.allocation is not None:
                self._generation += 1  # released above
            self._pods[intent.uid] = rec

    def _account(self, intent: PodIntent) -> PodRecord:
        state, node = self._state, intent.node_name
        cols: tuple[int, ...] = ()
        uuids: tuple[str, ...] = ()
        mem: tuple[int, ...] = ()
        if intent.gpu_count and intent.assigned_gpus:
            found = self._cols_for_uuids(state, node, intent.assigned_gpus)
            if found is None:
                log.warning("assigned GPUs not on node; counting CPU and memory only",
                            extra={"pod": intent.key, "node": node})
            else:
                cols, uuids = found, intent.assigned_gpus
                row = state.node_index[node]
                req = translate.pod_request(intent, state)
                per_gpu = gpu_memory_request_mib(req, state.gpu_mem_total_mib[row, list(cols)][None, :])
                mem = tuple(int(x) for x in per_gpu[0])
        alloc = Allocation(node, cols, intent.gpu_milli if cols else 0, mem, intent.qos,
                           intent.cpu_milli, intent.memory_mib)
        state.apply(alloc)
        return PodRecord(intent, alloc, uuids)

    def _release(self, rec: PodRecord) -> None:
        if rec.allocation is not None:
            self._state.apply(rec.allocation, sign=-1)

    # -- scheduling ----------------------------------------------------------------------

    def evaluate(self, intent: PodIntent, names: Sequence[str]) -> CandidateEvaluation:
        """Score ``intent`` on the named nodes (no change to the allocations).

        Repeated calls for the same pod with no state change in between (filter, then
        prioritize on a subset) reuse the previous evaluation.
        """
        with self._lock:
            memo = self._memo
            if memo is not None and memo[0] == self._generation and memo[1] == intent:
                positions = memo[2].positions(names)
                if positions is not None:
                    return CandidateEvaluation(list(names), [], memo[3].evaluation.take(positions))
            state = self._state
            cand = self._candidates
            if cand is None or cand.names != names:
                rows, unknown = translate.rows_for_names(state, names)
                known = list(names) if not unknown else [state.node_names[r] for r in rows.tolist()]
                cand = self._candidates = _Candidates(list(names), rows, unknown, known)
            request = translate.pod_request(intent, state)
            ev = self._scorer.evaluate(state, request, cand.rows)
            result = CandidateEvaluation(cand.known, cand.unknown, ev)
            self._memo = (self._generation, intent, cand, result)
            return result

    def bind(self, uid: str, namespace: str, name: str, node: str) -> PodRecord:
        """Choose the GPUs for a pending pod on ``node`` and record the allocation.

        Raises
        ------
        BindError
            If the pod or node is unknown, the pod is bound elsewhere, or it no longer fits.
        """
        with self._lock:
            rec = self._pods.get(uid)
            if rec is None:
                raise BindError(f"gpufrac: pod {namespace}/{name} (uid {uid}) unknown: no pod event seen")
            if rec.allocation is not None:
                if rec.allocation.node == node:
                    return rec
                raise BindError(f"gpufrac: pod {namespace}/{name} already bound to {rec.allocation.node}")
            state = self._state
            if node not in state.node_index:
                raise BindError(f"gpufrac: node {node!r} not in gpufrac's cache")
            row = state.node_index[node]
            request = translate.pod_request(rec.intent, state)
            ev = self._scorer.evaluate(state, request, np.array([row], dtype=np.int64))
            if not ev.context.node_fits[0]:
                msg = translate.reason_message(Reason(int(ev.context.reason[0])), request, rec.intent)
                raise BindError(f"{msg} (at bind, on {node})")
            cols = tuple(int(c) for c in ev.chosen_cols[0])
            mem = tuple(int(ev.context.mem_req_mib[0, c]) for c in cols)
            alloc = Allocation(node, cols, request.gpu_milli if cols else 0, mem, request.qos,
                               request.cpu_milli, request.memory_mib)
            uuids = tuple(state.gpu_uuid[row][c] for c in cols)
            state.apply(alloc)
            self._generation += 1
            bound = PodRecord(replace(rec.intent, node_name=node, assigned_gpus=uuids), alloc, uuids)
            self._pods[uid] = bound
            return bound

    # -- reads ---------------------------------------------------------------------------

    def allocations(self) -> list[dict[str, object]]:
        """Every bound pod's allocation, for ``/allocations`` and the replay's placements."""
        with self._lock:
            state = self._state
            out: list[dict[str, object]] = []
            for rec in self._pods.values():
                a = rec.allocation
                if a is None:
                    continue
                row = state.node_index[a.node]
                out.append({
                    "uid": rec.intent.uid,
                    "namespace": rec.intent.namespace,
                    "name": rec.intent.name,
                    "node": a.node,
                    "gpu_indices": [int(state.gpu_index[row, c]) for c in a.gpu_cols],
                    "gpu_uuids": list(rec.gpu_uuids),
                    "gpu_milli": a.gpu_milli,
                    "gpu_memory_mib": list(a.gpu_memory_mib),
                    "qos": a.qos.wire_name,
                    "cpu_milli": a.cpu_milli,
                    "memory_mib": a.memory_mib,
                })
            return out

    def summary(self) -> dict[str, int]:
        """Totals for metrics and readiness: nodes, GPUs, allocated milli, pods."""
        with self._lock:
            s = self._state
            return {
                "nodes": s.n_nodes,
                "gpus": int(s.gpu_exists.sum()),
                "gpu_allocated_milli": int(s.gpu_used_milli.sum()),
                "pods": len(self._pods),
                "pods_bound": sum(1 for r in self._pods.values() if r.allocation is not None),
            }

    def state_copy(self) -> ClusterState:
        """A deep copy of the arrays (for tests and inspection)."""
        with self._lock:
            return self._state.copy()
