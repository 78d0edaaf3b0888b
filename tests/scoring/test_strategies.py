"""Table tests per strategy, the arithmetic worked out in comments (noderesources style)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from scoring.fit import FitContext, fit
from scoring.registry import STRATEGIES
from scoring.request import PodRequest, QoSClass
from scoring.specs import Allocation
from scoring.state import ClusterState
from scoring.strategies import gpu_best_fit, node_packing, qos_interference, resource_balance, spread
from scoring.utilization import multi_gpu_share
from tests.conftest import gpu_node
from tests.randstate import random_request, random_state


def two_node_state() -> ClusterState:
    """a: 2 x T4 (16384 MiB), GPU0 600 milli used by a guaranteed pod; b: 4 x T4 empty.

    Both nodes: 64000m CPU, 262144 MiB. Node a also runs 32000m / 65536 MiB of host load.
    """
    st = ClusterState.from_nodes([gpu_node("a", 2), gpu_node("b", 4)])
    st.apply(Allocation("a", (0,), 600, (9830,), QoSClass.GUARANTEED, 32000, 65536))
    return st


def ctx_for(req: PodRequest) -> FitContext:
    return fit(two_node_state(), req, np.array([0, 1]))


def test_gpu_best_fit_per_gpu() -> None:
    # pod 300 milli. a/GPU0: free 400, left 100 -> 1 - 100/1000 = 0.9
    #                a/GPU1: free 1000, left 700 -> 0.3; b/GPU*: 0.3; padding of a: 0
    g = gpu_best_fit.gpu_score(ctx_for(PodRequest(1, 300)))
    np.testing.assert_allclose(g, [[0.9, 0.3, 0.0, 0.0], [0.3, 0.3, 0.3, 0.3]])


def test_gpu_best_fit_ties_on_whole_gpus() -> None:
    # whole GPU: every free GPU is left at 0 -> 1.0; a/GPU0 does not fit -> 0
    g = gpu_best_fit.gpu_score(ctx_for(PodRequest(1)))
    np.testing.assert_allclose(g, [[0.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])


def test_node_packing_and_spread() -> None:
    # pod 300 milli. a: (600 + 300) / 2000 = 0.45 ; b: (0 + 300) / 4000 = 0.075
    ctx = ctx_for(PodRequest(1, 300))
    chosen = np.zeros(ctx.gpu_fits.shape, dtype=bool)
    np.testing.assert_allclose(node_packing.node_score(ctx, chosen), [0.45, 0.075])
    # spread = 1 - packing: 0.55 ; 0.925
    np.testing.assert_allclose(spread.node_score(ctx, chosen), [0.55, 0.925])


@pytest.mark.parametrize(("qos", "a_gpu0"), [
    # a/GPU0 holds a guaranteed pod: only a best-effort pod conflicts there
    (QoSClass.BEST_EFFORT, 0.0),
    (QoSClass.BURSTABLE, 1.0),
    (QoSClass.GUARANTEED, 1.0),
])
def test_qos_interference(qos: QoSClass, a_gpu0: float) -> None:
    g = qos_interference.gpu_score(ctx_for(PodRequest(1, 300, qos=qos)))
    assert g[0, 0] == a_gpu0
    assert g[0, 1] == 1.0 and g[1].tolist() == [1.0] * 4


def test_qos_interference_guaranteed_avoids_best_effort() -> None:
    st = ClusterState.from_nodes([gpu_node("a", 2)])
    st.apply(Allocation("a", (1,), 200, (3276,), QoSClass.BEST_EFFORT, 0, 0))
    g = qos_interference.gpu_score(fit(st, PodRequest(1, 300, qos=QoSClass.GUARANTEED), np.array([0])))
    assert g.tolist() == [[1.0, 0.0]]


def test_resource_balance() -> None:
    # pod: 1 GPU of 300 milli, 8000m CPU, 32768 MiB.
    # a: u_gpu = 900/2000 = 0.45 ; u_cpu = (32000 + 8000)/64000 = 0.625 ;
    #    u_mem = (65536 + 32768)/262144 = 0.375 ; gap = max(0.175, 0.075) = 0.175 -> 0.825
    # b: u_gpu = 300/4000 = 0.075 ; u_cpu = 8000/64000 = 0.125 ; u_mem = 0.125 ;
    #    gap = 0.05 -> 0.95
    ctx = ctx_for(PodRequest(1, 300, cpu_milli=8000, memory_mib=32768))
    s = resource_balance.node_score(ctx, np.zeros(ctx.gpu_fits.shape, dtype=bool))
    np.testing.assert_allclose(s, [0.825, 0.95])


def test_stranding_penalises_only_host_use_ahead_of_the_gpus() -> None:
    from scoring.strategies import stranding
    # pod: 1 GPU of 300 milli, 8000m CPU, 32768 MiB (the resource_balance case above).
    # a: u_gpu 0.45, u_cpu 0.625, u_mem 0.375: CPU leads by 0.175 -> 1 - 0.175 = 0.825
    # b: u_gpu 0.075, u_cpu 0.125, u_mem 0.125: CPU leads by 0.05 -> 0.95
    ctx = ctx_for(PodRequest(1, 300, cpu_milli=8000, memory_mib=32768))
    np.testing.assert_allclose(stranding.node_score(ctx, np.zeros(ctx.gpu_fits.shape, dtype=bool)),
                               [0.825, 0.95])
    # a quarter GPU with 100m CPU, 1 GiB: the GPUs lead everywhere, nothing strands.
    # a: u_gpu 0.425, u_cpu 0.502, u_mem 0.254: CPU leads by 0.077 -> 0.923 (its host load)
    # b: u_gpu 0.0625, u_cpu 0.0016, u_mem 0.0039: no lead -> 1.0; resource_balance gives
    #    1 - 0.061 = 0.939 here and would prefer b for the emptiness alone
    ctx = ctx_for(PodRequest(1, 250, cpu_milli=100, memory_mib=1024))
    s = stranding.node_score(ctx, np.zeros(ctx.gpu_fits.shape, dtype=bool))
    np.testing.assert_allclose(s, [1 - (32100 / 64000 - 850 / 2000), 1.0])


def pressed(ctx: FitContext, pressure: float) -> FitContext:
    """``ctx`` with adaptive_balance's term at ``pressure`` (as a scorer would compute it)."""
    from scoring.strategies import adaptive_balance
    return replace(ctx, terms={adaptive_balance.TERM: (adaptive_balance.effective_pressure(pressure), 1.0)})


