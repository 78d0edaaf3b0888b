"""consolidation: a worked table (the arithmetic in the comments) and its weight, the churn."""

from __future__ import annotations

import numpy as np
import pytest

from scoring.arrivals import Learning
from scoring.memo import Memo
from scoring.request import PodRequest, QoSClass
from scoring.scorer import ScoringConfig, build_scorer
from scoring.specs import Allocation
from scoring.state import ClusterState
from scoring.strategies import consolidation
from scoring.utilization import room_for_waiting
from tests.conftest import gpu_node

KEY = (1, 1000, 8000, 8192, -1, 0)


def _state(departures: int) -> ClusterState:
    # a: 8 GPUs, 64 cores, four whole GPUs and 32 cores held. big: 8 GPUs, 128 cores, empty.
    # C_ref = 128,000 (the most CPU of a GPU node), F_ref = 8,000. Four pods arrived; some left.
    st = ClusterState.from_nodes([gpu_node("a", 8, cpu_milli=64_000), gpu_node("big", 8, cpu_milli=128_000)])
    st.workload.set_learning(Learning("running", 1 << 20))
    for col in range(4):
        st.apply(Allocation("a", (col,), 1000, (0,), QoSClass.BURSTABLE, 8000, 8192))
        st.workload.arrive(KEY)
    for _ in range(departures):
        st.workload.depart()
    return st


def test_consolidation_worked_table() -> None:
    # A whole-GPU pod with 8 cores:
    #   a:   C = 32,000 - 8,000 = 24,000, F = 4,000 - 1,000 = 3,000:
    #        left = 0.5 * 24/128 + 0.5 * 3/8 = 0.09375 + 0.1875 = 0.28125, score 0.71875;
    #   big: C = 120,000, F = 7,000: left = 0.46875 + 0.4375 = 0.90625, score 0.09375.
    # The nearly full node scores higher: the empty 128-core one stays whole.
    st = _state(departures=4)
    scorer = build_scorer(ScoringConfig({"consolidation": 1.0}))
    ev = scorer.evaluate(st, PodRequest(1, 1000, None, None, QoSClass.BURSTABLE, 8000, 8192), np.arange(2))
    assert ev.score.tolist() == [pytest.approx(0.71875), pytest.approx(0.09375)]
    assert ev.best() == 0
    # A CPU-only pod of 16 cores takes no GPU share: a: C = 16,000, F = 4,000: left = 0.0625 +
    # 0.25 = 0.3125, score 0.6875; big: C = 112,000, F = 8,000: left = 0.4375 + 0.5, score 0.0625.
    ev = scorer.evaluate(st, PodRequest(0, 1000, None, None, QoSClass.BURSTABLE, 16_000, 1024), np.arange(2))
    assert ev.score.tolist() == [pytest.approx(0.6875), pytest.approx(0.0625)]


def test_the_weight_is_the_churn_and_without_departures_the_term_is_left_out() -> None:
    req = PodRequest(1, 1000, None, None, QoSClass.BURSTABLE, 8000, 8192)
    alone = build_scorer(ScoringConfig({"node_packing": 1.0}))
    both = build_scorer(ScoringConfig({"node_packing": 1.0, "consolidation": 2.0}))
    # No pod has left: churn 0, consolidation is left out, its weight too: the same scores to the bit.
    st = _state(departures=0)
    assert both.cluster_terms(st).strategy_terms[consolidation.TERM] == (0.0, 128_000, 8_000)
    np.testing.assert_array_equal(both.evaluate(st, req, np.arange(2)).score,
                                  alone.evaluate(st, req, np.arange(2)).score)
    # Two of the four left: churn 0.5 (the weights of four arrivals over 2**20 half-life: equal
    # within 4e-6), consolidation weighs 2 * 0.5 = 1. node_packing (used share after placement
    # over the node's): a 5/8 = 0.625, big 1/8 = 0.125; with consolidation's 0.71875 and
    # 0.09375: a (0.625 + 0.71875) / 2 = 0.671875, big (0.125 + 0.09375) / 2 = 0.109375.
    st = _state(departures=2)
    ev = both.evaluate(st, req, np.arange(2))
    assert ev.score.tolist() == [pytest.approx(0.671875, abs=1e-5), pytest.approx(0.109375, abs=1e-5)]


def test_term_drift() -> None:
    assert consolidation.term_drift((0.2, 10, 20), (0.25, 10, 20)) == pytest.approx(0.05)
    assert consolidation.term_drift((0.2, 10, 20), (0.2, 11, 20)) == 1.0  # a new node set
    assert consolidation.term_drift(None, None) == 0.0


def test_the_gain_fades_where_more_waits_than_the_free_room_could_hold() -> None:
    # Churn 1 (all four left); free share F = 4 GPUs on a + 8 on big = 12,000 milli.
    st = _state(departures=4)
    term = consolidation.cluster_term
    assert room_for_waiting(st) == 1.0  # nothing waits
    # Three 8-GPU pods wait: W = 24,000 = 2 F: gain 2 * 12,000 / 24,000 - 1 = 0: left out.
    for _ in range(3):
        st.workload.add((8, 1000, 64_000, 262_144, -1, 0), 1, pending=True)
    got = term(st, Memo())
    assert got[0] == 0.0 and got[1:] == (128_000, 8_000) and room_for_waiting(st) == 0.0
    # One of them is placed elsewhere (it no longer waits): W = 16,000, gain 24 / 16 - 1 = 0.5.
    st.workload.add((8, 1000, 64_000, 262_144, -1, 0), -1, pending=True)
    assert term(st, Memo())[0] == pytest.approx(0.5, abs=1e-5)
    # Another: W = 8,000 <= F: the churn alone.
    st.workload.add((8, 1000, 64_000, 262_144, -1, 0), -1, pending=True)
    assert term(st, Memo())[0] == pytest.approx(1.0, abs=1e-5)
    # Without departures there is no churn, whatever waits: the term is off.
    assert term(_state(departures=0), Memo())[0] == 0.0


def test_adaptive_balance_fades_where_more_waits_than_the_room_could_hold() -> None:
    from scoring.strategies import adaptive_balance
    # Without departures (the arrivals-only replay) the balance keeps its weight, whatever waits.
    st = _state(departures=0)
    for _ in range(3):
        st.workload.add((8, 1000, 64_000, 262_144, -1, 0), 1, pending=True)
    assert adaptive_balance.weight_gain({adaptive_balance.TERM: adaptive_balance.cluster_term(st, Memo())}) == 1.0
    # Churn 1, room 0 (W = 2 F, as above): gain 1 - 1 * (1 - 0) = 0, the term left out.
    st = _state(departures=4)
    for _ in range(3):
        st.workload.add((8, 1000, 64_000, 262_144, -1, 0), 1, pending=True)
    assert adaptive_balance.cluster_term(st, Memo())[1] == 0.0
    # Room 0.5 (W = 16,000): gain 0.5; nothing waiting: 1.
    st.workload.add((8, 1000, 64_000, 262_144, -1, 0), -1, pending=True)
    assert adaptive_balance.cluster_term(st, Memo())[1] == pytest.approx(0.5, abs=1e-5)
    assert adaptive_balance.cluster_term(_state(departures=4), Memo())[1] == 1.0
    assert adaptive_balance.overload_gain(0.5, 0.0) == 0.5
