"""Row contents: one id per distinct content of a ``ClusterState`` row, kept by row version.

A row's evaluation reads that row's arrays (``ROW_ARRAYS``), the request, the cluster-wide
terms and the state's fixed inventory summaries (``gpus_by_model``, ``gpus_by_kind``,
``memory_by_kind``), nothing else: every strategy is row-local (``scoring.strategies``), and
none but those that declare ``READS_ROW`` reads which row it scores. So two rows of the same
content get the same evaluation of one request under the same terms, to the bit, and
``scoring.incremental`` evaluates one of them. On a cluster of alike nodes that is most of
the work: nodes fill through the same contents one after another (a node taking its third
quarter-GPU notebook looks as the one before it did), and a fresh cluster's nodes are all one
content.

A content is compared in full (the bytes of every array's row), never by a hash, so two rows
share an id only when they are equal.
"""

from __future__ import annotations

import math
from dataclasses import fields

import numpy as np
from numpy.typing import NDArray

from scoring.state import ClusterState

ROW_ARRAYS: tuple[str, ...] = tuple(
    f.name for f in fields(ClusterState) if str(f.type).startswith("NDArray") and f.name != "row_version")
"""Every per-row array of a ``ClusterState`` (all of its ndarray fields but ``row_version``):
what makes a row's content."""

MAX_CONTENTS = 8192
"""Distinct contents remembered; past it the ids are forgotten and given anew (``epoch``).
A content of a node of 8 GPUs is about 1.1 KiB, so the table holds about 9 MiB plus one
content per node."""


FEW_ROWS = 4
"""Up to this many rows are read one by one (a row's views cost less than a gather per array)."""


def row_keys(state: ClusterState, rows: NDArray[np.int64]) -> list[bytes]:
    """The content of each of ``rows``: the bytes of its row of every array in ``ROW_ARRAYS``.

    Parameters
    ----------
    state : ClusterState
        Read only.
    rows : ndarray of shape (m,), int64

    Returns
    -------
    list of bytes
        ``m`` keys, equal exactly when the rows' arrays are.
    """
    m = int(rows.shape[0])
    if m == 0:
        return []
    if m <= FEW_ROWS:
        arrays = [getattr(state, name) for name in ROW_ARRAYS]
        return [b"".join([a[r].tobytes() for a in arrays]) for r in rows.tolist()]
    parts = []
    for name in ROW_ARRAYS:
        block = getattr(state, name)[rows]
        parts.append(block.reshape(m, math.prod(block.shape[1:])).view(np.uint8))
    mat = np.concatenate(parts, axis=1)
    width = int(mat.shape[1])
    raw = mat.tobytes()
    return [raw[i * width:(i + 1) * width] for i in range(m)]


class RowContents:
    """Content ids of one state's rows, recomputed only for the rows whose version moved.

    Parameters
    ----------
    max_contents : int
        ``MAX_CONTENTS`` by default; >= 1.

    Notes
    -----
    Not thread-safe: its owner (``scoring.incremental.IncrementalScorer``) calls it under its
    lock. A new state object forgets every id (model ids are positions in a state's model
    list, so equal bytes of two states need not be equal rows).
    """

    def __init__(self, max_contents: int = MAX_CONTENTS) -> None:
        self.max_contents = max_contents
        self.epoch = 0
        """Bumped whenever the ids are forgotten: ids of two epochs are not comparable."""
        self._ids: dict[bytes, int] = {}
        self._state: ClusterState | None = None
        self._row_id = np.zeros(0, dtype=np.int64)
        self._row_version = np.zeros(0, dtype=np.int64)

    def _forget(self, state: ClusterState) -> None:
        self.epoch += 1
        self._ids.clear()
        self._state = state
        self._row_id = np.full(state.n_nodes, -1, dtype=np.int64)
        self._row_version = np.full(state.n_nodes, -1, dtype=np.int64)

    def ids(self, state: ClusterState, rows: NDArray[np.int64]) -> NDArray[np.int64]:
        """The content id of each of ``rows`` (equal ids: equal contents, within one ``epoch``).

        Parameters
        ----------
        state : ClusterState
            Read only; written only through ``ClusterState.apply`` and
            ``set_nvml_used_mib`` (they bump ``row_version``).
        rows : ndarray of shape (m,), int64

        Returns
        -------
        ndarray of shape (m,), int64
            Ids in ``[0, max_contents + n_nodes)``; ``epoch`` may have moved during the call.
        """
        if state is not self._state or self._row_id.shape[0] != state.n_nodes or len(self._ids) > self.max_contents:
            self._forget(state)
        stale = rows[self._row_version[rows] != state.row_version[rows]]
        if stale.shape[0]:
            ids = self._ids
            got = [ids.setdefault(key, len(ids)) for key in row_keys(state, stale)]
            self._row_id[stale] = got
            self._row_version[stale] = state.row_version[stale]
        return self._row_id[rows]