def test_adaptive_balance_is_two_sided_until_multi_gpu_pods_rise() -> None:
    from scoring.strategies import adaptive_balance
    # Workload: the one 600-milli pod on a/GPU0, multi-GPU share s = 0 -> lam = 0:
    # score = k * resource_balance / 2 (the resource_balance case above: 0.825, 0.95).
    # CPU pressure (test_cpu_pressure_is_cpu_over_gpu_utilization): 2.5 -> k = 2, so the
    # score is resource_balance itself; at a pressure of 0.9 or below k = 1.
    ctx = ctx_for(PodRequest(1, 300, cpu_milli=8000, memory_mib=32768))
    chosen = np.zeros(ctx.gpu_fits.shape, dtype=bool)
    assert adaptive_balance.cpu_pressure(two_node_state()) == pytest.approx(2.5)
    np.testing.assert_allclose(adaptive_balance.node_score(pressed(ctx, 2.5), chosen), [0.825, 0.95])
    np.testing.assert_allclose(adaptive_balance.node_score(pressed(ctx, 0.9), chosen),
                               [0.4125, 0.475])
    # A 2 x 1000 pod on b: demand 0.5 * 600 = 300 and 0.5 * 2000 = 1000, s = 1000/1300 =
    # 0.77 >= 0.3 -> lam = 1: score = 2 * stranding / 2 = stranding. Quarter pod, 100m, 1 GiB:
    # a: u_gpu 850/2000 = 0.425, u_cpu 32100/64000 = 0.5016, u_mem 66560/262144 = 0.2539:
    #    CPU leads by 0.0766 -> 0.9234
    # b: u_gpu 2250/4000 = 0.5625, u_cpu 0.0016, u_mem 0.0039: nothing leads -> 1.0, where
    #    the two-sided balance would give 1 - 0.5609 = 0.439 and pull the pod to a
    st = two_node_state()
    st.apply(Allocation("b", (2, 3), 1000, (16384, 16384), QoSClass.BURSTABLE, 0, 0))
    ctx = fit(st, PodRequest(1, 250, cpu_milli=100, memory_mib=1024), np.array([0, 1]))
    s = adaptive_balance.node_score(ctx, np.zeros(ctx.gpu_fits.shape, dtype=bool))
    np.testing.assert_allclose(s, [1 - (32100 / 64000 - 850 / 2000), 1.0])
    two = resource_balance.node_score(ctx, np.zeros(ctx.gpu_fits.shape, dtype=bool))
    np.testing.assert_allclose(two[1], 1 - (2250 / 4000 - 100 / 64000))


