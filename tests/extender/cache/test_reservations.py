"""Starvation protection (extender/cache/reservations.py) on hand-made clusters."""

from __future__ import annotations

from typing import Any

from extender.admin_config import AdminConfig, parse_admin_config, scoring_config
from extender.cache import DEFAULT_STARVATION, GpuCache
from extender.cache.reservations import CANDIDATES_PER_PASS, Reservation, StarvationPolicy
from extender.metrics import Metrics
from extender.verbs.filter import ExtenderArgs, filter
from extender.verbs.pod_events import PodEvent, pod_events
from scoring.specs import NodeSpec
from tests.extender.helpers import bestfit_cache, send_event, trace_pod, v100_node

POLICY = StarvationPolicy(reserve_after_s=600, max_reserved_nodes=1, reservation_ttl_s=3600)


def cache_with(nodes: list[NodeSpec], starvation: StarvationPolicy = POLICY) -> GpuCache:
    return bestfit_cache(nodes, starvation)


def sweep(cache: GpuCache, now_s: float) -> list[Reservation]:
    made, _ended = cache.reserve_for_waiting(now_s)
    return made


def place(cache: GpuCache, p: dict[str, Any], node_name: str) -> None:
    send_event(cache, "ADDED", p)
    m = p["metadata"]
    cache.bind(m["uid"], m["namespace"], m["name"], node_name)


def filtered(cache: GpuCache, p: dict[str, Any], names: list[str]) -> dict[str, Any]:
    body: dict[str, Any] = filter(cache, ExtenderArgs(Pod=p, NodeNames=names), False).body
    return body


def half_full_cluster(starvation: StarvationPolicy = POLICY) -> tuple[GpuCache, dict[str, Any]]:
    # a: GPUs used 500 / 0; b: 300 / 0. A 2-GPU pod fits neither; to drain for it: a's two
    # emptiest GPUs hold 500 + 0 = 500, b's 300 + 0 = 300: b is the node to reserve.
    cache = cache_with([v100_node("a"), v100_node("b")], starvation)
    place(cache, trace_pod("on-a", 1, 500), "a")
    place(cache, trace_pod("on-b", 1, 300), "b")
    big = trace_pod("big", 2, 1000)
    send_event(cache, "ADDED", big)
    return cache, big


def test_a_pod_waiting_past_the_bound_gets_the_node_cheapest_to_drain() -> None:
    cache, big = half_full_cluster()
    assert sweep(cache, 0) == []  # first seen now
    assert sweep(cache, 599) == []  # not yet waited 600 s
    made = sweep(cache, 600)
    assert [(r.node, r.pod, r.since_s) for r in made] == [("b", "openb/big", 600)]
    # Another pod that fits both nodes is kept off b, with the reason kube-scheduler shows.
    body = filtered(cache, trace_pod("small", 1, 200), ["a", "b"])
    assert body["NodeNames"] == ["a"]
    assert "reserved for pod openb/big" in body["FailedNodes"]["b"]
    # The waiting pod itself is judged on b as ever (it does not fit yet: share, not the hold).
    assert "insufficient GPU share" in filtered(cache, big, ["a", "b"])["FailedNodes"]["b"]
    # Operators see the hold.
    exposition = Metrics(cache.summary, cache.metrics_view).exposition().decode()
    assert "\ngpufrac_reserved_nodes 1.0\n" in exposition


def test_the_reservation_ends_when_its_pod_is_bound() -> None:
    cache, big = half_full_cluster()
    sweep(cache, 0)
    sweep(cache, 600)
    # The pod on b leaves; big fits b and is bound there; b is open to everyone again.
    on_b = trace_pod("on-b", 1, 300)
    assert pod_events(cache, [PodEvent.model_validate({"type": "DELETED", "object": on_b})]).status == 200
    m = big["metadata"]
    cache.bind(m["uid"], m["namespace"], m["name"], "b")
    assert cache.reservations() == []


