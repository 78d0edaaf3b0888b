"""The replay's emulation of kube-scheduler: arithmetic of the in-tree scores, node search."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.scheduler_emulation import Profile, SchedulerView

REPO = Path(__file__).resolve().parents[2]


def view(pct: int = 100, n: int = 2) -> SchedulerView:
    prof = Profile(extender_weight=200, node_cache_capable=True, percentage_of_nodes_to_score=pct)
    return SchedulerView(np.full(n, 4000), np.full(n, 8192), np.full(n, 8), prof, np.random.default_rng(0))


def test_shipped_profile_is_read() -> None:
    p = Profile.from_file(REPO / "scheduler-config.yaml")
    assert (p.extender_weight, p.node_cache_capable, p.percentage_of_nodes_to_score) == (200, True, 100)
    assert (p.fit_strategy, p.fit_weight, p.balanced_weight) == ("LeastAllocated", 1, 1)
    assert p.extender_all_pods  # no managedResources: CPU-only pods reach gpufrac too


def test_simulator_profile_sends_every_pod_and_disables_in_tree_scores() -> None:
    p = Profile.from_file(REPO / "benchmarks" / "scheduler-config-simulator.yaml")
    assert p.extender_all_pods
    assert (p.fit_weight, p.balanced_weight, p.percentage_of_nodes_to_score) == (0, 0, 100)


def test_least_allocated_and_balanced_arithmetic() -> None:
    v = view()
    v.assume(1, 2000, 2048, 0)
    s = v.in_tree_scores(np.array([0, 1]), 1000, 2048)
    # node 0: cpu (4000-1000)*100/4000 = 75, mem (8192-2048)*100/8192 = 75 -> fit 75;
    #         fractions 0.25, 0.25 -> std 0 -> balanced 100 ; total 175
    # node 1: cpu (4000-3000)*100/4000 = 25, mem (8192-4096)*100/8192 = 50 -> fit (25+50)//2 = 37;
    #         fractions 0.75, 0.5 -> std 0.125 -> balanced int(87.5) = 87 ; total 124
    assert s.tolist() == [175, 124]


def test_pods_without_requests_count_as_defaults() -> None:
    # 0 cpu/mem counts as 100m / 200Mi: cpu (4000-100)*100//4000 = 97, mem (8192-200)*100//8192 = 97
    # -> fit 97; fractions 0.025 and 0.0244 -> std 0.0003 -> balanced int(99.97) = 99
    assert view().in_tree_scores(np.array([0]), 0, 0)[0] == 97 + 99


def test_feasible_cuts_to_percentage_and_rotates() -> None:
    v = view(pct=0, n=300)
    # 300 nodes < 100 minimum? no: adaptive 50 - 300//125 = 48% -> 144 nodes, at least 100
    first = v.feasible(100, 100, 0)
    assert first.shape == (144,) and first[0] == 0
    second = v.feasible(100, 100, 0)
    assert second[0] == 144  # next cycle starts where the previous one stopped
    assert view(pct=100, n=300).feasible(100, 100, 0).shape == (300,)


def test_in_tree_fit_counts_slots_cpu_and_pods() -> None:
    v = view()
    v.assume(0, 3900, 0, 8)
    assert v.feasible(200, 0, 0).tolist() == [1]
    assert v.feasible(0, 0, 1).tolist() == [1]  # node 0's 8 gpufrac.io/gpu slots are used


def test_select_breaks_ties_at_random_with_the_seed() -> None:
    v = view()
    many = [v.select(np.array([3, 5, 7]), np.array([9, 9, 1])) for _ in range(50)]
    assert set(many) == {3, 5}
    again = view()
    assert [again.select(np.array([3, 5, 7]), np.array([9, 9, 1])) for _ in range(50)] == many