@pytest.mark.parametrize(("pressure", "k"), [
    (0.0, 1.0),     # nearly empty cluster
    (0.83, 1.0),    # openb default runs at about 0.83: unchanged
    (0.9, 1.0),     # PRESSURE_START
    (0.95, 1.5),    # halfway up the ramp: 1 + (0.95 - 0.9) / (1.0 - 0.9) = 1.5
    (1.0, 2.0),     # PRESSURE_FULL
    (1.03, 2.0),    # openb cpu250 runs at about 1.03: capped at PRESSURE_GAIN
])
def test_adaptive_balance_gains_weight_with_cpu_pressure(pressure: float, k: float) -> None:
    from scoring.strategies import adaptive_balance
    # lam = 0 (no multi-GPU pods): score = k * resource_balance / 2, resource_balance
    # 0.825 and 0.95 (test_resource_balance); at k = 2 it stays <= 1.
    ctx = ctx_for(PodRequest(1, 300, cpu_milli=8000, memory_mib=32768))
    chosen = np.zeros(ctx.gpu_fits.shape, dtype=bool)
    s = adaptive_balance.node_score(pressed(ctx, pressure), chosen)
    np.testing.assert_allclose(s, [k * 0.825 / 2, k * 0.95 / 2])


def test_cpu_pressure_is_cpu_over_gpu_utilization() -> None:
    from scoring.strategies.adaptive_balance import cpu_pressure
    # two_node_state: CPU 32000 of 2 x 64000 -> u_cpu 0.25; GPU 600 of 6 x 1000 -> u_gpu 0.1
    # -> 0.25 / 0.1 = 2.5
    st = two_node_state()
    assert cpu_pressure(st) == pytest.approx(2.5)
    # a whole GPU on b without CPU: u_gpu 1600 / 6000 = 0.2667 -> 0.25 / 0.2667 = 0.9375
    st.apply(Allocation("b", (1,), 1000, (16384,), QoSClass.BURSTABLE, 0, 0))
    assert cpu_pressure(st) == pytest.approx(0.9375)
    # a CPU-only node's load strands no GPU and is not counted
    st = ClusterState.from_nodes([gpu_node("a", 2), gpu_node("b", 4), gpu_node("cpu", 0)])
    st.apply(Allocation("a", (0,), 600, (9830,), QoSClass.GUARANTEED, 32000, 65536))
    st.apply(Allocation("cpu", (), 0, (), QoSClass.BURSTABLE, 60000, 1024))
    assert cpu_pressure(st) == pytest.approx(2.5)
    # near-empty cluster: u_gpu 0.01 is floored at 0.1 -> 0.0625 / 0.1 = 0.625, not 6.25
    st = ClusterState.from_nodes([gpu_node("a", 2), gpu_node("b", 4)])
    st.apply(Allocation("a", (0,), 60, (983,), QoSClass.BURSTABLE, 8000, 1024))
    assert cpu_pressure(st) == pytest.approx(8000 / 128000 / 0.1)
    assert cpu_pressure(ClusterState.from_nodes([gpu_node("cpu", 0)])) == 0.0