def test_the_reservation_ends_when_its_pod_is_deleted_or_it_expires() -> None:
    cache, big = half_full_cluster()
    sweep(cache, 0)
    sweep(cache, 600)
    assert sweep(cache, 600 + 3599) == [] and len(cache.reservations()) == 1
    # At the TTL the reservation ends; the pod still waits, so it gets one again at once.
    again = sweep(cache, 600 + 3600)
    assert [r.since_s for r in again] == [4200]
    pod_events(cache, [PodEvent.model_validate({"type": "DELETED", "object": big})])
    assert sweep(cache, 4201) == [] and cache.reservations() == []


def test_no_reservation_when_off_when_the_pod_fits_or_fits_no_empty_node() -> None:
    cache, _big = half_full_cluster(StarvationPolicy())
    for t in (0, 10_000):
        assert sweep(cache, t) == []
    # A pod that fits now needs no room held: kube-scheduler's next retry places it.
    cache2 = cache_with([v100_node("a")])
    send_event(cache2, "ADDED", trace_pod("fits", 1, 500))
    # A pod that no node could hold even empty (3 GPUs on 2-GPU nodes) holds none either.
    send_event(cache2, "ADDED", trace_pod("too-big", 3, 1000))
    for t in (0, 10_000):
        assert sweep(cache2, t) == []


def test_oldest_first_and_at_most_the_limit() -> None:
    cache = cache_with([v100_node("a"), v100_node("b"), v100_node("c")], StarvationPolicy(600, max_reserved_nodes=2))
    for n in ("a", "b", "c"):
        place(cache, trace_pod(f"on-{n}", 1, 100 * (ord(n) - 96)), n)  # 100, 200, 300 on one GPU each
    first, second = trace_pod("first", 2, 1000), trace_pod("second", 2, 1000)
    send_event(cache, "ADDED", first)
    sweep(cache, 0)
    send_event(cache, "ADDED", second)
    sweep(cache, 100)
    made = sweep(cache, 700)
    # Both waited 600 s: the older gets the cheapest node (a, 100 to drain), the other the next.
    assert [(r.pod, r.node) for r in made] == [("openb/first", "a"), ("openb/second", "b")]
    # Each holder is kept off the other's node.
    assert "a" in filtered(cache, second, ["a", "b", "c"])["FailedNodes"]
    assert len(sweep(cache, 800)) == 0 and len(cache.reservations()) == 2


def test_a_pod_waiting_for_capacity_not_fragmentation_gets_none() -> None:
    # Four 0.8 pods on two 2-GPU nodes leave 4 x 200 = 800 free in sum: a 2-GPU pod waits for
    # capacity, which no drained node would give sooner than the pods' own ends; none held.
    cache = cache_with([v100_node("a"), v100_node("b")])
    for i, n in enumerate("aabb"):
        place(cache, trace_pod(f"p{i}", 1, 800), n)
    send_event(cache, "ADDED", trace_pod("big", 2, 1000))
    assert sweep(cache, 0) == [] and sweep(cache, 10_000) == []


def test_a_pass_looks_at_the_oldest_waiting_pods_only() -> None:
    # Housekeeping holds the cache lock: it considers the CANDIDATES_PER_PASS oldest waiting
    # pods. Pods no node could hold (3 GPUs on 2-GPU nodes) ahead of the starved 2-GPU pod:
    # one fewer than the bound leaves it in reach, as many as the bound hides it. (Those pods
    # ask for more than is free in sum: the capacity gate is off here, its own test below.)
    ungated = StarvationPolicy(reserve_after_s=600, capacity_gate=False)
    for ahead, held in ((CANDIDATES_PER_PASS - 1, ["openb/big"]), (CANDIDATES_PER_PASS, [])):
        cache, big = half_full_cluster(ungated)
        pod_events(cache, [PodEvent.model_validate({"type": "DELETED", "object": big})])
        for i in range(ahead):
            send_event(cache, "ADDED", trace_pod(f"huge-{i}", 3, 1000))
        sweep(cache, 0)
        send_event(cache, "ADDED", big)
        sweep(cache, 1)
        assert [r.pod for r in sweep(cache, 700)] == held


