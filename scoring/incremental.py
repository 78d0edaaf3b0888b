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
read which row they score (``Scorer.reads_row``), and paused where they copy next to nothing
(``BANK_MIN_COPIED``: a busy cluster of mixed pods, whose nodes seldom share a content).

The cluster-wide terms move with every pod (the workload counts the pods placed and
waiting). The kept rows are scored with the terms frozen when they were computed, and the
whole store is dropped (one full evaluation per shape) when the current terms have drifted
from the frozen ones by more than ``Tolerance`` (``scoring.drift``: the total variation
distance between the two workloads' task-type distributions, and each strategy term's own
drift, ``Term.drift``: ``adaptive_balance``'s CPU pressure within the band where its score
reads it, ``spare_nodes``' probabilities). With ``EXACT`` the store is dropped on any change of any,
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
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray

from scoring.drift import EXACT, DriftWatch, Tolerance
from scoring.evaluated import Evaluation
from scoring.fit import ClusterTerms
from scoring.memo import Memo
from scoring.request import PodRequest
from scoring.row_contents import RowContents
from scoring.scorer import Scorer
from scoring.state import ClusterState

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

BANK_PROBE_ROWS = 4096
"""Rows through the banks over which the share they copied is counted."""

BANK_MIN_COPIED = 1 / 32
"""Below this share of the probe's rows copied, the banks are skipped for ``BANK_PAUSE``
evaluations (then probed again): where nodes seldom share a content (a busy cluster of mixed
pods) the content ids cost about 0.1 ms an evaluation at 5,000 nodes and copy nothing.
Skipping changes no result: a copied row is the scored row's to the bit."""

BANK_PAUSE = 1024
"""Evaluations without the banks after a probe that found them useless."""


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
    bank_pauses : int
        Probes after which the banks were skipped (``BANK_MIN_COPIED``).
    """

    evaluations: int = 0
    full: int = 0
    rows_rescored: int = 0
    rows_copied: int = 0
    term_refreshes: int = 0
    bank_pauses: int = 0


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
    _every: NDArray[np.int64] | None = field(default=None, repr=False)
    _watch: DriftWatch = field(init=False, repr=False)
    _probe_rows: int = field(default=0, repr=False)
    """Rows through the banks since the last probe."""
    _probe_copied: int = field(default=0, repr=False)
    """Of those, rows copied."""
    _paused: int = field(default=0, repr=False)
    """Evaluations left without the banks (``BANK_PAUSE``)."""

    def __post_init__(self) -> None:
        self._watch = DriftWatch(self.tolerance, self.scorer.terms)

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
            if self._paused:
                self._paused -= 1
            now = self.scorer.cluster_terms(state, self.memo)
            if state is not self._state or self._terms is None or self._watch.drifted(self._terms, now):
                if state is self._state and self._terms is not None:
                    self.stats.term_refreshes += 1
                self._state, self._terms = state, now
                self._watch.freeze(now)
                self._entries.clear()
                self._bytes = 0
            entry = self._current(state, request)
            if self._every_row(state, rows):
                entry.shared = True
                return entry.evaluation
            return entry.evaluation.take(rows)

    def _every_row(self, state: ClusterState, rows: NDArray[np.int64]) -> bool:
        """Whether ``rows`` is every row of ``state`` in order; a read-only array found so
        is remembered (the extender's candidate rows, the same object at every filter while
        kube-scheduler sends the same names), so that it is not read again."""
        n = state.n_nodes
        if rows is self._every and rows.shape[0] == n:
            return True
        if rows.shape[0] != n or (n and (rows[0] != 0 or not bool((np.diff(rows) == 1).all()))):
            return False
        self._every = None if rows.flags.writeable else rows
        return True

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
        if bank is None or self._paused or rows.shape[0] == 0:  # no rows: nothing to keep (an empty bank has no arrays)
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
            self._copied(m, m)
            return _assembled(request, rows, [kept[slots] for kept in bank.arrays], bank.tie_band), False
        if missed.size == m and len(set(ids_list)) == m:  # every row a content of its own, none kept
            self._copied(m, 0)
            part = self.scorer.evaluate(state, request, rows, self._terms, self.memo)
            return part, bank.put(ids, part)
        new, first, inverse = np.unique(ids[missed], return_index=True, return_inverse=True)
        part = self.scorer.evaluate(state, request, rows[missed[first]], self._terms, self.memo)
        self._copied(m, m - int(new.shape[0]))
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

    def _copied(self, rows: int, copied: int) -> None:
        """Count ``rows`` through a bank, ``copied`` of them copied; pause the banks after a
        probe that copied too few (``BANK_MIN_COPIED``)."""
        self.stats.rows_copied += copied
        self._probe_rows += rows
        self._probe_copied += copied
        if self._probe_rows >= BANK_PROBE_ROWS:
            if self._probe_copied < BANK_MIN_COPIED * self._probe_rows:
                self._paused = BANK_PAUSE
                self.stats.bank_pauses += 1
            self._probe_rows = self._probe_copied = 0

    def _charge(self, entry: _Entry) -> None:
        """Count ``entry``'s bytes anew and drop the least recently used entries past ``max_bytes``."""
        size = _nbytes(entry.evaluation) + (entry.bank.nbytes() if entry.bank is not None else 0)
        self._bytes += size - entry.nbytes
        entry.nbytes = size
        while self._bytes > self.max_bytes and len(self._entries) > 1:
            _, old = self._entries.popitem(last=False)
            self._bytes -= old.nbytes