def test_resource_balance_without_gpus_is_zero() -> None:
    st = ClusterState.from_nodes([gpu_node("cpu-only", 0)])
    ctx = fit(st, PodRequest(0, cpu_milli=1000), np.array([0]))
    assert resource_balance.node_score(ctx, np.zeros((1, 0), dtype=bool)).tolist() == [0.0]


def test_fgd_prefers_the_gpu_whose_fragment_no_typical_task_can_use() -> None:
    from scoring.strategies import fgd

    # One node, 2 GPUs. A pod of 600 milli (1 core, 1 GiB) holds GPU 0, so the learned
    # workload is {(1 GPU, 600 milli, 1000m, 1024Mi): 1.0} and free = [400, 1000].
    st = ClusterState.from_nodes([gpu_node("a", 2)])
    st.apply(Allocation("a", (0,), 600, (0,), QoSClass.BURSTABLE, 1000, 1024))
    ctx = fit(st, PodRequest(gpu_count=1, gpu_milli=400, gpu_memory_mib=0), np.arange(1))
    # Before: GPU 1 runs the task, GPU 0's 400 is too small for it: F = 400.
    # On GPU 0 -> free [0, 1000]:   F = 0,   dF = -400, sigmoid(0.4) = 0.5987 -> trunc(59.87) = 59
    # On GPU 1 -> free [400, 600]:  F = 400, dF = 0,    sigmoid(0) = 0.5     -> 50
    assert fgd.gpu_score(ctx)[0].tolist() == pytest.approx([0.59, 0.5])
    assert fgd.node_score(ctx, np.array([[True, False]])).tolist() == pytest.approx([0.59])


def test_fgd_is_neutral_before_any_gpu_pod() -> None:
    from scoring.strategies import fgd

    st = ClusterState.from_nodes([gpu_node("a", 2)])
    ctx = fit(st, PodRequest(gpu_count=1, gpu_milli=400), np.arange(1))
    assert ctx.tasks is None
    assert fgd.gpu_score(ctx)[0].tolist() == [0.5, 0.5]


def test_task_types_allowed_past_the_mask_bits() -> None:
    from scoring.fragmentation import TaskTypes
    from scoring.request import ANY_MODEL_MASK, model_mask

    # Three types: any model; models {0, 62}; model {5}. GPUs of model ids 0, 5, 62, 70.
    # Id 70 has no bit (model_mask keeps bits 0..62), so only the any-model type may use
    # it; clipping the id to 62 would let the {0, 62} type use it too.
    masks = np.array([ANY_MODEL_MASK, model_mask(frozenset({0, 62})), model_mask(frozenset({5}))])
    one = np.ones(3, dtype=np.int64)
    tasks = TaskTypes(one, one * 500, one, one, one / 3, one, masks)
    allowed = tasks.allowed(np.array([[0, 5, 62, 70]]))
    assert allowed is not None
    assert allowed[0].tolist() == [
        [True, True, True, True], [True, False, True, False], [False, True, False, False]]


def test_best_fit_as_published() -> None:
    from scoring.strategies import best_fit

    # pod 1 GPU x 300 milli, 8000m CPU. left = (C - c)/128000 * 0.5 + (F - r)/8000 * 0.5
    # a: C = 64000 - 32000 = 32000, F = 400 + 1000 = 1400
    #    left = 24000/128000*0.5 + 1100/8000*0.5 = 0.09375 + 0.06875 = 0.1625 -> trunc(83.75) = 83
    # b: C = 64000, F = 4000
    #    left = 56000/128000*0.5 + 3700/8000*0.5 = 0.21875 + 0.23125 = 0.45   -> trunc(55.0) = 55
    ctx = ctx_for(PodRequest(1, 300, cpu_milli=8000))
    chosen = np.zeros(ctx.gpu_fits.shape, dtype=bool)
    np.testing.assert_allclose(best_fit.node_score(ctx, chosen), [0.83, 0.55])
    # inside the node: the tightest GPU, as gpu_best_fit (a/GPU0 left 100 -> 0.9)
    np.testing.assert_allclose(best_fit.gpu_score(ctx), [[0.9, 0.3, 0.0, 0.0], [0.3, 0.3, 0.3, 0.3]])


