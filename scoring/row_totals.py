"""Cluster-wide integer sums kept by row version: a bind costs the node it changed, not the cluster.

A strategy's cluster-wide term (``scoring.registry.Term``) is computed at every evaluation
(``Scorer.cluster_terms``) and most are sums over every node of the state (the CPU and GPU
share in use, the wholly free GPUs by node). Between two evaluations one bind moves one row
(``ClusterState.row_version``, listed by ``ClusterState.journal``). ``RowTotals`` keeps each
row's contribution and the column sums, and at the next call recomputes the contributions
of the rows written since only, adding the difference. The contributions are int64, so the sums are exact and equal,
to the bit, to summing every row again in any order (kube-scheduler's ``noderesources``
keeps its node infos the same way: by generation, the cluster-wide sum never recounted).

A new ``ClusterState`` object (a rebuild: the node set, or a node's allocatable or GPUs,
changed) or another number of rows or columns starts from every row.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from scoring.state import ClusterState

Contributions = Callable[[ClusterState, NDArray[np.int64] | slice], NDArray[np.int64]]
"""``(state, rows) -> ndarray of shape (len(rows), c), int64``: each row's part of ``c`` sums."""


class RowTotals:
    """Column sums over a state's rows of per-row int64 contributions, kept by row version.

    One object per term and owner (a ``scoring.memo.Memo`` slot). Thread-safe.
    """

    __slots__ = ("_lock", "_per_row", "_state", "_total", "_version", "_writes")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: weakref.ref[ClusterState] | None = None
        self._version = np.zeros(0, dtype=np.int64)
        self._per_row = np.zeros((0, 0), dtype=np.int64)
        self._total = np.zeros(0, dtype=np.int64)
        self._writes = 0

    def of(self, state: ClusterState, contributions: Contributions) -> NDArray[np.int64]:
        """The column sums of ``contributions`` over every row of ``state``.

        Parameters
        ----------
        state : ClusterState
            Read only; its rows written only through ``apply`` and ``set_nvml_used_mib``
            (which bump ``row_version``).
        contributions : Contributions
            A pure function of the rows it is given; always the same one for one object.

        Returns
        -------
        ndarray of shape (c,), int64
            Read only (the object's own; the next call may change it).
        """
        with self._lock:
            return self._of(state, contributions)

    def _of(self, state: ClusterState, contributions: Contributions) -> NDArray[np.int64]:
        kept = self._state() if self._state is not None else None
        if kept is not state or self._version.shape != state.row_version.shape:
            self._per_row = np.array(contributions(state, slice(None)), dtype=np.int64)
            self._total = self._per_row.sum(axis=0)
            self._version = state.row_version.copy()
            self._state = weakref.ref(state)
            self._writes = state.journal.writes
            return self._total
        moved = state.journal.since(self._writes)
        if moved is None:  # too far behind the journal
            moved = np.flatnonzero(self._version != state.row_version)
        self._writes = state.journal.writes
        if moved.size:
            new = np.asarray(contributions(state, moved), dtype=np.int64)
            self._total = self._total + (new - self._per_row[moved]).sum(axis=0)
            self._per_row[moved] = new
            self._version[moved] = state.row_version[moved]
        return self._total
