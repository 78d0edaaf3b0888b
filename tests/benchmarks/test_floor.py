"""The cutting-stock floor: worked examples, and column generation against every pattern."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from benchmarks import constrain, floor, trace
from benchmarks.floor import ArrivedGpuDemand, box_lp, max_allocated_milli, share, work_conserving
from extender.clusterfile import load_cluster_file


@pytest.mark.parametrize(("demand", "n_gpus", "expected"), [
    # 810 + 160 share one GPU (970), the other 810 is alone: 970 + 810.
    (ArrivedGpuDemand({810: 2, 160: 1}, {}), 2, 1780.0),
    # A whole GPU pod beats the second 810: 1000 + 810; the other 810 fails.
    (ArrivedGpuDemand({810: 2}, {1: 1}), 2, 1810.0),
    # Four 500s fill two GPUs exactly; the 2-GPU pod takes the other two: 2000 + 2000.
    (ArrivedGpuDemand({500: 4}, {2: 1}), 4, 4000.0),
    # No two 600s fit one GPU: two GPUs hold two of the three (600 + 600).
    (ArrivedGpuDemand({600: 3}, {}), 2, 1200.0),
    # Nothing asked: nothing allocated.
    (ArrivedGpuDemand({}, {}), 3, 0.0),
    # Only whole pods, 12 GPUs asked of 4: at most 4000 (every GPU full; the LP may take half
    # of the 8-GPU pod instead of the small ones, the value is the same).
    (ArrivedGpuDemand({}, {8: 1, 2: 1, 1: 2}), 4, 4000.0),
])
def test_worked_examples(demand: ArrivedGpuDemand, n_gpus: int, expected: float) -> None:
    assert max_allocated_milli(demand, n_gpus) == pytest.approx(expected, abs=1e-6)


def _every_pattern_lp(demand: ArrivedGpuDemand, n_gpus: int) -> float:
    """The same LP with every pattern enumerated up front (small instances only)."""
    sizes = sorted(demand.fractional)
    ranges = [range(min(demand.fractional[r], 1000 // r) + 1) for r in sizes]
    pats = np.array([c for c in itertools.product(*ranges)
                     if any(c) and np.dot(c, sizes) <= 1000], dtype=np.int64)
    return floor.pattern_lp(pats, demand, n_gpus)[0]


@pytest.mark.parametrize("seed", range(12))
def test_column_generation_matches_every_pattern(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sizes = rng.choice(np.arange(50, 1000, 10), size=int(rng.integers(2, 6)), replace=False)
    demand = ArrivedGpuDemand({int(r): int(rng.integers(1, 12)) for r in sizes},
                              {k: int(rng.integers(0, 4)) for k in (1, 2, 8) if rng.random() < 0.6})
    n_gpus = int(rng.integers(1, 25))
    assert max_allocated_milli(demand, n_gpus) == pytest.approx(_every_pattern_lp(demand, n_gpus), abs=1e-4)


def test_arrived_demand_stops_at_the_pod_that_reaches_capacity() -> None:
    pods = [trace.TracePod("a", 1000, 1, 1, 810, "", "LS"), trace.TracePod("b", 1000, 1, 0, 0, "", "LS"),
            trace.TracePod("c", 1000, 1, 2, 1000, "", "LS"), trace.TracePod("d", 1000, 1, 1, 500, "", "LS")]
    # 810 + 2000 = 2810 >= 2500: "c" is the last pod counted, "d" arrives after the 100 % point.
    d = floor.arrived_demand(pods, 2500)
    assert d.fractional == {810: 1} and d.whole == {2: 1} and d.milli == 2810


def test_the_openb_floor_is_the_810_milli_remainders() -> None:
    # openb default, seed 42: about 1,100 pods of 810 milli each leave 190 milli that only
    # the ~110 pods of 160 milli or less can use; the LP cannot do better than about 3.1 %.
    pods = trace.load_pods(trace.DEFAULT_PODS)
    pct = floor.unallocated_floor_pct(pods, 42, floor.bundled_gpu_count())
    assert 2.9 < pct < 3.3


T4, V100 = frozenset({"T4"}), frozenset({"V100"})
BOTH = T4 | V100


@pytest.mark.parametrize(("demand", "gpus", "expected"), [
    # One T4, one V100. Two whole pods that accept only T4: one fits (1000); the 500 takes
    # the V100: 1500. Blind to models both whole pods would fit: 2000.
    (floor.ModelGpuDemand({(500, BOTH): 1}, {(1, T4): 2}), {"T4": 1, "V100": 1}, 1500.0),
    # Two 600s that accept only V100 and a 400 that accepts both: the 400 joins a 600 on the
    # V100, the other 600 has no V100 left: 1000, the T4 stays empty.
    (floor.ModelGpuDemand({(600, V100): 2, (400, BOTH): 1}, {}), {"T4": 1, "V100": 1}, 1000.0),
    # A 2-GPU pod takes two GPUs of one model: two T4 + one V100 hold it on T4 and a 700 on
    # the V100: 2700.
    (floor.ModelGpuDemand({(700, BOTH): 1}, {(2, BOTH): 1}), {"T4": 2, "V100": 1}, 2700.0),
    # A class of a model with no GPUs gets nothing.
    (floor.ModelGpuDemand({(300, V100): 3}, {}), {"T4": 2, "V100": 0}, 0.0),
])
def test_worked_examples_with_models(demand: floor.ModelGpuDemand, gpus: dict[str, int], expected: float) -> None:
    assert floor.max_allocated_milli_by_model(demand, gpus) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("seed", range(8))
def test_model_column_generation_matches_every_pattern(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    names = ["A", "B", "C"][: int(rng.integers(1, 4))]

    def accepts() -> frozenset[str]:
        picked = frozenset(n for n in names if rng.random() < 0.5)
        return picked or frozenset({names[int(rng.integers(len(names)))]})

    classes = {(int(r), accepts()): int(rng.integers(1, 10))
               for r in rng.choice(np.arange(100, 1000, 50), size=int(rng.integers(1, 5)), replace=False)}
    demand = floor.ModelGpuDemand(classes, {(k, accepts()): int(rng.integers(1, 3)) for k in (1, 2) if rng.random() < 0.6})
    gpus = {n: int(rng.integers(0, 8)) for n in names}
    keys = sorted(classes, key=lambda c: (c[0], sorted(c[1])))
    sizes = [r for r, _ in keys]
    columns = []
    for j, m in enumerate(sorted(gpus)):
        ranges = [range(min(classes[c], 1000 // c[0]) + 1) if m in c[1] else range(1) for c in keys]
        columns += [(j, np.array(p, dtype=np.int64)) for p in itertools.product(*ranges)
                    if any(p) and np.dot(p, sizes) <= 1000]
    every = floor.model_pattern_lp(columns, demand, gpus)[0]
    assert floor.max_allocated_milli_by_model(demand, gpus) == pytest.approx(every, abs=1e-4)


def test_demand_without_models_is_the_plain_lp() -> None:
    pods = trace.load_pods(trace.DEFAULT_PODS)[:3000]
    gpus = {"T4/8": 300, "V100/8": 200}  # 8-GPU nodes: every openb pod may use every kind
    seq = trace.arrival_sequence(pods, 7, 500_000)
    by_model = floor.arrived_model_demand(seq, 500_000, {"T4/8": ("T4", 8), "V100/8": ("V100", 8)})
    plain = by_model.any_model(sorted(gpus))
    assert plain == floor.arrived_demand(seq, 500_000)
    assert floor.max_allocated_milli_by_model(by_model, gpus) == pytest.approx(floor.max_allocated_milli(plain, 500),
                                                                                 rel=1e-9)


def test_a_pod_of_k_gpus_may_use_only_kinds_of_nodes_with_k() -> None:
    kinds = {"T4/2": ("T4", 2), "G2/8": ("G2", 8)}
    pods = [trace.TracePod("a", 1000, 1, 8, 1000, "", "LS"), trace.TracePod("b", 1000, 1, 1, 500, "", "LS"),
            trace.TracePod("c", 1000, 1, 2, 1000, "T4", "LS")]
    d = floor.arrived_model_demand(pods, 100_000, kinds)
    assert d.whole == {(8, frozenset({"G2/8"})): 1, (2, frozenset({"T4/2"})): 1}
    assert d.fractional == {(500, frozenset(kinds)): 1}
    # 2 T4 on 2-GPU nodes and 8 G2 on one 8-GPU node: the 8-GPU pod fits only on G2 (8000),
    # the T4-only pair on T4 (2000), the 500 nowhere: 10000 of 10500 asked.
    assert floor.max_allocated_milli_by_model(d, {"T4/2": 2, "G2/8": 8}) == pytest.approx(10_000)
    # With 4 G2 the relaxation takes half of the 8-GPU pod (4000, a pod's worth of share is
    # worth the same in any fraction) and the pair (2000); the 500 finds no room: 6000.
    assert floor.max_allocated_milli_by_model(d, {"T4/2": 2, "G2/8": 4}) == pytest.approx(6_000)


def _pods(*asks: tuple[int, int]) -> list[trace.TracePod]:
    """GPU pods in arrival order from (GPUs, milli per GPU)."""
    return [trace.TracePod(f"p{i}", 1000, 1, k, m, "", "LS") for i, (k, m) in enumerate(asks)]


@pytest.mark.parametrize(("asks", "n_gpus", "plain_pct", "work_conserving_pct"), [
    # 810, 810, then a whole pod, on 2 GPUs (capacity 2000; 2620 asked, all before the 100 %
    # point). The plain floor lets one 810 fail and gives its GPU to the whole pod:
    # 1000 + 810 = 1810, 9.5 % unallocated. A scheduler that places what fits puts both 810s
    # on a GPU each (each arrives while a GPU is empty); the whole pod then fits nowhere:
    # 1620, (2000 - 1620) / 2000 = 19 %.
    (((1, 810), (1, 810), (1, 1000)), 2, 9.5, 19.0),
    # Whole, 600, whole on 2 GPUs. Plain: both whole pods, 2000, 0 %. Work-conserving: the
    # first whole pod and the 600 are placed as they come, the second whole pod fails:
    # 1600, 20 %.
    (((1, 1000), (1, 600), (1, 1000)), 2, 0.0, 20.0),
    # 500, 500, 1000 on 2 GPUs: first fit puts both 500s on one GPU, the whole pod on the
    # other: nothing lost in either floor.
    (((1, 500), (1, 500), (1, 1000)), 2, 0.0, 0.0),
])
def test_work_conserving_worked_examples(asks: tuple[tuple[int, int], ...], n_gpus: int, plain_pct: float,
                                         work_conserving_pct: float) -> None:
    pods = _pods(*asks)
    capacity = 1000 * n_gpus
    plain = floor.max_allocated_milli(floor.arrived_demand(pods, capacity), n_gpus)
    assert 100 * (capacity - plain) / capacity == pytest.approx(plain_pct, abs=1e-6)
    got = floor.work_conserving_floor(floor.arrived_gpu_pods(pods, capacity), n_gpus)
    assert got.unallocated_pct == pytest.approx(work_conserving_pct, abs=1e-6)


def _first_fit_unallocated_pct(arrived: list[trace.TracePod], n_gpus: int, order: str) -> float:
    """A work-conserving scheduler on GPU share alone: every pod goes where it fits, if anywhere."""
    free = np.full(n_gpus, 1000)
    for p in arrived:
        if p.gpu_milli >= 1000:
            empty = np.flatnonzero(free == 1000)
            if empty.size >= p.num_gpu:
                free[empty[:p.num_gpu]] = 0
            continue
        fits = np.flatnonzero(free >= p.gpu_milli)
        if fits.size:
            g = fits[np.argmin(free[fits])] if order == "best" else fits[0]
            free[g] -= p.gpu_milli
    return 100.0 * float(free.sum()) / (1000 * n_gpus)


@pytest.mark.parametrize("seed", range(10))
def test_work_conserving_floor_bounds_greedy_schedulers_and_is_the_lowest_saturation_point(seed: int) -> None:
    rng = np.random.default_rng(300 + seed)
    n_gpus = int(rng.integers(2, 9))
    sizes = rng.choice(np.arange(100, 1000, 10), size=int(rng.integers(1, 5)), replace=False)
    asks = [(1, int(rng.choice(sizes))) if rng.random() < 0.6 else (int(rng.choice([1, 1, 2])), 1000)
            for _ in range(4 * n_gpus)]
    capacity = 1000 * n_gpus
    arrived = floor.arrived_gpu_pods(_pods(*asks), capacity)
    got = floor.work_conserving_floor(arrived, n_gpus)
    # Valid: first fit and best fit place every pod that fits, so neither goes below it.
    for order in ("first", "best"):
        assert got.unallocated_pct <= _first_fit_unallocated_pct(arrived, n_gpus, order) + 1e-6
    # Above the floor that may choose which pods fail.
    plain = floor.max_allocated_milli(floor.arrived_demand(arrived, capacity), n_gpus)
    assert got.unallocated_pct >= 100 * (capacity - plain) / capacity - 1e-6
    # Branch and bound finds the lowest point: the same as trying every a at that threshold.
    bounds = work_conserving._SaturationBounds(arrived)
    every = [share.column_generation(allowed, n_gpus, 10_000, required)
             for allowed, required in (bounds(a, a, got.theta_milli) for a in range(len(arrived) + 1))]
    best = max(value for value, extra in every if extra <= 1e-6)
    assert got.unallocated_pct == pytest.approx(100 * (capacity - best) / capacity, abs=1e-6)


def test_openb_work_conserving_floor_is_above_the_floor() -> None:
    # openb default, seed 42: a scheduler that places every pod some GPU can hold places the
    # 810-milli pods that arrive before the cluster is full (about 96 % arrived); each keeps
    # 190 milli that only the few pods of 160 milli or less can use. 3.67 % against 3.11 %.
    pods = trace.load_pods(trace.DEFAULT_PODS)
    n_gpus = floor.bundled_gpu_count()
    capacity = 1000 * n_gpus
    arrived = floor.arrived_gpu_pods(trace.arrival_sequence(pods, 42, capacity), capacity)
    got = floor.work_conserving_floor(arrived, n_gpus)
    plain = floor.unallocated_floor_pct(pods, 42, n_gpus)
    assert 3.5 < got.unallocated_pct < 3.8 and plain < 3.2
    assert 94.0 < got.saturated_arrived_pct < 98.0


def _model_greedy_unallocated_pct(arrived: list[trace.TracePod], models: list[str], order: str) -> float:
    """A work-conserving scheduler that respects models, on GPU share: each pod goes to the
    first, fullest or last GPU of a model it accepts with room (whole pods to empty GPUs)."""
    free = np.full(len(models), 1000)
    for p in arrived:
        ok = np.array([not p.gpu_spec or m in p.gpu_spec.split("|") for m in models])
        fits = np.flatnonzero((free >= p.gpu_milli) & ok)
        if p.gpu_milli >= 1000:
            if fits.size >= p.num_gpu:
                free[fits[:p.num_gpu]] = 0
            continue
        if fits.size:
            free[{"first": fits[0], "fullest": fits[np.argmin(free[fits])], "last": fits[-1]}[order]] -= p.gpu_milli
    return 100.0 * float(free.sum()) / (1000 * len(models))


@pytest.mark.parametrize("seed", range(10))
def test_the_model_constrained_relaxation_bounds_schedulers_that_respect_models(seed: int) -> None:
    # Pods restricted to one model are bounded from above only (they may fail while a GPU of
    # another model has room); the LP ignores models. Whatever GPU models the cluster has and
    # whichever pods accept them, a work-conserving scheduler that respects models never
    # leaves less unallocated than that floor, and the floor is never above the one of the
    # same pods with their restrictions dropped (fewer pods are sure to be placed).
    rng = np.random.default_rng(700 + seed)
    n_gpus = int(rng.integers(2, 9))
    models = [str(rng.choice(["T4", "A10"])) for _ in range(n_gpus)]
    sizes = rng.choice(np.arange(100, 1000, 10), size=int(rng.integers(1, 5)), replace=False)
    pods = []
    for i in range(4 * n_gpus):
        k, m = (1, int(rng.choice(sizes))) if rng.random() < 0.6 else (int(rng.choice([1, 1, 2])), 1000)
        spec = str(rng.choice(["T4", "A10"])) if rng.random() < 0.4 else ""
        pods.append(trace.TracePod(f"p{i}", 1000, 1, k, m, spec, "LS"))
    arrived = floor.arrived_gpu_pods(pods, 1000 * n_gpus)
    got = floor.work_conserving_floor(arrived, n_gpus).unallocated_pct
    assert got <= _model_greedy_unallocated_pct(arrived, models, "first") + 1e-6
    unrestricted = [dataclasses.replace(p, gpu_spec="") for p in arrived]
    assert got <= floor.work_conserving_floor(unrestricted, n_gpus).unallocated_pct + 1e-6


def test_a_restricted_pod_may_fail_while_another_model_has_room() -> None:
    # GPUs T4 and A10; two 600-milli pods that accept A10 only, then a whole GPU for anyone.
    # A scheduler that respects models: the first 600 on the A10, the second fits nowhere
    # (the empty T4 is not its model), the whole pod takes the T4: 1600 of 2000, 20 %.
    # The floor may not assume the second 600 is placed because "some GPU had 600 free" when
    # it came: with that assumption the best saturation point would hold both 600s and fail
    # the whole pod (1200, 40 %), above what the scheduler really leaves. Bounded from above
    # only, the 600 may fail: 600 + 1000, 20 %.
    pods = [trace.TracePod("a", 1000, 1, 1, 600, "A10", "LS"), trace.TracePod("b", 1000, 1, 1, 600, "A10", "LS"),
            trace.TracePod("w", 1000, 1, 1, 1000, "", "LS")]
    arrived = floor.arrived_gpu_pods(pods, 2000)
    assert _model_greedy_unallocated_pct(arrived, ["T4", "A10"], "first") == pytest.approx(20.0)
    assert floor.work_conserving_floor(arrived, 2).unallocated_pct == pytest.approx(20.0)


def test_a_saturation_point_per_model_counts_the_restricted_pods_that_fit() -> None:
    # GPUs A10 and T4, one each (capacity 2000). Pods: 700 for A10 only, 700 for T4 only, then
    # a whole GPU for anyone (2400 asked, all before the 100 % point). A work-conserving
    # scheduler that respects models puts each 700 on its own model's empty GPU; the whole
    # pod then fits nowhere: 1400 of 2000, 30 %.
    # The one-point floor may not count on the 700s (a GPU with 700 free may be of the wrong
    # model), so it lets one fail and places the whole pod: 1000 + 700, 15 %.
    # Per model: the A10 still has a GPU with 700 free when the first pod comes (t_A10 >= 1:
    # no pod before it could have filled it), the T4 when the second does (t_T4 >= 2: only the
    # second pod among the first two may use it), so both 700s are placed: 30 %, the
    # scheduler's own figure.
    pods = [trace.TracePod("a", 1000, 1, 1, 700, "A10", "LS"), trace.TracePod("t", 1000, 1, 1, 700, "T4", "LS"),
            trace.TracePod("w", 1000, 1, 1, 1000, "", "LS")]
    arrived = floor.arrived_gpu_pods(pods, 2000)
    assert _model_greedy_unallocated_pct(arrived, ["A10", "T4"], "first") == pytest.approx(30.0)
    assert floor.work_conserving_floor(arrived, 2).unallocated_pct == pytest.approx(15.0)
    got = floor.work_conserving_floor_by_model(arrived, {("A10", 1): 1, ("T4", 1): 1})
    assert got.unallocated_pct == pytest.approx(30.0)
    assert got.within_pct == 0.0


@pytest.mark.parametrize("seed", range(10))
def test_the_per_model_floor_bounds_schedulers_that_respect_models_and_is_the_least_point(seed: int) -> None:
    rng = np.random.default_rng(900 + seed)
    n_gpus = int(rng.integers(2, 6))
    models = [str(rng.choice(["T4", "A10"])) for _ in range(n_gpus)]
    sizes = rng.choice(np.arange(100, 1000, 10), size=int(rng.integers(1, 4)), replace=False)
    pods = []
    for i in range(3 * n_gpus):
        k, m = (1, int(rng.choice(sizes))) if rng.random() < 0.6 else (1, 1000)
        spec = str(rng.choice(["T4", "A10"])) if rng.random() < 0.4 else ""
        pods.append(trace.TracePod(f"p{i}", 1000, 1, k, m, spec, "LS"))
    arrived = floor.arrived_gpu_pods(pods, 1000 * n_gpus)
    gpus = {(m, 8): models.count(m) for m in set(models)}
    got = floor.work_conserving_floor_by_model(arrived, gpus)
    # Valid: no greedy scheduler that respects models leaves less.
    for order in ("first", "fullest", "last"):
        assert got.unallocated_pct <= _model_greedy_unallocated_pct(arrived, models, order) + 1e-6
    # Never below the one-point floor (it only adds bounds), and found exactly here.
    assert got.unallocated_pct >= floor.work_conserving_floor(arrived, n_gpus).unallocated_pct - 1e-6
    assert got.within_pct == 0.0
    # The least LP over every vector (t_g per model, their maximum last) at that threshold,
    # from the earliest points the search starts at (a model is not full before its GPUs
    # could be covered).
    kinds = sorted(gpus)
    group_of_kind = np.array([sorted(set(models)).index(m) for m, _ in kinds])
    classes = box_lp.ArrivalClasses(arrived, kinds, group_of_kind)
    lp = box_lp.BoxLp(classes, np.array([gpus[b] for b in kinds]), group_of_kind, got.theta_milli)
    earliest = classes.earliest(np.array([models.count(m) for m in sorted(set(models))]), got.theta_milli)
    values = []
    for t in itertools.product(*(range(int(e), len(arrived) + 1) for e in earliest)):
        point = np.array([*t, max(t)])
        values.append(lp.unallocated_pct(*classes.bounds(point, point, got.theta_milli), 1000 * n_gpus))
    assert got.unallocated_pct == pytest.approx(min(values), abs=1e-6)


def test_openb_per_model_floor_is_above_the_one_point_floor_on_a_constrained_list() -> None:
    # default-m33, seed 42: a third of the GPU pods accept 1-3 models. The one-point floor
    # lets every restricted pod fail (3.11 %, the plain floor); per model, the restricted
    # pods that arrive while their models still have room are placed.
    specs = load_cluster_file(trace.DEFAULT_NODES, replicas_per_gpu=1)
    pods = constrain.restrict_models(trace.load_pods(trace.DEFAULT_PODS), 33, specs)
    gpus = floor.bundled_gpu_kinds()
    capacity = 1000 * sum(gpus.values())
    arrived = floor.arrived_gpu_pods(trace.arrival_sequence(pods, 42, capacity), capacity)
    one_point = floor.work_conserving_floor(arrived, sum(gpus.values())).unallocated_pct
    got = floor.work_conserving_floor_by_model(
        arrived, gpus, groups=[frozenset({"G2"}), frozenset({"T4"}), frozenset({"A10", "G3", "P100", "V100M16", "V100M32"})])
    assert one_point < 3.2
    assert got.unallocated_pct > 3.4 and got.within_pct < 0.01