def test_cpu_only_pods_are_scored_by_the_node_strategies() -> None:
    from scoring.scorer import ScoringConfig, build_scorer

    # CPU-only pod, 8000m: a: left = 24000/128000*0.5 + 1400/8000*0.5 = 0.18125 -> 81
    #                      b: left = 56000/128000*0.5 + 4000/8000*0.5 = 0.46875 -> 53
    req = PodRequest(0, cpu_milli=8000)
    ev = build_scorer(ScoringConfig({"best_fit": 1.0})).evaluate(two_node_state(), req, np.array([0, 1]))
    np.testing.assert_allclose(ev.score, [0.81, 0.53])
    assert ev.chosen_cols.shape == (2, 0)
    # A per-GPU strategy has nothing to prefer for it: gpu_best_fit 1 adds 0 at half the weight.
    ev = build_scorer(ScoringConfig({"best_fit": 1.0, "gpu_best_fit": 1.0})).evaluate(
        two_node_state(), req, np.array([0, 1]))
    np.testing.assert_allclose(ev.score, [0.405, 0.265])


def test_fgd_counts_gpus_of_a_model_a_task_cannot_use_as_fragments() -> None:
    from scoring.request import model_mask
    from scoring.strategies import fgd

    # a: 1 x T4, b: 1 x V100M32. The only task type so far accepts V100M32 only (gpu_spec):
    # a 500-milli pod on b. Now a 200-milli pod that accepts either model.
    st = ClusterState.from_nodes([gpu_node("a", 1), gpu_node("b", 1, model="V100M32", memory_mib=32768)])
    v100 = st.models.index("V100M32")
    st.apply(Allocation("b", (0,), 500, (0,), QoSClass.BURSTABLE, 1000, 1024, model_mask(frozenset({v100}))))
    ctx = fit(st, PodRequest(gpu_count=1, gpu_milli=200, gpu_memory_mib=0, cpu_milli=1000, memory_mib=1024),
              np.arange(2))
    # a: the task cannot use a T4: all free share is fragment. F 1000 -> 800, dF = -200,
    #    sigmoid(0.2) = 0.5498 -> 54.  (Blind to models it would be F 0 -> 0: 50.)
    # b: F 0 (500 free fits the task) -> 300 (too small), dF = +300, sigmoid(-0.3) = 0.4256 -> 42
    assert fgd.gpu_score(ctx)[:, 0].tolist() == pytest.approx([0.54, 0.42])
    assert fgd.node_score(ctx, np.array([[True], [True]])).tolist() == pytest.approx([0.54, 0.42])


def test_fgd_counts_gpu_memory_no_task_can_use_as_fragment() -> None:
    from scoring.strategies import fgd
    from tests.scoring.reference import _fgd_score

    # big: 1 x 80 GiB, holding a 200-milli pod that asked 40 GiB (type A): 800 milli and 40 GiB
    # free. small: 1 x 16 GiB, holding a 200-milli pod that asked 4 GiB (type B): 800 milli,
    # 12 GiB free. Workload {A: 1, B: 1}, N = 2. A new 200-milli pod asks 8 GiB.
    st = ClusterState.from_nodes([gpu_node("big", 1, model="G3", memory_mib=80 * 1024),
                                  gpu_node("small", 1, memory_mib=16 * 1024)])
    st.apply(Allocation("big", (0,), 200, (40 * 1024,), QoSClass.BURSTABLE, 1000, 1024, gpu_memory_request_mib=40 * 1024))
    st.apply(Allocation("small", (0,), 200, (4 * 1024,), QoSClass.BURSTABLE, 1000, 1024, gpu_memory_request_mib=4 * 1024))
    req = PodRequest(gpu_count=1, gpu_milli=200, gpu_memory_mib=8 * 1024, cpu_milli=1000, memory_mib=1024)
    ctx = fit(st, req, np.arange(2))
    # big: before, A and B both use the GPU (40 >= 40 GiB, 40 >= 4): N F = 0. After, 600 milli
    #   and 32 GiB free: A can no longer use it (32 < 40), the node cannot run A: N F = 600.
    #   dF = 600 / 2 = 300, sigmoid(-0.3) = 0.4256 -> 42.
    # small: before, A cannot use 12 GiB: N F = 800 (A) + 0 (B); after, 600 milli and 4 GiB:
    #   A 600, B still fits (4 >= 4): N F = 600, dF = -100, sigmoid(0.1) = 0.5250 -> 52.
    # Blind to memory both GPUs keep every type: dF = 0 on both -> 50 / 50, and the tie goes
    # to the lowest row, the 80 GiB GPU that the 40 GiB pods need.
    assert fgd.gpu_score(ctx)[:, 0].tolist() == pytest.approx([0.42, 0.52])
    assert fgd.node_score(ctx, np.array([[True], [True]])).tolist() == pytest.approx([0.42, 0.52])
    assert [_fgd_score(st, r, req, (0,)) for r in range(2)] == pytest.approx([0.42, 0.52])


