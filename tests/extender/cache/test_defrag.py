"""The defragmentation plan (extender/cache/defrag.py, moves.py) on hand-made clusters.

Every node here has V100M16 GPUs (16 GiB) and room for any pod's CPU and memory; shares are
milli-GPU. Each test says in comments why the plan must be what it asserts.
"""

from __future__ import annotations

from typing import Any

from extender.cache import GpuCache
from extender.cache.defrag import DefragPlan, plan_defrag
from extender.cache.moves import DisruptionBudget
from extender.translate import inbound
from podspec.pods import pod_intent
from scoring.fit import fragmented_on
from scoring.specs import GpuSpec, NodeSpec
from tests.extender.helpers import bestfit_cache, send_event

RS = {"kind": "ReplicaSet", "name": "rs", "uid": "rs-uid", "apiVersion": "apps/v1", "controller": True}


def node(name: str, gpus: int = 1) -> NodeSpec:
    return NodeSpec(name, 64_000, 262_144, tuple(GpuSpec(i, f"GPU-{name}-{i}", "V100M16", 16_384, 20)
                                                   for i in range(gpus)))


def pod(name: str, milli: int = 1000, gpus: int = 1, qos: str = "burstable", owner: dict[str, Any] | None = RS,
        selector: dict[str, str] | None = None, priority: int = 0, **spec: Any) -> dict[str, Any]:
    annotations = {"gpufrac.io/qos": qos}
    if milli < 1000:
        annotations["gpufrac.io/fraction"] = f"{milli / 1000:g}"
    meta: dict[str, Any] = {"name": name, "namespace": "team", "uid": f"uid-{name}", "annotations": annotations}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"metadata": meta,
            "spec": {"schedulerName": "gpufrac-scheduler", "priority": priority,
                     "nodeSelector": selector or {}, **spec,
                     "containers": [{"name": "main", "resources": {
                         "requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"gpufrac.io/gpu": str(gpus)}}}]},
            "status": {"phase": "Pending"}}


def place(cache: GpuCache, p: dict[str, Any], node_name: str) -> None:
    send_event(cache, "ADDED", p)
    cache.bind(p["metadata"]["uid"], "team", p["metadata"]["name"], node_name)


def bound(cache: GpuCache, p: dict[str, Any], node_name: str, gpu: int) -> None:
    """The pod as the watch shows it once bound by gpufrac: on ``node_name``'s GPU ``gpu``."""
    ann = p["metadata"]["annotations"]
    ann["gpufrac.io/assigned-gpus"] = f"GPU-{node_name}-{gpu}"
    ann["gpufrac.io/assigned-fraction"] = ann.get("gpufrac.io/fraction", "1")
    p["spec"]["nodeName"] = node_name
    p["status"]["phase"] = "Running"
    send_event(cache, "ADDED", p)


def planned(cache: GpuCache, labels: dict[str, dict[str, str]] | None = None,
            budgets: tuple[DisruptionBudget, ...] = ()) -> DefragPlan:
    state, records, scorer = cache.defrag_snapshot()
    node_labels = {n: tuple(sorted(v.items())) for n, v in (labels or {}).items()}
    return plan_defrag(state, records, scorer, node_labels=node_labels, budgets=budgets)


def moves(p: DefragPlan) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """(waiting pod, target node, [(moved pod, where it fits)]) per step."""
    return [(s.pod, s.node, [(m.pod, m.fits_on) for m in s.moves]) for s in p.steps]


def test_fewest_moves_win_and_each_moved_pod_fits_elsewhere() -> None:
    # a: three pods 200 + 200 + 100 = 500 used; b: one pod of 500. Free in sum 500 + 500 = 1000,
    # so a whole-GPU pod waits for fragmentation. Freeing a takes 3 moves, b 1: the plan frees
    # b, and its pod (500) fits a's 500 free.
    cache = bestfit_cache([node("a"), node("b")])
    for name, milli in (("a1", 200), ("a2", 200), ("a3", 100)):
        place(cache, pod(name, milli), "a")
    place(cache, pod("b1", 500), "b")
    send_event(cache, "ADDED", pod("big", 1000))
    p = planned(cache)
    assert p.waiting == ("team/big",) and p.pending == 1
    assert moves(p) == [("team/big", "b", [("team/b1", "a")])]
    assert p.steps[0].moves[0].controller == "ReplicaSet/rs"
    # The plan ran on a copy: the cache is as it was (b1 still holds half of b's GPU).
    assert {a["name"]: a["node"] for a in cache.allocations()}["b1"] == "b"


def test_lowest_class_moves_first_and_a_pdb_protects_it() -> None:
    # a: 2 GPUs, GPU0 has a best-effort 500, GPU1 a burstable 500. b: one GPU with a bare
    # burstable pod of 500 (no controller: not movable). A whole-GPU guaranteed pod needs an
    # empty GPU: none (free 500 on each GPU: 1500 in sum). On a, moving either pod frees a GPU
    # (one move of 500 each): the best-effort one goes first, to b (best-effort room there:
    # 1000 - 500 = 500).
    cache = bestfit_cache([node("a", 2), node("b")])
    bound(cache, pod("be", 500, qos="best-effort"), "a", 0)
    bound(cache, pod("bu", 500), "a", 1)
    bound(cache, pod("bare", 500, owner=None), "b", 0)
    send_event(cache, "ADDED", pod("big", 1000, qos="guaranteed"))
    assert moves(planned(cache)) == [("team/big", "a", [("team/be", "b")])]
    # A PodDisruptionBudget over "be" that allows no disruption: the burstable one moves instead.
    held = DisruptionBudget("team/keep-be", 0, frozenset({"uid-be"}))
    p = planned(cache, budgets=(held,))
    assert moves(p) == [("team/big", "a", [("team/bu", "b")])]
    # One that allows a disruption: "be" again, and the move names the budget.
    p = planned(cache, budgets=(DisruptionBudget("team/keep-be", 1, frozenset({"uid-be"})),))
    assert moves(p) == [("team/big", "a", [("team/be", "b")])]
    assert p.steps[0].moves[0].budgets == ("team/keep-be",)
    # Both protected: no step, and the reason.
    both = DisruptionBudget("team/all", 0, frozenset({"uid-be", "uid-bu"}))
    p = planned(cache, budgets=(both,))
    assert p.steps == () and p.waiting == ("team/big",)
    assert "no set of movable pods" in p.unplanned[0][1]


def test_no_pod_of_a_higher_class_or_priority_moves_for_it() -> None:
    # The same shape as above, the waiting pod best-effort: burstable pods are a higher class.
    cache = bestfit_cache([node("a"), node("b")])
    place(cache, pod("a1", 500), "a")
    place(cache, pod("b1", 500), "b")
    send_event(cache, "ADDED", pod("big", 1000, qos="best-effort"))
    p = planned(cache)
    assert p.waiting == ("team/big",) and p.steps == ()
    # And a pod of the same class but higher priority stays too.
    cache = bestfit_cache([node("a"), node("b")])
    place(cache, pod("a1", 500, priority=100), "a")
    place(cache, pod("b1", 500, priority=100), "b")
    send_event(cache, "ADDED", pod("big", 1000, priority=10))
    assert planned(cache).steps == ()


def test_a_pod_that_would_fit_nowhere_else_is_not_moved() -> None:
    # a: 600 used, b: 500 used (one pod each). Free in sum 400 + 500 = 900 >= 800 for a pod of
    # 0.8 that fits neither GPU. Freeing a pushes its 600 to b (500 free: no); freeing b pushes
    # 500 to a (400 free: no). No step.
    cache = bestfit_cache([node("a"), node("b")])
    place(cache, pod("a1", 600), "a")
    place(cache, pod("b1", 500), "b")
    send_event(cache, "ADDED", pod("w", 800))
    p = planned(cache)
    assert p.waiting == ("team/w",) and p.steps == ()
    assert len(p.unplanned) == 1 and p.unplanned[0][0] == "team/w"
    assert "each fitting on another node" in p.unplanned[0][1]


def test_a_pod_waiting_for_capacity_is_not_waiting_for_fragmentation() -> None:
    # a: 700 used, b: 700 used. Free in sum 600 < 1000: capacity, not fragmentation.
    cache = bestfit_cache([node("a"), node("b")])
    place(cache, pod("a1", 700), "a")
    place(cache, pod("b1", 700), "b")
    send_event(cache, "ADDED", pod("big", 1000))
    p = planned(cache)
    assert p.pending == 1 and p.waiting == () and p.steps == ()
    state, records, _ = cache.defrag_snapshot()
    big = dict(records)["uid-big"].intent
    assert not fragmented_on(state, inbound.pod_request(big, state))


def test_node_selectors_bound_the_target_and_the_moved_pods() -> None:
    # a, b, c: one GPU each, 500 used by one movable pod each. The waiting pod selects zone=x,
    # which only b and c carry; b's pod selects zone=x too, so it can only go to c (500 free:
    # fits); c's pod selects zone=y, which no node other than c carries: it cannot move. The
    # step frees b and moves b's pod to c.
    # An empty node d in zone w would fit the waiting pod, but its selector rules d out: it
    # still waits for fragmentation (on the nodes it may use), not for d.
    cache = bestfit_cache([node("a"), node("b"), node("c"), node("d")])
    place(cache, pod("a1", 500), "a")
    place(cache, pod("b1", 500, selector={"zone": "x"}), "b")
    place(cache, pod("c1", 500, selector={"zone": "y"}), "c")
    send_event(cache, "ADDED", pod("big", 1000, selector={"zone": "x"}))
    labels = {"a": {"zone": "w"}, "b": {"zone": "x"}, "c": {"zone": "x", "zone-alt": "y"}, "d": {"zone": "w"}}
    assert moves(planned(cache, labels)) == [("team/big", "b", [("team/b1", "c")])]
    # Without labels known, no node matches the waiting pod's selector: no step.
    assert planned(cache).steps == ()


def test_pods_that_do_not_come_back_or_have_rules_stay() -> None:
    # A DaemonSet's pod, a bare pod and a pod with required pod anti-affinity hold 500 each on
    # a, b, c; none may move, so the waiting whole-GPU pod gets no step.
    cache = bestfit_cache([node("a"), node("b"), node("c")])
    ds = {**RS, "kind": "DaemonSet"}
    anti = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "x"}]}}
    place(cache, pod("ds", 500, owner=ds), "a")
    place(cache, pod("bare", 500, owner=None), "b")
    place(cache, pod("anti", 500, affinity=anti), "c")
    send_event(cache, "ADDED", pod("big", 1000))
    p = planned(cache)
    assert p.steps == () and "no node it may use has pods that can be moved" in p.unplanned[0][1]


