"""``RowJournal`` lists the rows whose version moved; ``RowTotals`` kept by it equal the full sums."""

from __future__ import annotations

import math

import numpy as np

from scoring import journal
from scoring.memo import Memo
from scoring.request import QoSClass
from scoring.row_totals import RowTotals
from scoring.specs import Allocation
from scoring.state import ClusterState
from scoring.strategies import adaptive_balance, spare_nodes
from tests.randstate import random_state


def write(st: ClusterState, rng: np.random.Generator, held: list[Allocation]) -> None:
    """One write of a kind a running extender makes: a pod bound, a pod gone, an agent's heartbeat."""
    r = rng.random()
    if r < 0.15:
        row = int(rng.integers(st.n_nodes))
        st.set_nvml_used_mib(row, [int(x) for x in rng.integers(0, 4096, st.max_gpus)])
    elif r < 0.4 and held:
        st.apply(held.pop(int(rng.integers(len(held)))), sign=-1)
    else:
        row = int(rng.integers(st.n_nodes))
        free = np.flatnonzero(st.gpu_exists[row] & (st.gpu_used_milli[row] <= 500) & (st.gpu_slots_free[row] > 0))
        cols = (int(free[0]),) if free.size and rng.random() < 0.8 else ()
        alloc = Allocation(st.node_names[row], cols, 500 if cols else 0, (1024,) * len(cols),
                           QoSClass.BURSTABLE, int(rng.integers(0, 2)) * 500, 0)
        st.apply(alloc)
        held.append(alloc)


def test_since_is_the_rows_whose_version_moved(rng: np.random.Generator) -> None:
    st = random_state(rng, 30)
    held: list[Allocation] = []
    readers: list[tuple[int, np.ndarray]] = []  # (writes seen, row versions then)
    for step in range(3 * journal.CAPACITY):
        if step % 97 == 0:
            readers.append((st.journal.writes, st.row_version.copy()))
        write(st, rng, held)
        if step % 53 == 0:
            for seen, versions in readers:
                got = st.journal.since(seen)
                if st.journal.writes - seen > journal.CAPACITY:
                    assert got is None
                else:
                    assert got is not None and got.tolist() == np.flatnonzero(versions != st.row_version).tolist()
    nothing = st.journal.since(st.journal.writes)
    assert nothing is not None and nothing.tolist() == []
    assert st.journal.since(st.journal.writes + 1) is None  # not a number this journal gave


def test_row_totals_equal_the_full_sums_after_any_writes(rng: np.random.Generator) -> None:
    st = random_state(rng, 30)
    memo = Memo()
    held: list[Allocation] = []

    def sums(state: ClusterState, rows: np.ndarray | slice) -> np.ndarray:
        paths.add("every" if isinstance(rows, slice) else "many")
        return np.stack([state.cpu_used_milli[rows], state.gpu_used_milli[rows].sum(axis=1)], axis=1)

    def one(state: ClusterState, row: int) -> list[int]:
        paths.add("one")
        return [int(state.cpu_used_milli[row]), int(state.gpu_used_milli[row].sum())]

    totals = RowTotals()
    paths: set[str] = set()
    for step in range(2 * journal.CAPACITY + 50):
        write(st, rng, held)
        if rng.random() < 0.1 or step > 2 * journal.CAPACITY:  # a write behind, a few, many, too many
            assert list(totals.of(st, sums, one)) == sums(st, slice(None)).sum(axis=0).tolist(), step
            assert adaptive_balance.cluster_term(st, memo)[0] == adaptive_balance.effective_pressure(
                adaptive_balance.cpu_pressure(st))
            assert spare_nodes.cluster_term(st, memo) == spare_nodes.cluster_term(st, Memo())  # kept == afresh
    other = st.copy()  # another state object: counted from every row
    write(other, rng, [])
    assert list(totals.of(other, sums, one)) == sums(other, slice(None)).sum(axis=0).tolist()
    assert paths == {"every", "many", "one"}  # from scratch, as arrays, row by row


def test_spare_need_counts_slots_from_the_nodes_by_free_gpus() -> None:
    # Nodes with 0, 3, 5 and 8 wholly free GPUs: E_2 = 0 + 1 + 2 + 4 = 7 two-GPU slots, E_8 = 1.
    by_free = np.bincount([0, 3, 5, 8], minlength=9).tolist()
    need = dict(spare_nodes.spare_need({2: 4000, 8: 16000}, 16000.0, by_free))
    mu2, mu8 = 4000 / 20000 * 16000 / 2000, 16000 / 20000 * 16000 / 8000
    assert need[2] == 0.5 * math.erfc((7 - 0.5 - mu2) / math.sqrt(2 * mu2))
    assert need[8] == 0.5 * math.erfc((1 - 0.5 - mu8) / math.sqrt(2 * mu8))
