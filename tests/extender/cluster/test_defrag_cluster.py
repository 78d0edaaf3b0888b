"""The defragmentation plan's cluster side (extender/cluster/defragmenter.py): PodDisruptionBudgets
read defensively, and the Defragmenter acting on a plan (fake evictions, a fake clock)."""

from __future__ import annotations

from typing import Any

import pytest

from extender.cache import GpuCache
from extender.cache.defrag import DefragPolicy
from extender.cache.moves import DisruptionBudget, Move
from extender.cluster.defragmenter import Defragmenter, budget_of, label_selector_matches
from extender.verbs.filter import ExtenderArgs, filter
from tests.extender.cache.test_defrag import bound, node, pod
from tests.extender.helpers import bestfit_cache, send_event

PODS = [("u1", {"app": "a", "tier": "x"}), ("u2", {"app": "b"}), ("u3", {})]


def pdb(selector: Any = None, allowed: Any = 1, generation: Any = 2, observed: Any = 2, **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "team", "generation": generation, **meta},
            "spec": {"selector": selector},
            "status": {"disruptionsAllowed": allowed, "observedGeneration": observed}}


@pytest.mark.parametrize(("selector", "covered"), [
    ({"matchLabels": {"app": "a"}}, {"u1"}),
    ({}, {"u1", "u2", "u3"}),  # policy/v1: an empty selector selects every pod of the namespace
    ({"matchExpressions": [{"key": "app", "operator": "In", "values": ["a", "b"]}]}, {"u1", "u2"}),
    ({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["a"]}]}, {"u2", "u3"}),
    ({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, {"u1"}),
    ({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}, {"u3"}),
])
def test_selectors_cover_what_kubernetes_says(selector: dict[str, Any], covered: set[str]) -> None:
    b = budget_of(pdb(selector), PODS)
    assert b is not None and b.pods == covered and b.allowed == 1 and b.key == "team/p"


def test_a_null_selector_covers_nothing() -> None:
    b = budget_of(pdb(None), PODS)
    assert b is not None and b.pods == frozenset()


@pytest.mark.parametrize("selector", [
    "app=a", {"matchLabels": ["app"]}, {"matchExpressions": [{"key": "app", "operator": "Near"}]},
    {"matchExpressions": [{"operator": "In", "values": ["a"]}]}, {"matchExpressions": "x"},
])
def test_an_unreadable_selector_protects_every_pod_of_the_namespace(selector: Any) -> None:
    b = budget_of(pdb(selector), PODS)
    assert b is not None and b.pods == {"u1", "u2", "u3"} and b.allowed == 0


@pytest.mark.parametrize(("allowed", "generation", "observed", "expect"), [
    (3, 2, 2, 3),
    (3, 3, 2, 0),       # the disruption controller has not processed this generation
    (3, 2, None, 0),    # no status yet
    ("3", 2, 2, 0),     # not an integer
    (True, 2, 2, 0),    # a boolean is not a count
    (-5, 2, 2, 0),
    (10**12, 2, 2, 1 << 20),
])
def test_disruptions_allowed_is_read_as_the_eviction_api_counts_it(allowed: Any, generation: Any, observed: Any,
                                                                   expect: int) -> None:
    b = budget_of(pdb({}, allowed, generation, observed), PODS)
    assert b is not None and b.allowed == expect


def test_a_budget_without_a_name_is_skipped_and_garbage_is_not_an_error() -> None:
    assert budget_of({"metadata": {"namespace": "team"}}, PODS) is None
    assert budget_of({"metadata": "x", "spec": [], "status": 7}, PODS) is None
    assert label_selector_matches(None, {}) is None


def fragmented() -> GpuCache:
    # a: 500 used (movable burstable), b: 500 used (bare, not movable). A whole-GPU guaranteed
    # pod waits for fragmentation (1000 free in sum); the plan frees a, moving a1 to b.
    cache = bestfit_cache([node("a"), node("b")])
    bound(cache, pod("a1", 500), "a", 0)
    bound(cache, pod("b1", 500, owner=None), "b", 0)
    send_event(cache, "ADDED", pod("big", 1000, qos="guaranteed"))
    return cache


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def defragmenter(cache: GpuCache, results: list[str], evicted: list[Move], clock: Clock,
                 budgets: list[DisruptionBudget] | None = None) -> Defragmenter:
    def evict_one(move: Move) -> str:
        evicted.append(move)
        return results.pop(0)
    return Defragmenter(None, cache, lambda: {}, clock=clock, evict_one=evict_one,
                        budgets_of=lambda by_ns: list(budgets or []))


