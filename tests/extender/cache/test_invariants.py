"""Cluster-state invariants under a mix of gpufrac binds and forged outside pods (issue 22).

Hypothesis draws a sequence of operations on one cache:

- ``place``: a pod goes through filter's evaluation and gpufrac binds it on the best node;
- ``forge``: a pod bound outside gpufrac appears with ``gpufrac.io/assigned-*`` annotations it
  wrote itself (any GPUs, repeated or not, any share, memory and class);
- ``delete``: a pod goes away;
- ``restart``: a new cache is built from the pods as the API holds them (the cluster-mode
  start-up list), gpufrac's own binds with the record the Binding wrote.

After every step, over the cache's arrays and its ``allocations()``:

- no GPU holds more than 1000 milli of non-best-effort share, nor more than 1000 of
  best-effort share (no oversubscription configured), nor more memory than it has;
- the pods gpufrac trusts never take more replica slots than a GPU has;
- a tenant's trusted pods stay within its quota, and none of its pods is counted in a class
  better than its ceiling;
- every forged record that did not fit is flagged as an over-commit.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender.admin_config import scoring_config
from extender.cache import BindError, GpuCache
from extender.tenants import Tenant, TenantPolicy
from podspec import annotations as ann
from podspec.pods import allocation_annotations, pod_intent
from scoring.request import QoSClass
from scoring.scorer import build_scorer
from scoring.shape_prior import NO_PRIOR
from tests.conftest import gpu_node, pod_json

NODES = [gpu_node("a", 2, replicas=3, memory_mib=16384), gpu_node("b", 1, replicas=3, memory_mib=24576)]
UUIDS = [g.uuid for n in NODES for g in n.gpus]
REPLICAS = {g.uuid: g.replicas for n in NODES for g in n.gpus}
MEMORY = {g.uuid: g.memory_mib for n in NODES for g in n.gpus}
NODE_OF = {g.uuid: n.name for n in NODES for g in n.gpus}
TEAM_A = Tenant("team-a", qos_ceiling=QoSClass.BURSTABLE, quota_gpu_milli=1500)
TENANTS = TenantPolicy(by_namespace={"team-a": TEAM_A}, by_name={"team-a": TEAM_A})
NOW = datetime(2026, 11, 23, tzinfo=UTC)

namespaces = st.sampled_from(["team-a", "other"])
fractions = st.sampled_from(["0.25", "0.5", "0.75", "1"])
qos_names = st.sampled_from(["guaranteed", "burstable", "best-effort"])
operations = st.one_of(
    st.tuples(st.just("place"), namespaces, fractions, qos_names),
    st.tuples(st.just("forge"), namespaces, st.lists(st.sampled_from(UUIDS), min_size=1, max_size=3),
              st.sampled_from(["0.1", "0.5", "1", "0.9"]), st.sampled_from([None, "1Gi", "16Gi", "160Gi"]),
              qos_names),
    st.tuples(st.just("delete"), st.integers(0, 50)),
    st.tuples(st.just("restart")),
)


def new_cache(ties: str | None = None) -> GpuCache:
    # ``ties="row"`` also learns from observed pods only: the default before issue 36.
    config = scoring_config("default", {"ties": ties, "prior": NO_PRIOR} if ties else None)
    cache = GpuCache(build_scorer(config))
    cache.set_policy(build_scorer(config), TENANTS)
    cache.set_nodes(NODES)
    return cache


def pod(name: str, ns: str, annotations: dict[str, str], gpus: int = 1, node: str | None = None) -> dict[str, Any]:
    p = pod_json(name, gpus=gpus, annotations=annotations, cpu="100m", memory="64Mi", node=node,
                 phase="Running" if node else "Pending")
    p["metadata"]["namespace"] = ns
    return p


def check(cache: GpuCache, forged: set[str]) -> None:
    s = cache.state_copy()
    exists = s.gpu_exists
    assert ((s.gpu_used_milli - s.gpu_best_effort_milli)[exists] <= 1000).all()
    # best-effort share alone stays within the cap (1000: no oversubscription configured);
    # burstable pods may squeeze it (QoSPolicy), so used as a whole may pass 1000.
    assert (s.gpu_best_effort_milli[exists] <= 1000).all()
    assert (s.gpu_mem_used_mib[exists] <= s.gpu_mem_total_mib[exists]).all()
    trusted_pods: dict[str, int] = defaultdict(int)
    team_a_trusted = 0
    for a in cache.allocations():
        if a["namespace"] == "team-a":
            assert a["qos"] != "guaranteed", a  # never better than the tenant's ceiling
        if a["overcommit"]:
            assert a["uid"] in forged, a  # gpufrac's own binds are never over-commits
            continue
        for uuid in a["gpu_uuids"]:
            trusted_pods[uuid] += 1
        if a["namespace"] == "team-a":
            team_a_trusted += a["gpu_milli"] * len(a["gpu_uuids"])
    assert all(n <= REPLICAS[u] for u, n in trusted_pods.items()), trusted_pods
    assert TEAM_A.quota_gpu_milli is not None and team_a_trusted <= TEAM_A.quota_gpu_milli


# Derandomized: the same 120 examples every run, so CI cannot fail by the luck of the draw;
# the case below, found by a random draw on 2026-11-24, is kept as a known failure.
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(ops=st.lists(operations, min_size=1, max_size=25))
def test_binds_and_forged_pods_never_break_the_invariants(ops: list[tuple[Any, ...]]) -> None:
    check_invariants_after(ops)


def test_freeing_an_overcommit_lets_the_nodes_other_overcommits_take_up_what_they_use() -> None:
    """Found by a random hypothesis draw (kept as a strict xfail until issue 40): two forged
    whole-GPU records on GPU-a-0 in a tenant capped at burstable, so both read back as
    over-commits (p0 counted in full, p1 at nothing); p0 deleted. The cache released p0
    without reading p1 again (only a trusted record's release did), so GPU-a-0 read free,
    gpufrac placed its quarter there, and after a restart p1 read back first and gpufrac's
    own bind was the over-commit. Now p1 takes up the GPU when p0 goes; the quarter lands
    elsewhere and a restart reads the same."""
    # Ties by row and no shape prior, as when the case was found: with issue 36's default
    # the 0.25 pod lands on another GPU anyway.
    check_invariants_after([("forge", "team-a", ["GPU-a-0"], "1", None, "guaranteed"),
                            ("forge", "team-a", ["GPU-a-0"], "1", None, "guaranteed"),
                            ("delete", 0), ("place", "team-a", "0.25", "burstable"), ("restart",)],
                           ties="row")


def check_invariants_after(ops: list[tuple[Any, ...]], ties: str | None = None) -> None:
    """Apply ``ops`` (forge, place, delete, restart) and check the invariants after each."""
    cache = new_cache(ties)
    api: dict[str, dict[str, Any]] = {}  # uid -> the pod as the API holds it
    forged: set[str] = set()
    for i, op in enumerate(ops):
        name = f"p{i}"
        if op[0] == "place":
            _, ns, frac, qos = op
            p = pod(name, ns, {ann.FRACTION: frac, ann.QOS: qos})
            intent = pod_intent(p)
            cache.apply_pod_event("ADDED", intent)
            api[intent.uid] = p
            ce = cache.evaluate(intent, ["a", "b"])
            best = ce.evaluation.best()
            if ce.rejection is None and best >= 0:
                try:
                    rec = cache.bind(intent.uid, ns, name, ce.names[best])
                except BindError:
                    continue
                alloc = rec.allocation
                assert alloc is not None
                p["spec"]["nodeName"] = alloc.node
                p["status"]["phase"] = "Running"
                p["metadata"]["annotations"].update(allocation_annotations(
                    rec.gpu_uuids, alloc.gpu_milli, alloc.gpu_memory_mib, NOW))
        elif op[0] == "forge":
            _, ns, uuids, frac, memory, qos = op
            record = {ann.ASSIGNED_GPUS: ",".join(uuids), ann.ASSIGNED_FRACTION: frac, ann.QOS: qos}
            if memory:
                record[ann.ASSIGNED_MEMORY] = ",".join([memory] * len(uuids))
            gpus = len(set(uuids)) if frac == "1" else 1
            if frac != "1":
                record[ann.FRACTION] = frac
            p = pod(name, ns, record, gpus=gpus, node=NODE_OF[uuids[0]])
            intent = pod_intent(p)
            forged.add(intent.uid)
            api[intent.uid] = p
            cache.apply_pod_event("ADDED", intent)
        elif op[0] == "delete" and api:
            uid = sorted(api)[op[1] % len(api)]
            del api[uid]
            cache.remove_pod(uid)
        elif op[0] == "restart":
            cache = new_cache(ties)
            cache.set_pods([pod_intent(p) for p in api.values()])
        check(cache, forged)


def test_a_forged_record_over_a_full_gpu_is_an_overcommit_that_fills_it_and_no_more() -> None:
    """The issue's case: a GPU ended up holding 5000 milli and 160 GiB of its 16 GiB."""
    cache = new_cache()
    # gpufrac binds a 0.75 burstable pod on GPU-b-0 (24 GiB): 750 milli, 18432 MiB (0.75 x 24576).
    legit = pod_intent(pod("legit", "other", {ann.FRACTION: "0.75"}))
    cache.apply_pod_event("ADDED", legit)
    cache.bind(legit.uid, "other", "legit", "b")
    # Five forged whole-GPU guaranteed pods on the same GPU, 160 GiB each.
    for i in range(5):
        record = {ann.ASSIGNED_GPUS: "GPU-b-0", ann.ASSIGNED_FRACTION: "1", ann.ASSIGNED_MEMORY: "160Gi",
                  ann.QOS: "guaranteed"}
        cache.apply_pod_event("ADDED", pod_intent(pod(f"f{i}", "mallory", record, node="b")))
    s = cache.state_copy()
    row = s.node_index["b"]
    # 750 (legit) + 250 (what was free, taken by f0) = 1000; f1..f4 find nothing left.
    assert s.gpu_used_milli[row, 0] == 1000
    # memory: 18432 (legit) + 6144 (the rest of 24576, f0) = 24576; never 5 x 160 GiB.
    assert s.gpu_mem_used_mib[row, 0] == 24576
    over = [a for a in cache.allocations() if a["overcommit"]]
    assert len(over) == 5 and cache.summary()["pods_overcommitted"] == 5
    assert {a["name"]: a["held_milli"] for a in over}["f0"] == [250]
    assert "share over what a guaranteed pod may take" in over[0]["overcommit"]
    # gpufrac places nothing more there: a 0.1 pod fails GPU-b-0 for share.
    small = pod_intent(pod("small", "other", {ann.FRACTION: "0.1"}))
    cache.apply_pod_event("ADDED", small)
    ev = cache.evaluate(small, ["b"]).evaluation
    assert not ev.node_fits[0]
    # The legit pod leaves: the over-commits are read again and take what they really use
    # (f0 its whole GPU, 24576 MiB), so the freed share is not offered to anyone else.
    cache.remove_pod(legit.uid)
    s = cache.state_copy()
    assert (s.gpu_used_milli[row, 0], s.gpu_mem_used_mib[row, 0]) == (1000, 24576)
    held = {a["name"]: a["held_milli"] for a in cache.allocations() if a["overcommit"]}
    assert held["f0"] == [1000] and held["f1"] == [0]
    assert not cache.evaluate(small, ["b"]).evaluation.node_fits[0]


def test_share_freed_by_a_pod_found_bound_elsewhere_goes_to_the_overcommit_first() -> None:
    cache = new_cache()
    # gpufrac assumes a whole GPU-b-0 for "moved"; a forged whole-GPU record on GPU-b-0 then
    # finds nothing free (counted 0 of its 1000).
    moved = pod_intent(pod("moved", "other", {}))
    cache.apply_pod_event("ADDED", moved)
    cache.assume(moved.uid, "other", "moved", "b", ttl_s=60)
    record = {ann.ASSIGNED_GPUS: "GPU-b-0", ann.ASSIGNED_FRACTION: "1", ann.QOS: "burstable"}
    cache.apply_pod_event("ADDED", pod_intent(pod("forged", "mallory", record, node="b")))
    assert {a["name"]: a["held_milli"] for a in cache.allocations()}["forged"] == [0]
    # The watch shows "moved" bound to node a after all: GPU-b-0's 1000 milli are freed, and
    # the over-commit takes them (it really runs there) before anyone else is offered them.
    bound_a = pod("moved", "other", allocation_annotations(["GPU-a-0"], 1000, [16384], NOW), node="a")
    cache.apply_pod_event("MODIFIED", pod_intent(bound_a))
    held = {a["name"]: a["held_milli"] for a in cache.allocations()}
    assert held["forged"] == [1000] and held["moved"] == [1000]


def test_a_tenant_cannot_forge_its_way_past_quota_or_ceiling() -> None:
    """The issue's case: a tenant with a 1.5-GPU quota and a burstable ceiling held 6.5 GPUs
    as guaranteed. Forged records past the quota are over-commits, held in the ceiling's
    class, and the tenant's next pod is refused by gpufrac."""
    cache = new_cache()
    for i, uuid in enumerate(["GPU-a-0", "GPU-a-1", "GPU-b-0"]):
        record = {ann.ASSIGNED_GPUS: uuid, ann.ASSIGNED_FRACTION: "1", ann.QOS: "guaranteed"}
        cache.apply_pod_event("ADDED", pod_intent(pod(f"f{i}", "team-a", record, node=NODE_OF[uuid])))
    allocs = {a["name"]: a for a in cache.allocations()}
    assert all(a["qos"] == "burstable" for a in allocs.values())   # ceiling, not guaranteed
    # f0 claims a guaranteed GPU: over the ceiling, so an over-commit (held as burstable)
    assert all("may ask for QoS class burstable or lower" in a["overcommit"] for a in allocs.values())
    nxt = pod_intent(pod("next", "team-a", {ann.FRACTION: "0.5"}))
    cache.apply_pod_event("ADDED", nxt)
    assert "over GPU quota" in (cache.evaluate(nxt, ["a", "b"]).rejection or "")
    assert np.all(cache.state_copy().gpu_used_milli <= 1000)
