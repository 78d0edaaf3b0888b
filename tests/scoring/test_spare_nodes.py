"""spare_nodes: a worked table (the arithmetic in the comments) and the reference."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scoring.fit import ClusterTerms, fit
from scoring.request import PodRequest, QoSClass
from scoring.scorer import ScoringConfig, build_scorer
from scoring.specs import Allocation
from scoring.state import ClusterState
from scoring.strategies import spare_nodes
from tests.conftest import gpu_node
from tests.scoring.reference import _spare_nodes_score


def cluster_terms(st: ClusterState) -> ClusterTerms:
    """The state's terms with spare_nodes' own (``spare_need``), as a scorer computes them."""
    return build_scorer(ScoringConfig({"spare_nodes": 1.0})).cluster_terms(st)


def need(terms: ClusterTerms) -> spare_nodes.SpareNeed:
    got = terms.strategy_terms[spare_nodes.TERM]
    assert isinstance(got, tuple)
    return got


def _state(empty_nodes: int) -> ClusterState:
    # b: 8 GPUs, six hold a whole 1-GPU pod (2 whole GPUs free). c: 8 GPUs, one 8-GPU pod.
    # e0, e1...: empty 8-GPU nodes. Workload {1 GPU: 6, 8 GPUs: 1}: GPU demand 6000 + 8000,
    # phi_8 = 8000 / 14000 = 4/7.
    st = ClusterState.from_nodes([gpu_node("b", 8), gpu_node("c", 8),
                                  *(gpu_node(f"e{i}", 8) for i in range(empty_nodes))])
    for col in range(6):
        st.apply(Allocation("b", (col,), 1000, (0,), QoSClass.BURSTABLE, 1000, 1024))
    st.apply(Allocation("c", tuple(range(8)), 1000, (0,) * 8, QoSClass.BURSTABLE, 8000, 8192))
    return st


@pytest.mark.parametrize(("empty_nodes", "p8"), [
    # One empty node: F = 2000 (b) + 8000 = 10000, mu_8 = 4/7 * 10000 / 8000 = 0.714, E_8 = 1:
    # P_8 = 1/2 erfc((1 - 0.5 - 0.714) / sqrt(2 * 0.714)) = 1/2 erfc(-0.179) = 0.600.
    (1, 0.600),
    # Three: F = 26000, mu_8 = 1.857, E_8 = 3: 1/2 erfc((3 - 0.5 - 1.857) / sqrt(3.714)) =
    # 1/2 erfc(0.334) = 0.319.
    (3, 0.319),
    # Eight: F = 66000, mu_8 = 4.714, E_8 = 8: 1/2 erfc(2.786 / 3.071) = 1/2 erfc(0.907) = 0.100.
    (8, 0.100),
])
def test_spare_nodes_worked_table(empty_nodes: int, p8: float) -> None:
    st = _state(empty_nodes)
    terms = cluster_terms(st)
    assert [k for k, _ in need(terms)] == [8]
    assert need(terms)[0][1] == pytest.approx(p8, abs=5e-4)
    req = PodRequest(1, 500, gpu_memory_mib=0)
    ctx = fit(st, req, np.arange(st.n_nodes), terms=terms)
    chosen = np.zeros((st.n_nodes, 8), dtype=bool)
    chosen[0, 6] = chosen[1, 0] = True
    chosen[2:, 0] = True
    score = spare_nodes.node_score(ctx, chosen)
    # b keeps 1 whole GPU (2 -> 1): no size crosses -> 0.5. c has none -> 0.5. An empty node
    # goes 8 -> 7: cost 8000 * P_8 (4800, 2552, 800) -> 0.5 - cost / 2000, clipped:
    # 0, 0, 0.1.
    broken = min(max(0.5 - 8000 * need(terms)[0][1] / 2000, 0.0), 1.0)
    np.testing.assert_allclose(score, [0.5, 0.5, *[broken] * empty_nodes])
    assert broken == pytest.approx({1: 0.0, 3: 0.0, 8: 0.1}[empty_nodes], abs=2e-3)
    for row in (0, 2):
        assert _spare_nodes_score(st, row, req, (int(np.flatnonzero(chosen[row])[0]),)) == pytest.approx(score[row])


def test_spare_nodes_is_neutral_without_multi_gpu_pods() -> None:
    st = ClusterState.from_nodes([gpu_node("a", 8)])
    st.apply(Allocation("a", (0,), 1000, (0,), QoSClass.BURSTABLE, 1000, 1024))
    terms = cluster_terms(st)
    assert need(terms) == ()
    ctx = fit(st, PodRequest(1, 1000), np.arange(1), terms=terms)
    assert spare_nodes.node_score(ctx, np.eye(1, 8, 1, dtype=bool)).tolist() == [0.5]


def test_poisson_tail_is_the_normal_approximation() -> None:
    # The formula in the module notes, for mu = 0.714 and E = 1: P(N >= 1) is 1 - e^-mu = 0.51
    # exactly; the continuity-corrected normal gives 0.60 (the tail is coarse for small mu,
    # and errs on the side of keeping the node).
    mu = 4 / 7 * 10000 / 8000
    assert 0.5 * math.erfc((1 - 0.5 - mu) / math.sqrt(2 * mu)) == pytest.approx(0.600, abs=5e-4)
    assert 1 - math.exp(-mu) == pytest.approx(0.510, abs=5e-4)


def test_spare_nodes_counts_slots_not_nodes() -> None:
    # Workload: 4-GPU pods only (two placed on h and f0). h holds one (4 whole GPUs free),
    # e0..e2 are empty, f0 holds one too. Slots of 4: h 1, f0 1, e_i 2 each: E_4 = 8.
    # F = 4000 + 4000 + 3 * 8000 = 32000, mu_4 = 1 * 32000 / 4000 = 8,
    # P_4 = 1/2 erfc((8 - 0.5 - 8) / 4) = 1/2 erfc(-0.125) = 0.570.
    # The next 4-GPU pod on h closes h's one slot (1 -> 0): cost 4000 * P_4 = 2281;
    # on an empty node it closes one of two (2 -> 1): the same cost. Counting nodes with
    # >= 4 free GPUs instead, h would lose its spare node and the empty node none (8 -> 4
    # free keeps it spare): the empty node would win and 4-GPU pods would spread.
    st = ClusterState.from_nodes([gpu_node("h", 8), gpu_node("f0", 8),
                                  *(gpu_node(f"e{i}", 8) for i in range(3))])
    for node in ("h", "f0"):
        st.apply(Allocation(node, (0, 1, 2, 3), 1000, (0,) * 4, QoSClass.BURSTABLE, 4000, 4096))
    terms = cluster_terms(st)
    assert [k for k, _ in need(terms)] == [4]
    p4 = need(terms)[0][1]
    assert p4 == pytest.approx(0.5 * math.erfc(-0.125), abs=1e-9)
    assert p4 == pytest.approx(0.570, abs=5e-4)
    req = PodRequest(4, 1000, gpu_memory_mib=0)
    ctx = fit(st, req, np.arange(st.n_nodes), terms=terms)
    chosen = np.zeros((st.n_nodes, 8), dtype=bool)
    chosen[:2, 4:] = True
    chosen[2:, :4] = True
    score = spare_nodes.node_score(ctx, chosen)
    expected = 0.5 - 4000 * p4 / 2000  # -0.64: clipped to 0 on every node
    np.testing.assert_allclose(score, [max(expected, 0.0)] * 5)
    for row in (0, 2):
        cols = tuple(int(c) for c in np.flatnonzero(chosen[row]))
        assert _spare_nodes_score(st, row, req, cols) == pytest.approx(score[row])


def test_the_term_kept_between_binds_equals_the_term_computed_afresh() -> None:
    # The memo keeps each node's free share and wholly free GPUs and reads again only the
    # rows a bind (or a release) moved: after every change it equals a fresh computation.
    from scoring.memo import Memo
    from tests.randstate import random_state

    rng = np.random.default_rng(5)
    st = random_state(rng, 30)
    memo = Memo()
    held: list[Allocation] = []
    seen = set()
    for step in range(120):
        fits = np.flatnonzero((st.gpu_free_milli >= 500) & st.gpu_healthy & (st.gpu_slots_free > 0))
        if held and (rng.random() < 0.3 or not fits.size):
            st.apply(held.pop(int(rng.integers(len(held)))), -1)
        elif fits.size:
            row, col = divmod(int(fits[int(rng.integers(fits.size))]), st.gpu_free_milli.shape[1])
            k = 2 if rng.random() < 0.3 else 1
            cols = tuple(range(col, col + k)) if k == 2 and col + 1 < st.gpu_free_milli.shape[1] and bool(
                st.gpu_healthy[row, col + 1]) and st.gpu_free_milli[row, col + 1] >= 1000 and st.gpu_free_milli[
                row, col] >= 1000 and st.gpu_slots_free[row, col + 1] > 0 else (col,)
            milli = 1000 if len(cols) == 2 else 500
            alloc = Allocation(st.node_names[row], cols, milli, (0,) * len(cols), QoSClass.BURSTABLE, 0, 0)
            st.apply(alloc)
            held.append(alloc)
        kept = spare_nodes.cluster_term(st, memo)
        assert kept == spare_nodes.cluster_term(st, Memo()), step
        seen.add(kept)
    assert len(seen) > 20  # the term moved with the binds: the check compared something