def test_nothing_is_evicted_while_evict_is_off_or_before_the_pod_waited_long_enough() -> None:
    cache = fragmented()
    evicted: list[Move] = []
    clock = Clock()
    d = defragmenter(cache, [], evicted, clock)
    made = d.run()
    assert made is not None and [(s.node, [m.pod for m in s.moves]) for s in made.steps] == [("a", ["team/a1"])]
    assert evicted == []  # evict is off by default
    cache.defrag_policy = DefragPolicy(evict=True, evict_after_s=600)
    clock.t += 599
    d.run()
    assert evicted == []  # seen pending 599 s
    assert d.latest()[1] == 0.0


def test_acting_holds_the_node_then_evicts_and_does_not_act_twice() -> None:
    cache = fragmented()
    cache.defrag_policy = DefragPolicy(evict=True, evict_after_s=0)
    evicted: list[Move] = []
    clock = Clock()
    d = defragmenter(cache, ["evicted"], evicted, clock)
    d.run()
    assert [m.pod for m in evicted] == ["team/a1"]
    assert [(r.node, r.pod) for r in cache.reservations()] == [("a", "team/big")]
    # Another pod is kept off the node being freed, with the reason.
    body = filter(cache, ExtenderArgs(Pod=pod("small", 100), NodeNames=["a", "b"]), False).body
    assert "being freed for pod team/big" in body["FailedNodes"]["a"]
    d.run()  # the hold stands: no second round of evictions for the same pod
    assert len(evicted) == 1


def test_a_refused_first_eviction_drops_the_hold() -> None:
    cache = fragmented()
    cache.defrag_policy = DefragPolicy(evict=True, evict_after_s=0)
    evicted: list[Move] = []
    d = defragmenter(cache, ["blocked"], evicted, Clock())
    d.run()
    assert len(evicted) == 1 and cache.reservations() == []


def test_evictions_per_hour_are_capped() -> None:
    cache = fragmented()
    cache.defrag_policy = DefragPolicy(evict=True, evict_after_s=0, max_evictions_per_hour=1)
    evicted: list[Move] = []
    clock = Clock()
    d = defragmenter(cache, ["evicted", "evicted"], evicted, clock)
    d.run()
    assert len(evicted) == 1
    # The pod is still pending (no watch here); its hold ends, the plan asks again: the hour's
    # one eviction is spent until an hour after the first.
    cache.drop_hold(next(iter(cache.reservations())).uid)
    clock.t += 1800
    d.run()
    assert len(evicted) == 1
    clock.t += 1800
    d.run()
    assert len(evicted) == 2


def test_a_pdb_read_from_the_api_reaches_the_plan() -> None:
    cache = fragmented()
    held = DisruptionBudget("team/keep", 0, frozenset({"uid-a1"}))
    made = defragmenter(cache, [], [], Clock(), budgets=[held]).run()
    assert made is not None and made.steps == () and made.waiting == ("team/big",)


def test_the_config_section_is_read_and_bounded() -> None:
    from extender.admin_config import ConfigError, parse_admin_config

    assert parse_admin_config("{}").defrag == DefragPolicy()  # off unless asked
    got = parse_admin_config("defragmentation: {evict: true, evict_after_s: 120, max_evictions_per_hour: 3,"
                             " plan_every_s: 10}").defrag
    assert got == DefragPolicy(True, 120.0, 3, 10.0)
    for bad, field in (("evict: maybe", "evict"), ("evict_after_s: -1", "evict_after_s"),
                       ("max_evictions_per_hour: 0", "max_evictions_per_hour"),
                       ("plan_every_s: 0.1", "plan_every_s"), ("plan_every_s: 1e9", "plan_every_s"),
                       ("evict_now: true", "evict_now")):
        with pytest.raises(ConfigError, match=f"defragmentation.{field}"):
            parse_admin_config(f"defragmentation: {{{bad}}}")
