"""A fenced hold taken on receipt, and its group commit's choice (``Receipt``; issue 55).

The group commit keeps a hold on receipt only where every change to the node since it was
this instance's own (holds, give-backs): then choosing again would count the same things.
Anything else on the node (a pod another instance bound, a claim counted, new arrays, an
inventory heartbeat) makes it choose again, so that what the ledger's write commits never
shares a GPU with what the cache learned after the hold.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import replace

import pytest

from extender.admin_config import scoring_config
from extender.cache import BindError, ClaimedAllocation, GpuCache, PodRecord, Receipt
from extender.cache.evaluation import Evaluator
from extender.tenants import Tenant, TenantPolicy
from podspec import annotations as ann
from podspec.pods import allocation_annotations, pod_intent
from scoring.scorer import build_scorer
from tests.conftest import gpu_node, pod_json

NOW = dt.datetime(2026, 11, 29, 12, 0, 0, tzinfo=dt.UTC)


@pytest.fixture
def choices(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The nodes of every choice the cache made (``Evaluator.on_node``), in order."""
    seen: list[str] = []
    real = Evaluator.on_node

    def counted(self: Evaluator, state, request, row, generation):  # type: ignore[no-untyped-def]
        seen.append(state.node_names[row])
        return real(self, state, request, row, generation)

    monkeypatch.setattr(Evaluator, "on_node", counted)
    yield seen


def cache_with(*names: str, share: str = "0.5", gpus: int = 2) -> GpuCache:
    """n1 with ``gpus`` GPUs, and the named pods pending."""
    cache = GpuCache(build_scorer(scoring_config("default")))
    cache.set_nodes([gpu_node("n1", gpus)])
    for name in names:
        cache.apply_pod_event("ADDED", pod_intent(pod_json(name, annotations={ann.FRACTION: share})))
    return cache


def hold(cache: GpuCache, name: str, receipt: Receipt = Receipt.HOLD) -> PodRecord:
    return cache.assume(f"uid-{name}", "default", name, "n1", ttl_s=60, receipt=receipt)


def used_milli(cache: GpuCache) -> list[int]:
    """The share counted on each of n1's GPUs (never above 1000 where nothing over-commits)."""
    state = cache.state_copy()
    return [int(u) for u in state.gpu_used_milli[state.node_index["n1"]]]


def test_a_hold_nothing_else_touched_is_kept_without_choosing_again(choices: list[str]) -> None:
    cache = cache_with("a")
    held = hold(cache, "a")
    assert choices == ["n1"]
    assert hold(cache, "a", Receipt.AGAIN) is held  # the same record: not given back, not chosen again
    assert choices == ["n1"] and used_milli(cache) == [500, 0]


def test_holds_and_give_backs_of_this_instance_keep_each_other(choices: list[str]) -> None:
    # Each of them was chosen counting the others: nothing to choose again.
    cache = cache_with("a", "b", "c")
    a, b, c = hold(cache, "a"), hold(cache, "b"), hold(cache, "c")
    assert used_milli(cache) == [1000, 500] and c.gpu_uuids == ("GPU-n1-1",)
    assert cache.forget("uid-c")
    assert hold(cache, "b", Receipt.AGAIN) is b and hold(cache, "a", Receipt.AGAIN) is a
    assert len(choices) == 3 and used_milli(cache) == [1000, 0]


def test_a_pod_another_instance_bound_after_the_hold_makes_it_choose_again(choices: list[str]) -> None:
    # The pod watch shows x, bound by another instance to the GPU the hold took (0.6 of it):
    # read back as an over-commit while the hold is there. Keeping the hold would commit 1.1
    # of that GPU; choosing again gives it back (x then counts in full) and takes the other.
    cache = cache_with("a")
    held = hold(cache, "a")
    gpu = held.gpu_uuids[0]
    x = pod_json("x", node="n1", phase="Running", annotations={
        ann.FRACTION: "0.6", **allocation_annotations((gpu,), 600, (9830,), NOW)})
    cache.apply_pod_event("ADDED", pod_intent(x))
    again = hold(cache, "a", Receipt.AGAIN)
    assert again.gpu_uuids != held.gpu_uuids and len(choices) == 2
    assert sorted(used_milli(cache)) == [500, 600]


def test_a_change_of_another_kind_between_two_holds_ends_the_run_for_the_first(choices: list[str]) -> None:
    # a's hold, then a pod of another instance (on the other GPU), then b's hold: b was
    # chosen counting both, a was not chosen counting x. a is chosen again, b kept.
    cache = cache_with("a", "b")
    a = hold(cache, "a")
    other = "GPU-n1-1" if a.gpu_uuids == ("GPU-n1-0",) else "GPU-n1-0"
    x = pod_json("x", node="n1", phase="Running", annotations={
        ann.FRACTION: "0.2", **allocation_annotations((other,), 200, (3276,), NOW)})
    cache.apply_pod_event("ADDED", pod_intent(x))
    b = hold(cache, "b")
    assert hold(cache, "b", Receipt.AGAIN) is b and len(choices) == 2
    assert hold(cache, "a", Receipt.AGAIN) is not a and len(choices) == 3


