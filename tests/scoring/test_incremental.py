"""``IncrementalScorer``: the kept rows equal a full recomputation (exactly, or with the frozen terms)."""

from __future__ import annotations

import inspect
from dataclasses import replace

import numpy as np
import pytest

from scoring import gaps, incremental, strategies, utilization
from scoring.drift import EXACT, Tolerance, drifted, workload_drift
from scoring.evaluated import Evaluation
from scoring.fit import ClusterTerms
from scoring.fragmentation import TaskTypes
from scoring.incremental import IncrementalScorer
from scoring.presets import PRESETS
from scoring.request import PodRequest, QoSClass
from scoring.scorer import build_scorer
from scoring.specs import Allocation
from scoring.state import ClusterState
from scoring.strategies import adaptive_balance, spare_nodes
from tests.conftest import gpu_node
from tests.randstate import random_state

MENU = [PodRequest(1, 250, cpu_milli=2000, memory_mib=4096), PodRequest(1, 500, cpu_milli=4000, memory_mib=8192),
        PodRequest(1, 750, cpu_milli=1000, memory_mib=2048), PodRequest(2, 1000, cpu_milli=8000, memory_mib=16384),
        PodRequest(1, 1000, cpu_milli=4000, memory_mib=8192, qos=QoSClass.GUARANTEED),
        PodRequest(0, cpu_milli=2000, memory_mib=1024)]


def cluster() -> ClusterState:
    return ClusterState.from_nodes([gpu_node(f"n{i:02d}", (8, 4, 2)[i % 3], model=("T4", "A10")[i % 2])
                                    for i in range(24)])


def same(a: Evaluation, b: Evaluation) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in
               ("rows", "node_fits", "reason", "score", "chosen_cols", "chosen_mem_mib", "gpu_mem_max_mib"))


def place(st: ClusterState, ev: Evaluation, pos: int) -> Allocation:
    req = ev.request
    alloc = Allocation(st.node_names[int(ev.rows[pos])], tuple(int(c) for c in ev.chosen_cols[pos]),
                       req.gpu_milli if req.gpu_count else 0, tuple(int(m) for m in ev.chosen_mem_mib[pos]),
                       req.qos, req.cpu_milli, req.memory_mib)
    st.apply(alloc)
    return alloc