def test_no_new_hold_while_the_starving_pods_ask_for_more_than_is_free() -> None:
    # half_full_cluster leaves 3,200 free in sum (1,500 on a, 1,700 on b); big asks 2,000. A
    # second starving pod asking 1,000 keeps them within it (3,000): big gets its hold. One
    # asking 2 x 1,000 takes them past it (4,000): they wait for capacity, and a drained node
    # would idle, so none is held.
    for extra_gpus, held in ((1, ["openb/big"]), (2, [])):
        cache, big = half_full_cluster()
        send_event(cache, "ADDED", trace_pod("extra", extra_gpus, 1000))
        sweep(cache, 0)
        assert [r.pod for r in sweep(cache, 700)] == held
    # A pod that has not waited reserve_after_s yet is not starving: it does not count.
    cache, big = half_full_cluster()
    sweep(cache, 0)
    send_event(cache, "ADDED", trace_pod("extra", 2, 1000))
    assert [r.pod for r in sweep(cache, 700)] == ["openb/big"]
    # With the gate off, the starving queue past the free share gets its hold.
    cache, big = half_full_cluster(StarvationPolicy(reserve_after_s=600, capacity_gate=False))
    send_event(cache, "ADDED", trace_pod("extra", 2, 1000))
    sweep(cache, 0)
    assert [r.pod for r in sweep(cache, 700)] == ["openb/big"]


def test_the_node_held_is_one_the_pods_node_selector_matches() -> None:
    # The waiting pod (2 whole GPUs) selects zone=x, and only a is in zone x. a: 4 GPUs, three
    # holding 600 each (free 3 * 400 + 1000 = 2200 >= 2000, one whole GPU: fragmentation);
    # b: 300 on one of 2. b is the cheaper to drain (300 against 0 + 600), yet a is held,
    # the node the pod may run on.
    cache = cache_with([v100_node("a", 4), v100_node("b")])
    for i in range(3):
        place(cache, trace_pod(f"on-a{i}", 1, 600), "a")
    place(cache, trace_pod("on-b", 1, 300), "b")
    big = trace_pod("big", 2, 1000)
    big["spec"]["nodeSelector"] = {"zone": "x"}
    send_event(cache, "ADDED", big)
    labels = {"a": (("zone", "x"),), "b": (("zone", "y"),)}
    assert cache.reserve_for_waiting(0, labels) == ([], [])
    made, _ = cache.reserve_for_waiting(600, labels)
    assert [(r.node, r.pod) for r in made] == [("a", "openb/big")]


def test_no_node_is_held_where_the_node_selector_matches_none_or_labels_are_unknown() -> None:
    cache = cache_with([v100_node("a"), v100_node("b")])
    place(cache, trace_pod("on-a", 1, 500), "a")
    big = trace_pod("big", 2, 1000)
    big["spec"]["nodeSelector"] = {"zone": "z"}
    send_event(cache, "ADDED", big)
    # b is empty and would fit the pod, but is in zone y; a in zone x: the pod waits for
    # nodes that do not exist, not for fragmentation.
    labels = {"a": (("zone", "x"),), "b": (("zone", "y"),)}
    cache.reserve_for_waiting(0, labels)
    assert cache.reserve_for_waiting(600, labels) == ([], [])
    # Without the nodes' labels (a caller that has none), nothing shows that a node matches.
    assert cache.reserve_for_waiting(1200) == ([], [])


def test_on_by_default_alike_with_and_without_a_config_file() -> None:
    # The process without --config and a config file that leaves starvation: out both get
    # DEFAULT_STARVATION (two holds after 600 s, gated); reserve_after_s: 0 turns it off.
    assert DEFAULT_STARVATION.enabled and DEFAULT_STARVATION.capacity_gate
    assert AdminConfig(scoring_config("default")).starvation == DEFAULT_STARVATION
    assert parse_admin_config("scoring: {preset: default}\n").starvation == DEFAULT_STARVATION
    off = parse_admin_config("starvation: {reserve_after_s: 0}\n").starvation
    assert not off.enabled
    ungated = parse_admin_config("starvation: {capacity_gate: false}\n").starvation
    assert ungated.enabled and not ungated.capacity_gate
