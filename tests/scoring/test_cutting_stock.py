"""The cutting-stock duals (scoring.cutting_stock) and the gap-price term built on them."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from scoring import PRESETS, build_scorer, gaps
from scoring.cutting_stock import priced_waste, shadow_prices
from scoring.fit import FitContext, fit
from scoring.fragmentation import TaskTypes
from scoring.request import PodRequest, QoSClass, model_mask
from scoring.specs import Allocation
from scoring.state import ClusterState
from scoring.strategies import gap_price
from scoring.workload import WorkloadModel
from tests.conftest import gpu_node
from tests.scoring.reference import _gap_price_score


def test_shadow_prices_of_a_saturated_pairing() -> None:
    # 10 GPUs, 12 pods of 700 milli, 6 of 300. Best: 6 GPUs of 700 + 300 and 4 of a lone
    # 700 = 6 * 1000 + 4 * 700 = 8800 milli; two 700s are left out, so one more 700 is worth
    # nothing (y_700 = 0), one more GPU holds a lone 700 (y_G = 700), and 700 + 300 prices
    # to zero reduced cost: 1000 - y_G - y_700 - y_300 = 0 -> y_300 = 300.
    # Duality: 10 * 700 + 12 * 0 + 6 * 300 = 8800, the primal optimum.
    gpu_price, size_price = shadow_prices(np.array([300, 700]), np.array([6.0, 12.0]), 10)
    assert gpu_price == pytest.approx(700)
    np.testing.assert_allclose(size_price, [300, 0], atol=1e-9)


def test_shadow_prices_with_room_to_spare() -> None:
    # 10 GPUs, 3 pods of 700 and 3 of 300: all fit (3 GPUs), so a GPU is worth nothing more
    # and each pod is worth its own share.
    gpu_price, size_price = shadow_prices(np.array([300, 700]), np.array([3.0, 3.0]), 10)
    assert gpu_price == pytest.approx(0)
    np.testing.assert_allclose(size_price, [300, 700], atol=1e-9)
    gpu_price, size_price = shadow_prices(np.array([], dtype=np.int64), np.array([]), 10)
    assert gpu_price == 0.0 and size_price.shape == (0,)


def _patterns(sizes: list[int]) -> list[tuple[int, ...]]:
    """Every multiset of ``sizes`` within 1000 milli, as counts per size (brute force)."""
    out = []
    ranges = [range(1000 // s + 1) for s in sizes]
    for counts in itertools.product(*ranges):
        if sum(c * s for c, s in zip(counts, sizes, strict=True)) <= 1000:
            out.append(counts)
    return out


def test_shadow_prices_are_optimal_duals(rng: np.random.Generator) -> None:
    # Optimality without trusting the solver: the duals are feasible (y >= 0 and no bin
    # pattern, enumerated by brute force, is worth more than y_G at these prices) and
    # their objective G y_G + sum_s n_s y_s equals the primal optimum HiGHS finds for the
    # same LP (benchmarks.floor, whole GPUs as the 1000-milli size).
    from benchmarks.floor import ArrivedGpuDemand, max_allocated_milli

    checked = 0
    for _ in range(60):
        sizes = sorted(rng.choice(np.arange(150, 1001, 10), size=int(rng.integers(1, 5)), replace=False).tolist())
        pods = rng.integers(1, 40, size=len(sizes))
        n_gpus = int(rng.integers(1, 30))
        gpu_price, size_price = shadow_prices(np.array(sizes), pods.astype(float), n_gpus)
        assert gpu_price >= 0 and (size_price >= 0).all()
        for pattern in _patterns(sizes):
            value = sum(c * (s - y) for c, s, y in zip(pattern, sizes, size_price, strict=True))
            assert value <= gpu_price + 1e-6, (sizes, pods, n_gpus, pattern)
        by_size = dict(zip(sizes, pods.tolist(), strict=True))
        whole = {1: by_size.pop(1000)} if 1000 in by_size else {}
        demand = ArrivedGpuDemand(by_size, whole)
        dual = n_gpus * gpu_price + float(pods @ size_price)
        assert dual == pytest.approx(max_allocated_milli(demand, n_gpus), rel=1e-9, abs=1e-6)
        checked += gpu_price > 0  # saturated instances, where the prices say something
    assert checked > 10


def test_priced_waste_of_openb_prices() -> None:
    # The duals of openb default, seed 42 (scoring.cutting_stock notes), y_G = 810:
    sizes = np.array([110, 160, 220, 230, 320, 350, 470, 550, 650, 810, 1000])
    price = np.array([110, 160, 152.5, 27.5, 50, 80, 65, 10, 110, 0, 190])
    u = priced_waste(sizes, price)
    # U(f) = min(f, min_s y_s + U(f - s)):
    # U(120)  = min(120, 110 + U(10) = 120)                                    = 120
    # U(350)  = min(350, y_320 + U(30) = 80, y_350 + U(0) = 80, ...)           = 80
    # U(530)  = y_470 + U(60) = 65 + 60 = 125 (230 + 230 + 70: 27.5 * 2 + 70 = 125 too)
    # U(770)  = y_550 + y_220 = 10 + 152.5 = 162.5 (470 + 230 + 70: 65 + 27.5 + 70 = 162.5)
    # U(1000) = min(y_1000 = 190, y_810 + U(190) = 0 + 190, 2 y_470 + U(60) = 190) = 190
    assert [u[f] for f in (0, 120, 350, 530, 770, 1000)] == pytest.approx([0, 120, 80, 125, 162.5, 190])
    # So a 230-milli pod costs U(770) - U(1000) = -27.5 on an empty GPU and
    # U(120) - U(350) = 40 in the gap beside a 650-milli pod: the empty GPU wins.
    assert u[770] - u[1000] < u[120] - u[350]
    assert (u >= 0).all() and (u <= np.arange(1001)).all()


def test_priced_waste_matches_the_recursion(rng: np.random.Generator) -> None:
    # priced_waste computes U in blocks of the smallest share; the scalar recursion gives the
    # same floats for block sizes from 1 milli to 1000.
    for trial in range(100):
        pool = np.arange(1, 1001) if trial % 2 else np.array([1, 50, 320, 470, 810, 1000])
        sizes = np.unique(rng.choice(pool, size=int(rng.integers(1, 7))))
        price = rng.uniform(0, 1, size=sizes.shape[0]) * sizes
        u = [0.0]
        for f in range(1, 1001):
            u.append(min([float(f), *(y + u[f - s] for s, y in zip(sizes.tolist(), price.tolist(), strict=True)
                                      if s <= f)]))
        assert np.array_equal(priced_waste(sizes, price), np.array(u)), sizes


def test_gap_price_keeps_small_pods_for_the_gaps_that_need_them() -> None:
    # a: GPU0 holds a 700-milli pod, GPU1 a 300; b: GPU0 a 700, GPU1-3 empty. 6 GPUs.
    # Workload {700: 2, 300: 1}, GPU share 1700, scaled to 6 * 1000: n_700 = 7.06 and
    # n_300 = 3.53, rounded to powers of 1.05: 1.05^40 = 7.04 and 1.05^26 = 3.56. The LP
    # pairs every 300 with a 700 (3.56 GPUs) and fills the other 2.44 GPUs with lone 700s,
    # 700s left over: y_700 = 0, y_G = 700, y_300 = 300. Then U(300) = 300, U(400) = 400,
    # U(700) = 0, U(1000) = min(y_700 + U(300), y_300 + U(700)) = 300. A 300-milli pod:
    # beside a 700 (300 -> 0):   U(0) - U(300)    = -300 -> 0.5 + 300/2000 = 0.65
    # beside the 300 (700 -> 400): U(400) - U(700) = 400 -> 0.5 - 400/2000 = 0.3
    # empty GPU (1000 -> 700):    U(700) - U(1000) = -300 -> 0.65
    st = ClusterState.from_nodes([gpu_node("a", 2), gpu_node("b", 4)])
    for node, col, milli in (("a", 0, 700), ("a", 1, 300), ("b", 0, 700)):
        st.apply(Allocation(node, (col,), milli, (0,), QoSClass.BURSTABLE, 1000, 1024))
    ctx = fit(st, PodRequest(1, 300, gpu_memory_mib=0), np.array([0, 1]))
    assert ctx.gpus_by_model == (6,)
    u = gaps.gap_waste(tasks_of(ctx), 6)
    assert [u[f] for f in (300, 400, 700, 1000)] == pytest.approx([300, 400, 0, 300])
    np.testing.assert_allclose(gap_price.gpu_score(ctx), [[0.65, 0.3, 0, 0], [0.65, 0.65, 0.65, 0.65]])
    # before any GPU pod every fitting GPU is neutral
    empty = ClusterState.from_nodes([gpu_node("a", 2)])
    assert gap_price.gpu_score(fit(empty, PodRequest(1, 100), np.arange(1))).tolist() == [[0.5, 0.5]]


def test_a_rare_model_pod_keeps_its_gpu_under_per_model_prices() -> None:
    # a: 2 x T4, GPU0 holds a whole-GPU pod that accepts only T4. b: 2 x V100M32, GPU0 holds
    # a 500-milli pod that accepts any model. 4 GPUs, 2 free ones.
    # Workload {(1000, T4 only): 1, (500, any): 1}, share 1500 scaled to 4000: 2.67 pods of
    # each, rounded 1.05^20 = 2.65. One LP, a bin kind per model:
    #   T4 (2 GPUs) is the only model the 1000s accept: 2 of their 2.65 fit, both T4s full;
    #   the 500s go two by two on V100M32: 1.33 of its 2 GPUs. Optimum 2000 + 1326.6.
    #   Slack rows price 0: y_1000 = 0 (1000s left over), y_V100 = 0 (V100 left over).
    #   Patterns in use price to zero reduced cost: y_T4 = 1000 - y_1000 = 1000,
    #   2 y_500 = 1000 - y_V100 -> y_500 = 500.
    # U_T4 over both classes: U(500) = min(500, y_500) = 500, U(1000) = min(1000, y_1000 + U(0),
    #   y_500 + U(500)) = 0: an empty T4 is worth a whole pod that can go nowhere else.
    # U_V100 over the 500s: U(500) = 500, U(1000) = min(1000, 500 + 500) = 1000.
    # Another 500-milli pod (any model):
    #   a/GPU1, empty T4 (1000 -> 500):   U_T4(500) - U_T4(1000)   = 500  -> 0.5 - 500/2000 = 0.25
    #   b/GPU0, beside the 500 (500 -> 0): U_V100(0) - U_V100(500)  = -500 -> 0.75
    #   b/GPU1, empty V100 (1000 -> 500): U_V100(500) - U_V100(1000) = -500 -> 0.75
    #   a/GPU0 is full -> 0.
    # Blind to models (one LP, 4 GPUs, 2.65 x 1500 = 3980 <= 4000: everything fits, y_s = s):
    # U(f) = f everywhere, every free GPU scores 0.75, and the lowest row (a, the T4) wins
    # the tie: the T4-only pod would find no GPU.
    st = ClusterState.from_nodes([gpu_node("a", 2), gpu_node("b", 2, model="V100M32", memory_mib=32768)])
    t4, v100 = st.models.index("T4"), st.models.index("V100M32")
    st.apply(Allocation("a", (0,), 1000, (0,), QoSClass.BURSTABLE, 1000, 1024, model_mask(frozenset({t4}))))
    st.apply(Allocation("b", (0,), 500, (0,), QoSClass.BURSTABLE, 1000, 1024))
    req = PodRequest(1, 500, gpu_memory_mib=0)
    ctx = fit(st, req, np.arange(2))
    tasks = tasks_of(ctx)
    assert ctx.gpus_by_kind == ((t4, 2, 2), (v100, 2, 2))  # (model, GPUs of the node, GPUs)
    u_t4, u_v100, _ = gaps.joint_gap_waste(tasks, ctx.gpus_by_kind)
    assert [u_t4[f] for f in (500, 1000)] == pytest.approx([500, 0])
    assert [u_v100[f] for f in (500, 1000)] == pytest.approx([500, 1000])
    g = gap_price.gpu_score(ctx)
    np.testing.assert_allclose(g, [[0, 0.25], [0.75, 0.75]])
    np.testing.assert_allclose([[_gap_price_score(st, r, c, req) if ctx.gpu_fits[r, c] else 0.0
                                 for c in range(2)] for r in range(2)], g)
    assert gaps.gap_waste(tasks, 4)[1000] == pytest.approx(1000)  # blind: the empty T4 is no loss
    # The whole shipped default sends the pod to b, and the T4-only pod still has a/GPU1.
    ev = build_scorer(PRESETS["default"]).evaluate(st, req, np.arange(2))
    assert ev.best() == 1
    rare = PodRequest(1, 1000, gpu_memory_mib=0, allowed_models=frozenset({t4}))
    assert fit(st, rare, np.arange(2)).gpu_fits[0].tolist() == [False, True]



def test_a_pod_that_needs_a_large_gpus_memory_keeps_it_under_per_kind_prices() -> None:
    # The rare-model case above with GPU memory in the place of the model (issue 41, item
    # 5): a: 2 x 80 GiB GPUs, GPU0 holds a whole-GPU pod asking 40 GiB (gpufrac.io/memory),
    # which no 16 GiB GPU can hold; b: 2 x 16 GiB GPUs, GPU0 holds a 500-milli pod asking a
    # share's proportion. Every pod accepts every model.
    # Demand rows: (1, 500, any, 0 MiB) and (1, 1000, any, 40 GiB). The 40 GiB pods may use
    # the 80 GiB kind only (memory_by_kind (81920, 16384) against 40960), the 500s both:
    # the same classes, LP and prices as the T4 case, so U_80(1000) = 0 (an empty 80 GiB GPU
    # is worth a pod only it can hold) and U_16(1000) = 1000.
    # Another 500-milli pod: a/GPU1 (1000 -> 500) 0.5 - 500/2000 = 0.25; b/GPU0 (500 -> 0)
    # and b/GPU1 (1000 -> 500) -500 -> 0.75.
    # Blind to memory (the old demand rows): one LP, U(f) = f, every free GPU 0.75, and the
    # lowest row (a) wins the tie: the next 40 GiB pod would find no GPU.
    st = ClusterState.from_nodes([gpu_node("a", 2, model="A100-80GB", memory_mib=81920),
                                  gpu_node("b", 2, model="T4", memory_mib=16384)])
    st.apply(Allocation("a", (0,), 1000, (40960,), QoSClass.BURSTABLE, 1000, 1024, gpu_memory_request_mib=40960))
    st.apply(Allocation("b", (0,), 500, (8192,), QoSClass.BURSTABLE, 1000, 1024))
    req = PodRequest(1, 500, gpu_memory_mib=0)
    ctx = fit(st, req, np.arange(2))
    tasks = tasks_of(ctx)
    assert tasks.demand == ((1, 500, -1, 0, 1), (1, 1000, -1, 40960, 1))
    assert ctx.memory_by_kind == (81920, 16384) and gaps.restricted(tasks, ctx.memory_by_kind)
    assert not gaps.restricted(tasks)  # models alone: nothing restricted
    u_80, u_16, _ = gaps.model_waste(ctx)
    assert [u_80[f] for f in (500, 1000)] == pytest.approx([500, 0])
    assert [u_16[f] for f in (500, 1000)] == pytest.approx([500, 1000])
    g = gap_price.gpu_score(ctx)
    np.testing.assert_allclose(g, [[0, 0.25], [0.75, 0.75]])
    np.testing.assert_allclose([[_gap_price_score(st, r, c, req) if ctx.gpu_fits[r, c] else 0.0
                                 for c in range(2)] for r in range(2)], g)
    assert gaps.gap_waste(tasks, 4)[1000] == pytest.approx(1000)  # blind: the empty 80 GiB GPU is no loss
    assert build_scorer(PRESETS["default"]).evaluate(st, req, np.arange(2)).best() == 1

def test_per_model_prices_see_restricted_pods_beyond_the_frequent_types() -> None:
    # The rare-model state above with a workload cut to its most frequent type: the
    # 500-milli any-model pod (ties break on the key: (1, 500, ...) < (1, 1000, ...)). The
    # T4-only pod is in the tail, so the types alone look unrestricted, but
    # TaskTypes.demand holds every pod: the joint LP still sees it and prices as above.
    st = ClusterState.from_nodes([gpu_node("a", 2), gpu_node("b", 2, model="V100M32", memory_mib=32768)])
    t4 = st.models.index("T4")
    t4_only = model_mask(frozenset({t4}))
    st.apply(Allocation("a", (0,), 1000, (0,), QoSClass.BURSTABLE, 1000, 1024, t4_only))
    st.apply(Allocation("b", (0,), 500, (0,), QoSClass.BURSTABLE, 1000, 1024))
    top = WorkloadModel(max_types=1)
    top.add((1, 1000, 1000, 1024, t4_only, 0), 1)
    top.add((1, 500, 1000, 1024, -1, 0), 1)
    tasks = top.task_types()
    assert tasks is not None and tasks.gpu_milli.tolist() == [500] and tasks.model_mask is None
    assert tasks.demand == ((1, 500, -1, 0, 1), (1, 1000, t4_only, 0, 1))
    assert gaps.restricted(tasks)
    ctx = replace(fit(st, PodRequest(1, 500, gpu_memory_mib=0), np.arange(2)), tasks=tasks)
    u_t4, u_v100, _ = gaps.model_waste(ctx)
    assert [u_t4[f] for f in (500, 1000)] == pytest.approx([500, 0])
    assert [u_v100[f] for f in (500, 1000)] == pytest.approx([500, 1000])
    np.testing.assert_allclose(gap_price.gpu_score(ctx), [[0, 0.25], [0.75, 0.75]])


def test_joint_prices_are_kept_while_the_demand_barely_moves() -> None:
    # 100 T4-only whole pods and 100 any-model 500-milli pods on the state above: shares
    # 1000 * 100 / 150000 = 2/3 and 500 * 100 / 150000 = 1/3. One more 500-milli pod: 50500 /
    # 150500 = 0.3355, total variation 1/2 * 2 * 0.0022 = 0.0022 <= JOINT_DRIFT (0.02): the
    # last prices are kept (the same arrays, no LP). 20 more: 60000 / 160000 = 0.375,
    # 1/2 * 2 * 0.0417 = 0.0417 > 0.02: solved again.
    st = ClusterState.from_nodes([gpu_node("a", 2), gpu_node("b", 2, model="V100M32", memory_mib=32768)])
    kinds = st.gpus_by_kind
    t4_only = model_mask(frozenset({st.models.index("T4")}))

    def workload(extra: int) -> TaskTypes:
        w = WorkloadModel()
        for _ in range(100):
            w.add((1, 1000, 1000, 1024, t4_only, 0), 1)
        for _ in range(100 + extra):
            w.add((1, 500, 1000, 1024, -1, 0), 1)
        t = w.task_types()
        assert t is not None
        return t

    memo = gaps.GapMemo()  # one owner's, kept across the calls
    first = gaps.joint_gap_waste(workload(0), kinds, memo)
    assert gaps.joint_gap_waste(workload(1), kinds, memo) is first
    moved = gaps.joint_gap_waste(workload(20), kinds, memo)
    assert moved is not first
    assert gaps.joint_gap_waste(workload(1), kinds, gaps.GapMemo()) is not first  # solved afresh: the same prices
    np.testing.assert_array_equal(np.stack(gaps.joint_gap_waste(workload(1), kinds)), np.stack(first))


def _model_patterns(sizes: list[int], on: list[bool]) -> list[tuple[int, ...]]:
    """Every multiset of the classes ``on`` within 1000 milli (brute force)."""
    return [p for p in _patterns(sizes) if all(c == 0 or ok for c, ok in zip(p, on, strict=True))]


def test_model_shadow_prices_match_highs(rng: np.random.Generator) -> None:
    # The LP with a bin kind per model (scoring.cutting_stock.shadow_prices_by_model) against
    # HiGHS on the same LP (benchmarks.floor.model_pattern_lp, every pattern enumerated):
    # the numpy duals are feasible (no pattern of model j is worth more than y_j at them),
    # their objective sum_j G_j y_j + sum_c n_c y_c is HiGHS's primal optimum (so they are
    # optimal duals), and they are HiGHS's own duals wherever the two solvers agree on a vertex.
    from benchmarks.floor import ModelGpuDemand, model_pattern_lp
    from scoring.cutting_stock import shadow_prices_by_model

    compared = 0
    for _ in range(40):
        n_cls, n_mod = int(rng.integers(1, 5)), int(rng.integers(1, 4))
        sizes = sorted(rng.choice(np.arange(200, 1001, 50), size=n_cls, replace=False).tolist())
        allowed = rng.random((n_cls, n_mod)) < 0.6
        allowed[np.arange(n_cls), rng.integers(0, n_mod, size=n_cls)] = True
        pods = rng.integers(1, 30, size=n_cls).astype(float)
        n_gpus = rng.integers(0, 15, size=n_mod).astype(float)
        y_gpu, y_cls = shadow_prices_by_model(np.array(sizes), allowed, pods, n_gpus)
        assert (y_gpu >= 0).all() and (y_cls >= 0).all()
        names = [f"m{j}" for j in range(n_mod)]
        demand = ModelGpuDemand({(s, frozenset(n for n, ok in zip(names, allowed[c], strict=True) if ok)): int(pods[c])
                                 for c, s in enumerate(sizes)}, {})
        columns = []
        for j in range(n_mod):
            for pat in _model_patterns(sizes, allowed[:, j].tolist()):
                if any(pat):
                    columns.append((j, np.array(pat, dtype=np.int64)))
                    value = sum(c * (s - y) for c, s, y in zip(pat, sizes, y_cls, strict=True))
                    assert value <= y_gpu[j] + 1e-6 or n_gpus[j] == 0, (sizes, allowed, pods, n_gpus, pat)
        optimum, highs = model_pattern_lp(columns, demand, dict(zip(names, n_gpus.astype(int).tolist(), strict=True)))
        dual = float(n_gpus @ y_gpu + pods @ y_cls)
        assert dual == pytest.approx(optimum, rel=1e-9, abs=1e-6)
        if np.allclose(highs, np.concatenate([y_gpu, y_cls]), atol=1e-6):
            compared += 1
    # Where the dual optimum is not unique (a model with no GPUs, degenerate vertices) the two
    # solvers may return different optimal duals; on this seed 37 of 40 agree exactly.
    assert compared >= 30


def tasks_of(ctx: FitContext) -> TaskTypes:
    """The context's learned workload (these tests place pods first, so there is one)."""
    assert ctx.tasks is not None
    return ctx.tasks


def test_whether_the_workload_is_restricted_is_asked_again_when_the_workload_changes() -> None:
    # One memo over three evaluations: any-model workload (one price table), a workload with
    # a T4-only pod (a table per GPU kind), the first again (one table): the memo's answer
    # follows the workload object, never the last one's.
    from scoring.memo import Memo

    st = ClusterState.from_nodes([gpu_node("a", 2), gpu_node("b", 2, model="V100M32", memory_mib=32768)])
    t4_only = model_mask(frozenset({st.models.index("T4")}))
    free = WorkloadModel()
    free.add((1, 500, 1000, 1024, -1, 0), 1)
    some = WorkloadModel()
    some.add((1, 500, 1000, 1024, -1, 0), 1)
    some.add((1, 1000, 1000, 1024, t4_only, 0), 1)
    memo = Memo()
    ctx = fit(st, PodRequest(1, 500, gpu_memory_mib=0), np.arange(2), memo=memo)
    any_model, one_model = free.task_types(), some.task_types()
    assert any_model is not None and one_model is not None
    tables = [len(gaps.model_waste(replace(ctx, tasks=t))) for t in (any_model, one_model, any_model)]
    assert tables == [1, len(ctx.gpus_by_kind) + 1, 1]