def test_a_claim_counted_at_the_commit_makes_it_choose_again(choices: list[str]) -> None:
    cache = cache_with("a", "x")
    held = hold(cache, "a")
    theirs = ClaimedAllocation("uid-x", "default", "x", "n1", held.gpu_uuids, 600, (9830,), "other", 60.0)
    again = cache.assume("uid-a", "default", "a", "n1", ttl_s=60, claims=[theirs], receipt=Receipt.AGAIN)
    assert again.gpu_uuids != held.gpu_uuids and len(choices) == 2
    assert sorted(used_milli(cache)) == [500, 600]


def test_a_claim_it_refuses_next_to_gives_no_gpu_twice(choices: list[str]) -> None:
    # One GPU: the claim takes 0.6 of it; the hold's 0.5 no longer fits anywhere.
    cache = cache_with("a", "x", gpus=1)
    held = hold(cache, "a")
    theirs = ClaimedAllocation("uid-x", "default", "x", "n1", held.gpu_uuids, 600, (9830,), "other", 60.0)
    with pytest.raises(BindError, match="insufficient GPU share"):
        cache.assume("uid-a", "default", "a", "n1", ttl_s=60, claims=[theirs], receipt=Receipt.AGAIN)
    assert used_milli(cache) == [600]


def test_a_refusal_before_the_choice_gives_the_hold_back() -> None:
    # Another instance claims a on the other GPU while a's hold is here: the commit is refused
    # (kube-scheduler retries) and a's hold must not stay counted until its TTL.
    cache = cache_with("a")
    held = hold(cache, "a")
    other = "GPU-n1-1" if held.gpu_uuids == ("GPU-n1-0",) else "GPU-n1-0"
    theirs = ClaimedAllocation("uid-a", "default", "a", "n1", (other,), 500, (8192,), "other", 60.0)
    with pytest.raises(BindError, match="in flight"):
        cache.assume("uid-a", "default", "a", "n1", ttl_s=60, claims=[theirs], receipt=Receipt.AGAIN)
    assert used_milli(cache) == [0, 0]


@pytest.mark.parametrize("change", ["new arrays", "inventory heartbeat", "config reload"])
def test_anything_else_on_the_node_makes_it_choose_again(choices: list[str], change: str) -> None:
    cache = cache_with("a")
    held = hold(cache, "a")
    if change == "new arrays":  # a node added: the arrays are built again, row versions anew
        cache.upsert_nodes([gpu_node("n0", 1)])
    elif change == "config reload":  # a new QoS policy may refuse what the hold took
        cache.set_policy(build_scorer(scoring_config("default")), TenantPolicy())
    else:  # only NVML's used memory moved: patched in place, the row's version moves
        node = gpu_node("n1", 2)
        cache.upsert_nodes([replace(node, gpus=tuple(replace(g, memory_used_mib=100) for g in node.gpus))])
    again = hold(cache, "a", Receipt.AGAIN)
    assert again is not held and len(choices) == 2 and sorted(used_milli(cache)) == [0, 500]


def test_a_mark_lost_or_never_taken_only_costs_a_choice(choices: list[str]) -> None:
    cache = cache_with("a", "b")
    a = hold(cache, "a", Receipt.NONE)  # held without a mark (an unfenced hold)
    again = hold(cache, "a", Receipt.AGAIN)
    assert again is not a and len(choices) == 2 and sorted(used_milli(cache)) == [0, 500]


def test_the_tenant_quota_is_checked_again_without_the_hold_itself() -> None:
    cache = cache_with("a", "b")
    quota = Tenant("team", quota_gpu_milli=1000)
    cache.set_policy(build_scorer(scoring_config("default")), TenantPolicy(default=quota))
    held = hold(cache, "a")
    assert hold(cache, "a", Receipt.AGAIN) is held  # 500 of 1,000: admitted, its own 500 not counted twice
    hold(cache, "b")
    # A smaller quota now (a reload): the hold is no longer admitted, and is refused as a choice would be.
    cache.set_policy(build_scorer(scoring_config("default")), TenantPolicy(default=Tenant("team", quota_gpu_milli=600)))
    with pytest.raises(BindError, match="quota"):
        hold(cache, "b", Receipt.AGAIN)
    assert used_milli(cache) == [500, 0]  # a's hold; b's given back