def test_moved_pods_must_fit_elsewhere_together() -> None:
    # a: two movable pods of 300 (600 used); b: 700 and c: 800 used by bare pods. A pod of 0.8
    # waits (free 400 + 300 + 200 = 900 >= 800; no GPU has 800 free). Only a can be freed, and
    # only by moving both (one gives 700 free). Each 300 alone fits b (300 free), so each is
    # eligible; together, the first takes b's 300 and the second finds 200 on c: no step.
    cache = bestfit_cache([node("a"), node("b"), node("c")])
    place(cache, pod("a1", 300), "a")
    place(cache, pod("a2", 300), "a")
    place(cache, pod("b1", 700, owner=None), "b")
    place(cache, pod("c1", 800, owner=None), "c")
    send_event(cache, "ADDED", pod("w", 800))
    p = planned(cache)
    assert p.waiting == ("team/w",) and p.steps == ()
    assert p.unplanned == (("team/w", "the pods that would free a node for it do not all fit elsewhere together"),)


def test_two_waiting_pods_get_two_nodes_and_the_second_sees_the_first() -> None:
    # a, b, c, d: 500 each (one pod each). Two whole-GPU pods wait. Step 1 frees a (lowest row
    # of equal cost) and puts a1 on b (b full now); step 2 may not use a, and b is full of
    # pods... b1 and a1 (500 each) could both move, but 2 moves cost more than freeing c
    # (c1 to d: d full). So: big1 on a, big2 on c.
    cache = bestfit_cache([node("a"), node("b"), node("c"), node("d")])
    for n in "abcd":
        place(cache, pod(f"{n}1", 500), n)
    send_event(cache, "ADDED", pod("big1", 1000))
    send_event(cache, "ADDED", pod("big2", 1000))
    p = planned(cache)
    assert moves(p) == [("team/big1", "a", [("team/a1", "b")]), ("team/big2", "c", [("team/c1", "d")])]
    assert p.moves == 2


def test_owner_and_selector_are_read_leniently() -> None:
    # ownerReferences and nodeSelector only matter to the plan: a malformed one never makes the
    # pod unreadable, it makes the pod stay where it is.
    p = pod("x", 500)
    p["metadata"]["ownerReferences"] = "nonsense"
    p["spec"]["nodeSelector"] = ["not", "a", "map"]
    intent = pod_intent(p)
    assert intent.controller == "" and intent.placement_rules
    ok = pod_intent(pod("y", 500, selector={"b": "2", "a": "1"}))
    assert ok.controller == "ReplicaSet/rs" and ok.node_selector == (("a", "1"), ("b", "2"))
    assert not ok.placement_rules