@pytest.mark.parametrize("preset", ["default", "balance"])
def test_exact_tolerance_is_the_full_recomputation_to_the_bit(rng: np.random.Generator, preset: str) -> None:
    # Pods of six shapes are placed and some released at random; before each placement the
    # incremental evaluation (all rows, and a shuffled subset) equals Scorer.evaluate's.
    scorer = build_scorer(PRESETS[preset])
    inc = IncrementalScorer(scorer, EXACT)
    st = cluster()
    held: list[Allocation] = []
    for step in range(120):
        req = MENU[int(rng.integers(len(MENU)))]
        rows = np.arange(st.n_nodes, dtype=np.int64)
        got, want = inc.evaluate(st, req, rows), scorer.evaluate(st, req, rows)
        assert same(got, want), step
        subset = rng.permutation(st.n_nodes)[: st.n_nodes // 2]
        assert same(inc.evaluate(st, req, subset), scorer.evaluate(st, req, subset)), step
        best = got.best()
        if best >= 0:
            held.append(place(st, got, best))
        if held and rng.random() < 0.25:
            st.apply(held.pop(int(rng.integers(len(held)))), sign=-1)
    # The workload moved with (nearly) every placement: exact mode refreshed that often.
    assert inc.stats.term_refreshes > 60
    assert inc.stats.evaluations == 240


def test_unchanged_terms_rescore_only_the_rows_that_moved() -> None:
    # An agent heartbeat (NVML's used memory) changes one row and no cluster-wide term: the
    # next evaluation of a kept shape rescores that row alone.
    scorer = build_scorer(PRESETS["default"])
    inc = IncrementalScorer(scorer, EXACT)
    st = cluster()
    place(st, scorer.evaluate(st, MENU[0], np.arange(st.n_nodes)), 0)  # a workload exists
    req, rows = MENU[4], np.arange(st.n_nodes, dtype=np.int64)
    inc.evaluate(st, req, rows)
    assert (inc.stats.full, inc.stats.rows_rescored) == (1, 0)
    st.set_nvml_used_mib(3, [15000] * 8)  # node 3's GPUs busy: guaranteed pods no longer fit there
    got = inc.evaluate(st, req, rows)
    assert (inc.stats.full, inc.stats.rows_rescored) == (1, 1)
    assert same(got, scorer.evaluate(st, req, rows))
    assert not got.node_fits[3]


def test_within_tolerance_rows_are_scored_with_the_frozen_terms(rng: np.random.Generator) -> None:
    # A loose tolerance keeps the terms of the first evaluation; every row (kept or rescored)
    # then equals a full evaluation with those frozen terms, not with the current ones.
    scorer = build_scorer(PRESETS["default"])
    inc = IncrementalScorer(scorer, tol(1.0, 1e9, 1.0))
    st = cluster()
    place(st, scorer.evaluate(st, MENU[1], np.arange(st.n_nodes)), 0)
    frozen = scorer.cluster_terms(st)
    rows = np.arange(st.n_nodes, dtype=np.int64)
    for step in range(40):
        req = MENU[int(rng.integers(len(MENU) - 1))]
        got = inc.evaluate(st, req, rows)
        assert same(got, scorer.evaluate(st, req, rows, frozen)), step
        if got.best() >= 0:
            place(st, got, got.best())
    assert inc.stats.term_refreshes == 0
    assert not same(inc.evaluate(st, MENU[0], rows), scorer.evaluate(st, MENU[0], rows))  # the terms did move


def test_a_new_state_drops_every_entry() -> None:
    scorer = build_scorer(PRESETS["default"])
    inc = IncrementalScorer(scorer)
    a, b = cluster(), cluster()
    place(b, scorer.evaluate(b, MENU[0], np.arange(b.n_nodes)), 0)
    rows = np.arange(a.n_nodes, dtype=np.int64)
    inc.evaluate(a, MENU[1], rows)
    assert same(inc.evaluate(b, MENU[1], rows), scorer.evaluate(b, MENU[1], rows))
    assert inc.stats.full == 2


def test_an_evaluation_handed_out_never_changes() -> None:
    scorer = build_scorer(PRESETS["default"])
    inc = IncrementalScorer(scorer)
    st = cluster()
    rows = np.arange(st.n_nodes, dtype=np.int64)
    first = inc.evaluate(st, MENU[3], rows)
    kept = first.take(rows)  # a copy of what it said
    place(st, first, first.best())
    second = inc.evaluate(st, MENU[3], rows)
    assert same(first, kept)
    assert not same(first, second)


def test_entries_stay_within_the_memory_budget() -> None:
    scorer = build_scorer(PRESETS["balance"])
    inc = IncrementalScorer(scorer, max_bytes=1)  # room for one entry (one is always kept)
    st = cluster()
    rows = np.arange(st.n_nodes, dtype=np.int64)
    for req in MENU[:3]:
        inc.evaluate(st, req, rows)
    inc.evaluate(st, MENU[0], rows)  # evicted by the two after it
    assert inc.stats.full == 4


def types(counts: list[int], milli: list[int]) -> TaskTypes:
    c = np.array(counts, dtype=np.int64)
    one = np.ones(len(counts), dtype=np.int64)
    return TaskTypes(one, np.array(milli, dtype=np.int64), one * 1000, one * 1024, c / c.sum(), c)


def test_workload_drift_is_the_total_variation_distance() -> None:
    a = types([3, 1], [500, 250])             # p = 0.75, 0.25
    b = types([1, 1, 2], [500, 250, 1000])    # p = 0.25, 0.25, 0.5
    # 1/2 * (|0.75 - 0.25| + |0.25 - 0.25| + |0 - 0.5|) = 1/2 * (0.5 + 0 + 0.5) = 0.5
    assert workload_drift(a, b) == pytest.approx(0.5)
    assert workload_drift(a, types([6, 2], [500, 250])) == 0.0  # same shares, twice the pods
    assert workload_drift(None, a) == 1.0 and workload_drift(None, None) == 0.0
    # The same types, other pods beyond them (TaskTypes.demand: (k, share, mask, GPU memory, pods)):
    # demand shares 0.8 / 0.2 against 0.6 / 0.4 -> 1/2 * (0.2 + 0.2) = 0.2.
    tail_a = replace(a, demand=((1, 250, -1, 0, 2), (1, 500, 6, 0, 8)))
    tail_b = replace(a, demand=((1, 250, -1, 0, 4), (1, 500, 6, 0, 6)))
    assert workload_drift(tail_a, tail_b) == pytest.approx(0.2)
    assert drifted(ct(tail_a), ct(tail_b), EXACT, TERMS)


TERMS = build_scorer(PRESETS["default"]).terms
"""The strategy terms a scorer compares (adaptive_balance's cpu_pressure, spare_nodes' spare_need)."""


def ct(tasks: TaskTypes, pressure: float = 0.5, spare: tuple[tuple[int, float], ...] = (),
       unseen: bool = False, balance_gain: float = 1.0) -> ClusterTerms:
    """Terms as ``Scorer.cluster_terms`` makes them: the pressure as adaptive_balance keeps it."""
    return ClusterTerms(tasks, unseen, {adaptive_balance.TERM: (adaptive_balance.effective_pressure(pressure),
                                                                balance_gain),
                                        spare_nodes.TERM: spare})


def tol(workload: float, pressure: float = 0.0, spare: float = 0.0) -> Tolerance:
    return Tolerance(workload, {adaptive_balance.TERM: pressure, spare_nodes.TERM: spare})


def test_drifted_is_strict_at_zero_and_bounded_otherwise() -> None:
    a, b = types([3, 1], [500, 250]), types([6, 2], [500, 250])
    # Same distribution, other counts: FGD's sums use the counts, so exact mode refreshes.
    assert drifted(ct(a), ct(b), EXACT, TERMS)
    assert not drifted(ct(a), ct(b), tol(0.01, 0.01), TERMS)
    assert drifted(ct(a, 0.95), ct(a, 0.97), tol(0.01, 0.01), TERMS)  # |0.97 - 0.95| > 0.01
    assert not drifted(ct(a, 0.95), ct(a, 0.955), tol(0.01, 0.01), TERMS)
    # Below adaptive_balance's ramp (0.9) and above its top (1.0) the pressure moves no score.
    assert not drifted(ct(a, 0.3), ct(a, 0.85), EXACT, TERMS)
    assert not drifted(ct(a, 1.2), ct(a, 3.0), EXACT, TERMS)
    assert drifted(ct(a, 0.85), ct(a, 0.91), tol(0.0, 0.005), TERMS)  # 0.9 -> 0.91
    # adaptive_balance's overload gain counts a tenth: 0.002 of pressure is 0.02 of gain.
    assert not drifted(ct(a, balance_gain=1.0), ct(a, balance_gain=0.985), tol(0.0, 0.002), TERMS)
    assert drifted(ct(a, balance_gain=1.0), ct(a, balance_gain=0.97), tol(0.0, 0.002), TERMS)
    # The spare-node probabilities: any change at 0, past the bound otherwise; a size that
    # appears counts from probability 0.
    p1, p2 = ((8, 0.10),), ((8, 0.105),)
    assert drifted(ct(a, spare=p1), ct(a, spare=p2), EXACT, TERMS)
    assert not drifted(ct(a, spare=p1), ct(a, spare=p2), tol(0.01, 0.01, 0.01), TERMS)
    assert drifted(ct(a, spare=p1), ct(a, spare=((8, 0.12),)), tol(0.01, 0.01, 0.01), TERMS)
    # The keep-whole band turning off (the first whole-node pod counted) drops every entry,
    # whatever the tolerance: a kept row must not break ties by the other rule.
    loose = tol(1.0, 1e9, 1.0)
    assert drifted(ct(a, spare=p1, unseen=True), ct(a, spare=p1), loose, TERMS)
    assert not drifted(ct(a, spare=p1, unseen=True), ct(a, spare=p1, unseen=True), loose, TERMS)
    assert drifted(ct(a, spare=p1), ct(a, spare=((4, 0.02), (8, 0.1))), tol(0.01, 0.01, 0.01), TERMS)
    assert not drifted(ct(a, spare=p1), ct(a, spare=((4, 0.0), (8, 0.1))), tol(0.01, 0.01, 0.01), TERMS)
    # A term the caller does not compare (a scorer without that strategy's term) moves nothing.
    assert not drifted(ct(a, 0.95), ct(a, 0.97), EXACT, ())


def test_only_adaptive_balance_reads_the_cpu_pressure() -> None:
    # effective_pressure clips the pressure to adaptive_balance's ramp: sound only while no
    # other strategy (or shared kernel the strategies call) reads it.
    readers = [m.__name__ for m in (*strategies.modules(), gaps, utilization)
               if "cpu_pressure" in inspect.getsource(m)]
    assert readers == [adaptive_balance.__name__]


@pytest.mark.parametrize(("workload", "terms", "field"), [
    (-0.1, {}, "workload"), (1.5, {}, "workload"), (0.0, {"cpu_pressure": float("nan")}, "cpu_pressure"),
    (0.0, {"cpu_pressure": float("inf")}, "cpu_pressure"), (0.0, {"spare_need": -0.5}, "spare_need")])
def test_tolerance_rejects_bounds_out_of_range(workload: float, terms: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Tolerance(workload, terms)


def test_many_shapes_on_a_small_cluster_stay_within_the_budget() -> None:
    # Every CPU request is a new shape (pods are untrusted input): the entries' Python objects
    # count too, so 200 shapes on 24 nodes (~2.4 KiB each) keep to a 100 KiB budget.
    scorer = build_scorer(PRESETS["balance"])
    inc = IncrementalScorer(scorer, max_bytes=100 * 1024)
    st = cluster()
    rows = np.arange(st.n_nodes, dtype=np.int64)
    for cpu in range(200):
        inc.evaluate(st, PodRequest(1, 250, cpu_milli=cpu), rows)
    assert inc._bytes <= 100 * 1024 and 30 <= len(inc._entries) <= 50


def same_ranks(a: Evaluation, b: Evaluation) -> bool:
    return same(a, b) and np.array_equal(a.tie_rank, b.tie_rank) and a.tie_band == b.tie_band


@pytest.mark.parametrize("preset", ["default", "balance"])
@pytest.mark.parametrize("exact", [True, False])
def test_rows_of_one_content_are_scored_once_and_answer_as_scored(rng: np.random.Generator, preset: str,
                                                                  exact: bool) -> None:
    # Thirty alike nodes fill through the same contents: the incremental scorer copies the
    # evaluation of a content it has scored, and every answer is still the full recomputation's
    # (exact: every evaluation a full pass; else the rows that moved, with the first terms).
    scorer = build_scorer(PRESETS[preset])
    inc = IncrementalScorer(scorer, EXACT if exact else tol(1.0, 1e9, 1.0))
    st = ClusterState.from_nodes([gpu_node(f"n{i:02d}", 4) for i in range(30)])
    place(st, scorer.evaluate(st, MENU[1], np.arange(st.n_nodes)), 0)
    frozen = scorer.cluster_terms(st)
    rows = np.arange(st.n_nodes, dtype=np.int64)
    for step in range(150):
        req = MENU[int(rng.integers(3))] if step % 10 else MENU[3]
        got = inc.evaluate(st, req, rows)
        assert same_ranks(got, scorer.evaluate(st, req, rows, None if exact else frozen)), step
        if got.best() >= 0:
            place(st, got, got.best())
    scored = inc.stats.full * st.n_nodes + inc.stats.rows_rescored - inc.stats.rows_copied
    assert scored < 0.5 * (inc.stats.full * st.n_nodes + inc.stats.rows_rescored)


def test_strategies_that_read_the_row_are_never_copied(rng: np.random.Generator) -> None:
    scorer = build_scorer(PRESETS["random"])
    assert scorer.reads_row(QoSClass.BURSTABLE)
    assert not build_scorer(PRESETS["default"]).reads_row(QoSClass.BURSTABLE)
    inc = IncrementalScorer(scorer, EXACT)
    st = ClusterState.from_nodes([gpu_node(f"n{i:02d}", 4) for i in range(10)])
    rows = np.arange(st.n_nodes, dtype=np.int64)
    for step in range(30):
        got = inc.evaluate(st, MENU[0], rows)
        assert same_ranks(got, scorer.evaluate(st, MENU[0], rows)), step
        place(st, got, got.best())
    assert inc.stats.rows_copied == 0


def test_content_banks_count_in_the_budget() -> None:
    # A bank grows with the contents its shape has seen; its bytes are the entry's.
    scorer = build_scorer(PRESETS["default"])
    inc = IncrementalScorer(scorer)
    st = cluster()
    rows = np.arange(st.n_nodes, dtype=np.int64)
    for _ in range(12):
        ev = inc.evaluate(st, MENU[0], rows)
        place(st, ev, ev.best())
    entry = inc._entries[MENU[0]]
    assert entry.bank is not None and entry.bank.nbytes() > 0
    assert inc._bytes == sum(e.nbytes for e in inc._entries.values()) >= entry.bank.nbytes()


def test_banks_that_copy_nothing_are_paused_without_changing_an_answer(rng: np.random.Generator,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # Mixed nodes filled at random share no content: after a probe the banks are skipped
    # (no content id computed) for a while, then probed again; every answer stays the
    # full evaluation's with the frozen terms. Alike nodes keep their banks.
    monkeypatch.setattr(incremental, "BANK_PROBE_ROWS", 20)
    monkeypatch.setattr(incremental, "BANK_PAUSE", 10)
    scorer = build_scorer(PRESETS["default"])
    st = random_state(rng, 30)
    inc = IncrementalScorer(scorer, tol(1.0, 1e9, 1.0))
    frozen = scorer.cluster_terms(st)
    rows = np.arange(st.n_nodes, dtype=np.int64)
    ids: list[int] = []
    content_ids = inc._contents.ids

    def counted(state: ClusterState, rows: np.ndarray) -> np.ndarray:
        ids.append(rows.size)
        return content_ids(state, rows)

    monkeypatch.setattr(inc._contents, "ids", counted)
    for step in range(80):
        req = MENU[int(rng.integers(3))]
        got = inc.evaluate(st, req, rows)
        assert same_ranks(got, scorer.evaluate(st, req, rows, frozen)), step
        if got.best() >= 0:
            place(st, got, got.best())
    assert inc.stats.bank_pauses >= 2 and len(ids) < 80 - 20  # paused, and probed again after a pause
    alike = IncrementalScorer(scorer, tol(1.0, 1e9, 1.0))
    st = ClusterState.from_nodes([gpu_node(f"n{i:02d}", 4) for i in range(30)])
    for step in range(40):
        got = alike.evaluate(st, MENU[step % 3], rows)
        place(st, got, got.best())
    assert alike.stats.bank_pauses == 0 and alike.stats.rows_copied > 30 * 3


@pytest.mark.parametrize("preset", ["default", "balance"])
def test_an_empty_cluster_evaluates_to_no_rows(preset: str) -> None:
    # A cluster with no nodes yet (a standalone extender before its first inventory): every
    # shape evaluates to an empty answer, first and again, instead of raising.
    scorer = build_scorer(PRESETS[preset])
    inc = IncrementalScorer(scorer, EXACT)
    st = ClusterState.from_nodes([])
    rows = np.arange(0, dtype=np.int64)
    for req in MENU + MENU:
        got = inc.evaluate(st, req, rows)
        assert got.rows.shape == (0,) and got.best() == -1
        assert same(got, scorer.evaluate(st, req, rows))
