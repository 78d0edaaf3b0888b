"""An evaluation that costs what changed: per pod shape, every node's result kept by row version.

A node's feasibility, scores and GPU choice depend on three things only: its own row of
the ``ClusterState``, the pod's request, and the cluster-wide ``ClusterTerms`` (the learned
workload, the strategies' own terms). Every strategy is row-local (``scoring.strategies``: no term
reads another candidate). So ``IncrementalScorer`` keeps, per distinct ``PodRequest`` (the
pod's shape), the ``Evaluation`` of every row together with the ``ClusterState.row_version``
it was computed at, and answers a later pod of the same shape by recomputing only the rows
whose version moved since (between two pods, the node the first one was bound to), as the
state's journal lists them (``scoring.journal``: no pass over every row).

Rows of equal content get equal evaluations (``scoring.row_contents``): an entry keeps the
evaluation of up to ``BANK_CONTENTS`` contents it has seen, and of the rows it brings
current, or of a full evaluation, scores one row per content not kept, copying the others.
On a cluster of alike nodes (nodes fill through the same contents, a fresh cluster is one
content) most rescored rows are copies; skipped for a QoS class whose weighted strategies
read which row they score (``Scorer.reads_row``).

The cluster-wide terms move with every pod (the workload counts the pods placed and
waiting). The kept rows are scored with the terms frozen when they were computed, and the
whole store is dropped (one full evaluation per shape) when the current terms have drifted
from the frozen ones by more than ``Tolerance``: the total variation distance between the
two workloads' task-type distributions, and each strategy term's own drift (``Term.drift``:
``adaptive_balance``'s CPU pressure within the band where its score reads it,
``spare_nodes``' probabilities). With ``EXACT`` the store is dropped on any change of any,
and every evaluation is the full recomputation's to the bit
(``tests/scoring/test_incremental.py``). The memo the strategies keep between evaluations
(``scoring.memo``) is this object's too.

Memory: an entry holds the ``Evaluation`` of every row (node fits, reason, score, chosen
GPUs and their memory: about 20 + 16 * gpu_count bytes per node) plus ~2 KiB of Python
objects; entries are kept least-recently-used within ``max_bytes`` (64 MiB: every openb
shape at 10,000 nodes, or ~30,000 shapes on a small cluster).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray

from scoring.fit import ClusterTerms
from scoring.fragmentation import TaskTypes, total_variation
from scoring.memo import Memo
from scoring.registry import STRATEGIES, Term
from scoring.request import PodRequest
from scoring.row_contents import RowContents
from scoring.scorer import Evaluation, Scorer
from scoring.state import ClusterState


@dataclass(frozen=True, slots=True)
class Tolerance:
    """How far the cluster-wide terms may drift before every kept row is scored anew.

    Parameters
    ----------
    workload : float
        Largest total variation distance, in [0, 1], between the frozen and the current
        task-type distribution (``workload_drift``); 0: any change of the counts.
    terms : mapping of str to float
        Per strategy term (``Term.name``: ``cpu_pressure``, ``spare_need``), the largest
        ``Term.drift`` allowed, >= 0; a term not named here: 0, any change.

    Raises
    ------
    ValueError
        If a bound is negative, not finite, or the workload bound is above 1.
    """

    workload: float = 0.0
    terms: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if not 0.0 <= self.workload <= 1.0:
            raise ValueError(f"workload: must be in [0, 1], got {self.workload!r}")
        for name, bound in self.terms.items():
            if not 0.0 <= bound < float("inf"):
                raise ValueError(f"{name}: must be a finite number >= 0, got {bound!r}")
        object.__setattr__(self, "terms", MappingProxyType(dict(self.terms)))

    def of(self, term: str) -> float:
        """The bound of one strategy term (0 when not named)."""
        return self.terms.get(term, 0.0)


EXACT = Tolerance(0.0)
"""Drop every kept row whenever the workload or any strategy term changes at all."""

DEFAULT_TOLERANCE = Tolerance(0.01, {s.term.name: s.term.tolerance for s in STRATEGIES.values() if s.term})
"""The shipped tolerance: a 1 % move of the workload distribution, and each strategy term's
own ``TERM_TOLERANCE`` (``adaptive_balance``: 0.002 of effective CPU pressure, 2 % of its
ramp; ``spare_nodes``: 0.01 of a spare-node probability). Measured in ``benchmarks/README.md``."""


def _same_tasks(a: TaskTypes, b: TaskTypes) -> bool:
    return all(
        (x is None and y is None) or (x is not None and y is not None and np.array_equal(x, y))
        for x, y in ((a.gpu_count, b.gpu_count), (a.gpu_milli, b.gpu_milli), (a.cpu_milli, b.cpu_milli),
                     (a.memory_mib, b.memory_mib), (a.count, b.count), (a.model_mask, b.model_mask),
                     (a.gpu_memory_mib, b.gpu_memory_mib))) and a.demand == b.demand


def workload_drift(a: TaskTypes | None, b: TaskTypes | None) -> float:
    """Total variation distance between two workloads: ``1/2 * sum_k |p_a(k) - p_b(k)|``.

    The larger of the distances over the task types (popularity) and over the
    ``TaskTypes.demand`` classes (share of pods).

    Parameters
    ----------
    a, b : TaskTypes or None
        None (no GPU pod known) is at distance 1 from any workload, 0 from None.

    Returns
    -------
    float
        In [0, 1]; 0 when the task types and their popularities are the same.
    """
    if a is b:
        return 0.0
    if a is None or b is None:
        return 1.0

    def keyed(t: TaskTypes) -> dict[tuple[int, ...], float]:
        mask = t.model_mask if t.model_mask is not None else np.full(t.count.shape, -1, dtype=np.int64)
        gpu_mem = t.gpu_memory_mib if t.gpu_memory_mib is not None else np.zeros(t.count.shape, dtype=np.int64)
        keys = np.stack([t.gpu_count, t.gpu_milli, t.cpu_milli, t.memory_mib, mask, gpu_mem], axis=1).tolist()
        return dict(zip(map(tuple, keys), t.popularity.tolist(), strict=True))

    return max(total_variation(keyed(a), keyed(b)), total_variation(_demand_share(a), _demand_share(b)))


def _demand_share(t: TaskTypes) -> dict[tuple[int, ...], float]:
    if t.demand is None:
        return {}
    total = sum(c for *_, c in t.demand)
    return {(k, r, m, g): c / total for k, r, m, g, c in t.demand}


def drifted(frozen: ClusterTerms, now: ClusterTerms, tolerance: Tolerance, terms: Sequence[Term] = ()) -> bool:
    """True when ``now`` is past ``tolerance`` from ``frozen`` (exactly: differs at all when 0).

    ``terms``: the strategy terms to compare (``Scorer.terms``), each by its own ``drift``.
    """
    if frozen.whole_node_unseen != now.whole_node_unseen:  # the tie band turns off (or on)
        return True
    for term in terms:
        before, after = frozen.strategy_terms.get(term.name), now.strategy_terms.get(term.name)
        bound = tolerance.of(term.name)
        if (before != after) if bound == 0.0 else term.drift(before, after) > bound:
            return True
    if frozen.tasks is now.tasks:
        return False
    if frozen.tasks is None or now.tasks is None:
        return True
    if _same_tasks(frozen.tasks, now.tasks):  # a bind: the pod moved from waiting to placed
        return False
    return tolerance.workload == 0.0 or workload_drift(frozen.tasks, now.tasks) > tolerance.workload


_ARRAYS = ("node_fits", "reason", "score", "chosen_cols", "chosen_mem_mib", "gpu_mem_max_mib", "tie_rank")
"""The per-row fields of an ``Evaluation`` that an entry keeps current (``rows`` is fixed)."""


ENTRY_OVERHEAD_BYTES = 2048
"""What an entry costs besides its arrays' data (the Python objects): counted, so that many
shapes on a small cluster (every pod is untrusted input: any CPU and memory request is a
new shape) stay within the budget too."""


def _nbytes(ev: Evaluation) -> int:
    return ENTRY_OVERHEAD_BYTES + sum(int(getattr(ev, f).nbytes) for f in _ARRAYS)


_A = TypeVar("_A", bound=np.generic)


def _splice(ev: Evaluation, rows: NDArray[np.int64], part: Evaluation, copy: bool) -> Evaluation:
    """``ev`` (of every row, in row order) with ``rows`` replaced by ``part`` (of those rows)."""
    def put(whole: NDArray[_A], new: NDArray[_A]) -> NDArray[_A]:
        out = whole.copy() if copy else whole
        out[rows] = new
        return out

    return Evaluation(ev.request, ev.rows, put(ev.node_fits, part.node_fits), put(ev.reason, part.reason),
                      put(ev.score, part.score), put(ev.chosen_cols, part.chosen_cols),
                      put(ev.chosen_mem_mib, part.chosen_mem_mib), put(ev.gpu_mem_max_mib, part.gpu_mem_max_mib),
                      put(ev.tie_rank, part.tie_rank), tie_band=part.tie_band)


BANK_CONTENTS = 256
"""Row contents whose evaluation an entry keeps (``_Bank``); when full it starts anew."""


class _Bank:
    """The evaluation of one shape for up to ``BANK_CONTENTS`` row contents, by content id."""

    __slots__ = ("arrays", "epoch", "slot", "tie_band")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.slot: dict[int, int] = {}
        self.arrays: list[NDArray[Any]] = []
        self.tie_band = 0.0

    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays)

    def clear(self, epoch: int) -> None:
        self.epoch = epoch
        self.slot.clear()

    def put(self, ids: NDArray[np.int64], part: Evaluation) -> bool:
        """Keep ``part``'s rows as the evaluations of contents ``ids`` (what fits); whether
        the bank grew."""
        if len(self.slot) + ids.shape[0] > BANK_CONTENTS:
            self.slot.clear()
        n = min(int(ids.shape[0]), BANK_CONTENTS)
        at = len(self.slot)
        room = int(self.arrays[0].shape[0]) if self.arrays else 0
        grew = at + n > room
        if grew:  # by doubling, up to BANK_CONTENTS
            size = min(BANK_CONTENTS, max(at + n, 2 * room, 8))
            fresh = [np.zeros((size, *getattr(part, f).shape[1:]), dtype=getattr(part, f).dtype) for f in _ARRAYS]
            for new, kept in zip(fresh, self.arrays, strict=False):
                new[:at] = kept[:at]
            self.arrays = fresh
        for kept, f in zip(self.arrays, _ARRAYS, strict=True):
            kept[at:at + n] = getattr(part, f)[:n]
        self.slot.update(zip(ids[:n].tolist(), range(at, at + n), strict=True))
        self.tie_band = part.tie_band
        return grew


def _assembled(request: PodRequest, rows: NDArray[np.int64], arrays: list[NDArray[Any]], tie_band: float) -> Evaluation:
    """An evaluation of ``rows`` from its ``_ARRAYS`` fields, in that order."""
    fits, reason, score, cols, mem, mem_max, rank = arrays
    return Evaluation(request, rows, fits, reason, score, cols, mem, mem_max, rank, tie_band=tie_band)


@dataclass(slots=True)
class _Entry:
    evaluation: Evaluation
    versions: NDArray[np.int64]
    writes: int
    """``ClusterState.journal.writes`` when ``versions`` were last brought current."""
    nbytes: int
    shared: bool = False
    """The evaluation's arrays were handed out: copy them before the next splice."""
    bank: _Bank | None = None
    """Evaluations by row content (None: the shape's strategies read which row they score)."""