def test_multi_gpu_reserve_packs_in_proportion_to_multi_gpu_demand() -> None:
    from scoring.strategies import multi_gpu_reserve

    # Demand: four pods of 1 whole GPU and one of 2 whole GPUs.
    # s = (1/5 * 2 * 1000) / (1/5 * 2000 + 4/5 * 1000) = 400 / 1200 = 1/3
    # strength = min(1, (s / 0.5)^2) = (2/3)^2 = 0.4444
    st = ClusterState.from_nodes([gpu_node("a", 2), gpu_node("b", 8)])
    st.apply(Allocation("b", (0, 1), 1000, (0, 0), QoSClass.BURSTABLE, 1000, 1024))
    st.apply(Allocation("a", (0,), 1000, (0,), QoSClass.BURSTABLE, 1000, 1024))
    for col in (2, 3, 4):
        st.apply(Allocation("b", (col,), 1000, (0,), QoSClass.BURSTABLE, 1000, 1024))
    ctx = fit(st, PodRequest(1), np.arange(2))
    assert multi_gpu_share(ctx.tasks) == pytest.approx(1 / 3)
    # a: (1000 + 1000) / 2000 = 1.0 -> 0.4444 ; b: (5000 + 1000) / 8000 = 0.75 -> 0.3333
    chosen = np.zeros(ctx.gpu_fits.shape, dtype=bool)
    np.testing.assert_allclose(multi_gpu_reserve.node_score(ctx, chosen), [4 / 9, 0.75 * 4 / 9])
    # Only single-GPU demand: the term is off.
    st1 = ClusterState.from_nodes([gpu_node("a", 2)])
    st1.apply(Allocation("a", (0,), 1000, (0,), QoSClass.BURSTABLE, 1000, 1024))
    ctx1 = fit(st1, PodRequest(1), np.arange(1))
    assert multi_gpu_reserve.node_score(ctx1, np.zeros(ctx1.gpu_fits.shape, dtype=bool)).tolist() == [0.0]


@pytest.mark.parametrize("name", [n for n, s in STRATEGIES.items() if s.one_gpu_node_score_is_gpu_score])
def test_one_gpu_node_score_is_the_chosen_gpus_score(name: str, rng: np.random.Generator) -> None:
    # The scorer reuses gpu_score as the node score for one-GPU pods when a strategy declares
    # ONE_GPU_NODE_SCORE_IS_GPU_SCORE: the two must be the same number, bit for bit.
    strat = STRATEGIES[name]
    compared = 0
    for _ in range(30):
        st = random_state(rng)
        for _ in range(10):
            req = random_request(rng)
            if req.gpu_count != 1:
                continue
            ctx = fit(st, req, np.arange(st.n_nodes))
            assert strat.gpu_score is not None and strat.node_score is not None
            per_gpu = strat.gpu_score(ctx)
            for row, col in zip(*np.nonzero(ctx.gpu_fits & ctx.node_fits[:, None]), strict=True):
                chosen = np.zeros(ctx.gpu_fits.shape, dtype=bool)
                chosen[row, col] = True
                assert strat.node_score(ctx, chosen)[row] == per_gpu[row, col]
                compared += 1
    assert compared > 200