@dataclass(slots=True)
class IncrementalStats:
    """Counters, for metrics and the benchmarks.

    Attributes
    ----------
    evaluations : int
    full : int
        Evaluations that brought every row (a new shape, a new state, or drifted terms).
    rows_rescored : int
        Rows brought current by the other evaluations (those whose version moved).
    rows_copied : int
        Rows of either kind not scored but copied from a row of the same content
        (``scoring.row_contents``).
    term_refreshes : int
        Times the cluster-wide terms drifted past the tolerance and every entry was dropped.
    """

    evaluations: int = 0
    full: int = 0
    rows_rescored: int = 0
    rows_copied: int = 0
    term_refreshes: int = 0


@dataclass(eq=False)
class IncrementalScorer:
    """``Scorer.evaluate`` that rescores only the rows that changed since the same shape's last.

    Parameters
    ----------
    scorer : Scorer
    tolerance : Tolerance
        How stale the cluster-wide terms may get (``EXACT`` by default).
    max_bytes : int
        Memory budget of the kept entries, bytes (least recently used dropped first); at
        least one entry is always kept.

    Notes
    -----
    The state must be written only through ``ClusterState.apply`` and
    ``ClusterState.set_nvml_used_mib`` (they bump ``row_version``); a new state object
    (a rebuild) drops every entry. Thread-safe.
    """

    scorer: Scorer
    tolerance: Tolerance = EXACT
    max_bytes: int = 64 * 2**20
    stats: IncrementalStats = field(default_factory=IncrementalStats)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _state: ClusterState | None = field(default=None, repr=False)
    _terms: ClusterTerms | None = field(default=None, repr=False)
    _entries: OrderedDict[PodRequest, _Entry] = field(default_factory=OrderedDict, repr=False)
    _bytes: int = field(default=0, repr=False)
    memo: Memo = field(default_factory=Memo, repr=False)
    """What the strategies keep between this scorer's evaluations (``scoring.memo``)."""
    _contents: RowContents = field(default_factory=RowContents, repr=False)

    def evaluate(self, state: ClusterState, request: PodRequest, rows: NDArray[np.int64]) -> Evaluation:
        """As ``Scorer.evaluate(state, request, rows)``, with the kept rows' cluster terms.

        Parameters
        ----------
        state : ClusterState
            Read only.
        request : PodRequest
        rows : ndarray of shape (m,), int64

        Returns
        -------
        Evaluation
            Rows in the order of ``rows``; the caller may keep it (later evaluations never
            write into arrays handed out).
        """
        rows = np.asarray(rows, dtype=np.int64)
        with self._lock:
            self.stats.evaluations += 1
            now = self.scorer.cluster_terms(state, self.memo)
            if state is not self._state or self._terms is None or drifted(
                    self._terms, now, self.tolerance, self.scorer.terms):
                if state is self._state and self._terms is not None:
                    self.stats.term_refreshes += 1
                self._state, self._terms = state, now
                self._entries.clear()
                self._bytes = 0
            entry = self._current(state, request)
            n = state.n_nodes
            if rows.shape[0] == n and (n == 0 or (rows[0] == 0 and bool((np.diff(rows) == 1).all()))):
                entry.shared = True
                return entry.evaluation
            return entry.evaluation.take(rows)

    def _current(self, state: ClusterState, request: PodRequest) -> _Entry:
        """The entry of ``request``, brought to the state's row versions."""
        entry = self._entries.get(request)
        if entry is None:
            self.stats.full += 1
            bank = None if self.scorer.reads_row(request.qos) else _Bank(self._contents.epoch)
            ev, _ = self._evaluate(state, request, np.arange(state.n_nodes, dtype=np.int64), bank)
            ev = replace(ev, context=None)  # the context is the bulk of the memory; the verbs do not read it
            entry = _Entry(ev, state.row_version.copy(), state.journal.writes, 0, bank=bank)
            self._entries[request] = entry
            self._charge(entry)
            return entry
        self._entries.move_to_end(request)
        stale = state.journal.since(entry.writes)
        if stale is None:  # further behind than the journal holds
            stale = np.flatnonzero(entry.versions != state.row_version)
        entry.writes = state.journal.writes
        if stale.size:
            self.stats.rows_rescored += int(stale.size)
            part, grew = self._evaluate(state, request, stale, entry.bank)
            entry.evaluation = _splice(entry.evaluation, stale, part, copy=entry.shared)
            entry.versions[stale] = state.row_version[stale]
            entry.shared = False
            if grew:
                self._charge(entry)
        return entry

    def _evaluate(self, state: ClusterState, request: PodRequest, rows: NDArray[np.int64],
                  bank: _Bank | None) -> tuple[Evaluation, bool]:
        """``rows`` evaluated with the frozen terms, one row per content not in ``bank``
        (which keeps the new ones); and whether the bank grew."""
        assert self._terms is not None
        if bank is None:
            return self.scorer.evaluate(state, request, rows, self._terms, self.memo), False
        ids = self._contents.ids(state, rows)
        if bank.epoch != self._contents.epoch:
            bank.clear(self._contents.epoch)
        ids_list = ids.tolist()
        slots = (np.array([bank.slot.get(i, -1) for i in ids_list], dtype=np.int64) if bank.slot
                 else np.full(len(ids_list), -1, dtype=np.int64))  # a new shape's full pass: none kept yet
        missed = np.flatnonzero(slots < 0)
        m = rows.shape[0]
        if missed.size == 0:
            self.stats.rows_copied += m
            return _assembled(request, rows, [kept[slots] for kept in bank.arrays], bank.tie_band), False
        if missed.size == m and len(set(ids_list)) == m:  # every row a content of its own, none kept
            part = self.scorer.evaluate(state, request, rows, self._terms, self.memo)
            return part, bank.put(ids, part)
        new, first, inverse = np.unique(ids[missed], return_index=True, return_inverse=True)
        part = self.scorer.evaluate(state, request, rows[missed[first]], self._terms, self.memo)
        self.stats.rows_copied += m - int(new.shape[0])
        hit = np.flatnonzero(slots >= 0)
        whole = []
        for i, f in enumerate(_ARRAYS):
            scored = getattr(part, f)
            out = np.empty((m, *scored.shape[1:]), dtype=scored.dtype)
            out[missed] = scored[inverse.reshape(-1)]
            if hit.size:
                out[hit] = bank.arrays[i][slots[hit]]
            whole.append(out)
        grew = bank.put(new, part)
        return _assembled(request, rows, whole, part.tie_band), grew

    def _charge(self, entry: _Entry) -> None:
        """Count ``entry``'s bytes anew and drop the least recently used entries past ``max_bytes``."""
        size = _nbytes(entry.evaluation) + (entry.bank.nbytes() if entry.bank is not None else 0)
        self._bytes += size - entry.nbytes
        entry.nbytes = size
        while self._bytes > self.max_bytes and len(self._entries) > 1:
            _, old = self._entries.popitem(last=False)
            self._bytes -= old.nbytes
