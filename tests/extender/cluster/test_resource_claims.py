"""One book: the shares ResourceClaims hold of gpu.gpufrac.io counted in the cache beside
annotation pods (``extender.cluster.resource_claims``), without a server.

``tests/e2e/test_dra_node_e2e.py`` runs the same book against claims kube-scheduler's DRA
allocator really wrote.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from extender.admin_config import scoring_config
from extender.cache import BindError, GpuCache
from extender.cluster.resource_claims import KIND, ResourceClaimBook
from extender.quarantine import Quarantine
from extender.verbs.filter import ExtenderArgs, filter
from podspec import annotations as ann
from podspec.claims import DRIVER, device_asks, device_names, pod_claim_names
from podspec.pods import pod_intent
from podspec.quantities import PodSpecError
from scoring.scorer import build_scorer
from scoring.specs import GpuSpec, NodeSpec
from tests.conftest import gpu_node, pod_json


def claim(name: str = "c", *results: dict[str, Any], uid: str | None = None) -> dict[str, Any]:
    status = {"allocation": {"devices": {"results": list(results)}}} if results else {}
    return {"metadata": {"name": name, "namespace": "team", "uid": uid or f"uid-{name}",
                         "creationTimestamp": "2026-11-28T10:00:00Z"},
            "spec": {"devices": {"requests": []}}, "status": status}


def result(device: str = "gpu-0", share: str | None = "250", pool: str = "n1", memory: str | None = None,
           driver: str = DRIVER, request: str = "gpu") -> dict[str, Any]:
    consumed = {k: v for k, v in (("share", share), ("memory", memory)) if v is not None}
    return {"request": request, "driver": driver, "pool": pool, "device": device, "shareID": "abc",
            **({"consumedCapacity": consumed} if consumed else {})}


class Book:
    """A cache of n1 (2 T4 GPUs) and n2 (1), and the claim book over it."""

    def __init__(self, *nodes: NodeSpec) -> None:
        self.nodes = {n.name: n for n in (nodes or (gpu_node("n1", 2), gpu_node("n2", 1)))}
        self.cache = GpuCache(build_scorer(scoring_config("default")))
        self.cache.set_nodes(list(self.nodes.values()))
        self.quarantine = Quarantine()
        self.book = ResourceClaimBook(self.cache, self.quarantine,
                                      lambda n: self.nodes[n].gpus if n in self.nodes else None)

    def held(self) -> dict[str, list[int]]:
        """GPU UUID -> milli held, from ``/allocations``' view."""
        out: dict[str, list[int]] = {}
        for a in self.cache.allocations():
            for uuid, milli in zip(a["gpu_uuids"], a["held_milli"], strict=True):
                out.setdefault(uuid, []).append(milli)
        return out

    def problem(self, key: str = "team/c") -> str | None:
        got = [e.message for e in self.quarantine.entries() if (e.kind, e.key) == (KIND, key)]
        return got[0] if got else None


def test_an_allocated_claim_is_counted_on_its_gpu_and_freed_when_deleted() -> None:
    b = Book()
    obj = claim("c", result("gpu-1", "250", memory="4Gi"))
    assert b.book.apply("ADDED", obj) is False
    [a] = b.cache.allocations()
    assert (a["uid"], a["name"], a["node"], a["gpu_uuids"], a["gpu_milli"], a["gpu_memory_mib"], a["overcommit"]) == (
        "resourceclaim/uid-c/0", "resourceclaim/c/gpu", "n1", ["GPU-n1-1"], 250, [4096], "")
    assert b.cache.summary()["gpu_allocated_milli"] == 250
    assert b.book.apply("MODIFIED", obj) is False          # the same event again changes nothing
    assert b.cache.summary()["gpu_allocated_milli"] == 250
    assert b.book.apply("DELETED", obj) is True
    assert b.cache.allocations() == [] and b.book.held() == {}


def test_a_claim_that_asked_no_memory_holds_its_shares_part_of_the_gpu_memory() -> None:
    # consumedCapacity memory 1Mi is the slice's default: counted as a pod of that share
    # without gpufrac.io/memory (a quarter of the 16 GiB T4: 4096 MiB), not as 1 MiB.
    b = Book()
    b.book.apply("ADDED", claim("c", result("gpu-0", share="250", memory="1Mi")))
    b.book.apply("ADDED", claim("d", result("gpu-1", share="250", memory="2Gi"), uid="uid-d"))
    assert {a["name"]: a["gpu_memory_mib"] for a in b.cache.allocations()} == {
        "resourceclaim/c/gpu": [4096], "resourceclaim/d/gpu": [2048]}


def test_deallocation_frees_the_share_and_other_drivers_are_not_ours() -> None:
    b = Book()
    b.book.apply("ADDED", claim("c", result("gpu-0", "500"), result("gpu-0", "500", driver="gpu.nvidia.com")))
    assert b.held() == {"GPU-n1-0": [500]}
    assert b.book.apply("MODIFIED", claim("c")) is True    # status.allocation cleared
    assert b.held() == {}


def test_an_annotation_pod_never_gets_the_share_a_claim_holds() -> None:
    b = Book(gpu_node("n1", 1))
    b.book.apply("ADDED", claim("c", result("gpu-0", "750")))
    b.cache.apply_pod_event("ADDED", pod_intent(pod_json("p", annotations={ann.FRACTION: "0.5"})))
    with pytest.raises(BindError, match="insufficient GPU share"):
        b.cache.assume("uid-p", "default", "p", "n1", ttl_s=60)
    b.cache.apply_pod_event("ADDED", pod_intent(pod_json("q", annotations={ann.FRACTION: "0.25"})))
    assert b.cache.assume("uid-q", "default", "q", "n1", ttl_s=60).gpu_uuids == ("GPU-n1-0",)


def test_a_claim_on_a_gpu_annotation_pods_filled_is_an_overcommit_and_the_gpu_reads_full() -> None:
    b = Book(gpu_node("n1", 1))
    bound = pod_json("p", annotations={ann.FRACTION: "0.75"}, node="n1", phase="Running")
    bound["metadata"]["annotations"].update({ann.ASSIGNED_GPUS: "GPU-n1-0", ann.ASSIGNED_FRACTION: "0.75"})
    b.cache.apply_pod_event("ADDED", pod_intent(bound))
    b.book.apply("ADDED", claim("c", result("gpu-0", "500")))
    [claim_alloc] = [a for a in b.cache.allocations() if a["uid"].startswith("resourceclaim/")]
    assert claim_alloc["held_milli"] == [250] and "share over" in claim_alloc["overcommit"]
    assert sum(sum(v) for v in b.held().values()) == 1000  # full, never more


def test_a_pod_relist_keeps_the_claims_and_a_claim_relist_forgets_the_deleted() -> None:
    b = Book()
    b.book.apply("ADDED", claim("c", result("gpu-0")))
    b.book.apply("ADDED", claim("d", result("gpu-1", "100")))
    b.cache.set_pods([pod_intent(pod_json("p"))])          # a 410 on the pod watch: a new list
    assert b.held() == {"GPU-n1-0": [250], "GPU-n1-1": [100]}
    assert b.book.relist([claim("d", result("gpu-1", "100"))]) is True
    assert b.held() == {"GPU-n1-1": [100]} and list(b.book.held()) == ["team/d"]


@pytest.mark.parametrize(("obj", "message"), [
    (claim("c", result(share="1001")), "consumedCapacity.share"),
    (claim("c", result(share="0.5")), "whole milli-GPU"),
    (claim("c", *[result()] * 33), "more than the API's 32"),
    (claim("c", result(device="x" * 64)), "results[0].device"),
    ({"metadata": {"name": "c", "namespace": "team", "uid": "u"}, "status": {"allocation": "all"}},
     "status.allocation"),
])
def test_an_unreadable_claim_is_quarantined_and_keeps_what_was_counted(obj: dict[str, Any], message: str) -> None:
    b = Book()
    b.book.apply("ADDED", claim("c", result("gpu-0", "300")))
    b.book.apply("ADDED", claim("other", result("gpu-1", "100")))
    assert b.book.apply("MODIFIED", obj) is False
    assert message in (b.problem() or "")
    assert b.held() == {"GPU-n1-0": [300], "GPU-n1-1": [100]}   # kept; the other claim untouched


def test_a_share_on_an_unknown_node_or_device_is_counted_once_it_is_known() -> None:
    b = Book()
    b.book.apply("ADDED", claim("c", result("gpu-0", "200", pool="n3"), result("gpu-7", "100")))
    assert 'pool "n3" is no node' in (b.problem() or "") and "gpu-7: not in node n1" in (b.problem() or "")
    assert b.held() == {}
    n3 = gpu_node("n3", 1)
    b.nodes["n3"] = n3
    b.cache.upsert_nodes([n3])
    b.book.retry()
    assert b.held() == {"GPU-n3-0": [200]}
    assert "gpu-7" in (b.problem() or "")


def test_mig_devices_are_named_by_position_under_their_gpu() -> None:
    assert device_names([0, 1, 1, 1, 2]) == ["gpu-0", "gpu-1-0", "gpu-1-1", "gpu-1-2", "gpu-2"]
    assert device_names([]) == []
    # A node of MIG devices (one index, as the agent publishes them) beside a whole-GPU node:
    # both are taken, and a claim on the second MIG device is counted there.
    mig = NodeSpec("m1", 64000, 262144, (GpuSpec(0, "MIG-a", "A100 MIG 3g.20gb", 20000),
                                         GpuSpec(0, "MIG-b", "A100 MIG 3g.20gb", 20000)))
    b = Book(mig, gpu_node("n1", 1))
    b.book.apply("ADDED", claim("c", result("gpu-0-1", "1000", pool="m1")))
    assert b.held() == {"MIG-b": [1000]}
    assert b.cache.summary()["gpus"] == 3


def test_a_claim_is_no_preemption_victim_and_no_defragmentation_move() -> None:
    b = Book(gpu_node("n1", 1))
    b.book.apply("ADDED", claim("c", result("gpu-0", "1000")))
    [rec] = [r for _, r in b.cache.defrag_snapshot()[1]]
    assert rec.intent.priority == 2**31 - 1 and rec.intent.controller == ""
    urgent = pod_json("u", annotations={ann.FRACTION: "1", ann.QOS: "guaranteed"})
    urgent["spec"]["priority"] = 1000
    assert b.cache.preempt(pod_intent(urgent), ["n1"]) == {}
    # The control: a bound pod of priority 0 in the claim's place is a victim.
    c = Book(gpu_node("n1", 1))
    bound = pod_json("p", annotations={ann.FRACTION: "1", ann.ASSIGNED_GPUS: "GPU-n1-0",
                                       ann.ASSIGNED_FRACTION: "1"}, node="n1", phase="Running")
    c.cache.apply_pod_event("ADDED", pod_intent(bound))
    assert c.cache.preempt(pod_intent(urgent), ["n1"]) == {"n1": ["uid-p"]}


# -- kube-scheduler's allocator replayed: nodes where it would over-commit are refused ---------

def claim_spec(name: str, *asks: dict[str, Any]) -> dict[str, Any]:
    """An unallocated claim whose requests are ``asks`` (``exactly`` bodies)."""
    return {"metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}"},
            "spec": {"devices": {"requests": [{"name": f"r{i}", "exactly": a} for i, a in enumerate(asks)]}}}


def ask(share: str | None = "500", count: int | None = None, memory: str | None = None,
        selectors: bool = False, device_class: str = DRIVER) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": device_class}
    if count is not None:
        body["count"] = count
    capacity = {k: v for k, v in (("share", share), ("memory", memory)) if v is not None}
    if capacity:
        body["capacity"] = {"requests": capacity}
    if selectors:
        body["selectors"] = [{"cel": {"expression": 'device.attributes["gpu.gpufrac.io"].model == "A10"'}}]
    return body


def claim_pod(*claims: str, generated: dict[str, str] | None = None) -> dict[str, Any]:
    pod = pod_json("cp", gpus=None)
    pod["metadata"]["namespace"] = "team"
    pod["spec"]["resourceClaims"] = [{"name": c, "resourceClaimName": c} for c in claims] + [
        {"name": k, "resourceClaimTemplateName": "t"} for k in (generated or {})]
    pod["status"]["resourceClaimStatuses"] = [{"name": k, "resourceClaimName": v} for k, v in (generated or {}).items()]
    return pod


def annotation_pod(b: Book, name: str, gpu: str, fraction: str) -> None:
    bound = pod_json(name, annotations={ann.FRACTION: fraction, ann.ASSIGNED_GPUS: gpu, ann.ASSIGNED_FRACTION: fraction},
                     node=gpu.split("-")[1], phase="Running")
    b.cache.apply_pod_event("ADDED", pod_intent(bound))


def test_the_device_the_allocator_takes_first_must_have_room_beside_annotation_pods() -> None:
    b = Book(gpu_node("n1", 2), gpu_node("n2", 2))
    annotation_pod(b, "p", "GPU-n1-0", "0.75")                    # n1: gpu-0 holds 750 of annotation pods
    b.book.apply("ADDED", claim_spec("c", ask("500")))
    refused = b.book.refusals(claim_pod("c"), ["n1", "n2"], b.cache.gpu_rooms)
    # First fit (claims only) takes gpu-0 on n1: 250 left there. n2 is safe.
    assert list(refused) == ["n1"]
    assert "device gpu-0 (GPU GPU-n1-0)" in refused["n1"] and "250 milli" in refused["n1"]


def test_any_device_the_allocator_may_take_must_have_room_not_only_the_first() -> None:
    # gpu-0 holds 500 of claims, gpu-1 is full of an annotation pod. First fit on gpufrac's view
    # would take gpu-0, but kube-scheduler's view may lag (a claim on gpu-0 it still counts)
    # and take gpu-1: the real node e2e saw that happen. So gpu-1 refuses the node, with or
    # without selectors.
    b = Book(gpu_node("n1", 2))
    b.book.apply("ADDED", claim("held", result("gpu-0", "500")))
    annotation_pod(b, "p", "GPU-n1-1", "1")
    b.book.apply("ADDED", claim_spec("c", ask("500")))
    b.book.apply("ADDED", claim_spec("s", ask("500", selectors=True)))
    for name in ("c", "s"):
        assert "GPU-n1-1" in b.book.refusals(claim_pod(name), ["n1"], b.cache.gpu_rooms)["n1"]
    # A device the claims already fill cannot be taken: with the annotation pod on gpu-1 gone,
    # and gpu-0 full of claims, nothing refuses the node.
    b.cache.remove_pod("uid-p")
    b.book.apply("ADDED", claim("more", result("gpu-0", "500")))
    assert b.book.refusals(claim_pod("c"), ["n1"], b.cache.gpu_rooms) == {}


def test_count_memory_unhealthy_gpus_and_allocated_claims() -> None:
    b = Book(gpu_node("n1", 3, healthy=(False, True, True)))
    annotation_pod(b, "p", "GPU-n1-2", "0.5")
    # Two devices of 600: gpu-0 is not in the slice (unhealthy), so gpu-1 and gpu-2: 500 left on gpu-2.
    b.book.apply("ADDED", claim_spec("two", ask("600", count=2)))
    assert "GPU-n1-2" in b.book.refusals(claim_pod("two"), ["n1"], b.cache.gpu_rooms)["n1"]
    # One device of 400: gpu-1, empty: safe.
    b.book.apply("ADDED", claim_spec("small", ask("400")))
    assert b.book.refusals(claim_pod("small"), ["n1"], b.cache.gpu_rooms) == {}
    # A claim already allocated is not the allocator's to place again.
    b.book.apply("MODIFIED", claim("two", result("gpu-1", "600"), result("gpu-2", "600")) | {
        "spec": claim_spec("two", ask("600", count=2))["spec"]})
    assert b.book.refusals(claim_pod("two"), ["n1"], b.cache.gpu_rooms) == {}


def test_a_templates_claim_is_found_by_its_generated_name_and_an_unreadable_one_refuses_every_node() -> None:
    b = Book()
    annotation_pod(b, "p", "GPU-n1-0", "1")
    b.book.apply("ADDED", claim_spec("cp-gpu-x7k2", ask("1000")))
    pod = claim_pod(generated={"gpu": "cp-gpu-x7k2"})
    assert list(b.book.refusals(pod, ["n1", "n2"], b.cache.gpu_rooms)) == ["n1"]
    b.book.apply("ADDED", claim_spec("bad", ask("500", count=0)))
    refused = b.book.refusals(claim_pod("bad"), ["n1", "n2"], b.cache.gpu_rooms)
    assert set(refused) == {"n1", "n2"} and 'count: "0" must be 1 to 64' in refused["n1"]
    # Other classes' requests, and pods without claims, are not gpufrac's to judge.
    b.book.apply("ADDED", claim_spec("other", ask("1000", device_class="gpu.example.com")))
    assert b.book.refusals(claim_pod("other"), ["n1"], b.cache.gpu_rooms) == {}
    assert b.book.refusals(pod_json("plain"), ["n1"], b.cache.gpu_rooms) == {}


def test_device_asks_and_pod_claim_names_are_bounded() -> None:
    asks = device_asks({"spec": {"devices": {"requests": [
        {"name": "a", "exactly": ask("250", memory="8Gi")},
        {"name": "b", "firstAvailable": [{"name": "x", **ask("100", device_class="gpu.example.com")},
                                         {"name": "y", **ask("300")}]},
        {"name": "c", "exactly": ask(None)}]}}})
    assert [(a.request, a.count, a.gpu_milli, a.memory_mib) for a in asks] == [
        ("a", 1, 250, 8192), ("b", 1, 300, 1), ("c", 1, 1000, 1)]
    for bad, field in ((ask("2000"), "share"), (ask(count=65), "count"), ({**ask(), "allocationMode": "All"},
                                                                          "allocationMode")):
        with pytest.raises(PodSpecError, match=field):
            device_asks(claim_spec("x", bad))
    pod = claim_pod(*[f"c{i}" for i in range(40)])
    assert len(pod_claim_names(pod)) == 32
    assert pod_claim_names({"spec": {"resourceClaims": "all"}}) == ()


def test_filter_fails_the_refused_nodes_and_chooses_among_the_others() -> None:
    b = Book(gpu_node("n1", 2), gpu_node("n2", 2))
    args = ExtenderArgs.model_validate({"Pod": claim_pod("c"), "NodeNames": ["n1", "n2"]})
    [chosen] = filter(b.cache, args, decide=True).body["NodeNames"]
    [other] = {"n1", "n2"} - {chosen}
    reply = filter(b.cache, args, decide=True, refuse=lambda pod, names: {chosen: "gpufrac: not here"})
    assert reply.body["NodeNames"] == [other]
    assert reply.body["FailedNodes"] == {chosen: "gpufrac: not here"}
    every = filter(b.cache, args, decide=False, refuse=lambda pod, names: {chosen: "gpufrac: not here"})
    assert every.body["NodeNames"] == [other]


def test_a_refused_claim_pod_is_requeued_once_share_is_freed() -> None:
    # gpufrac does not count a claim pod as a GPU pod, so it remembers the ones it refused a
    # node: ClusterSync requeues them with the pending GPU pods when share is freed.
    b = Book(gpu_node("n1", 1))
    annotation_pod(b, "p", "GPU-n1-0", "1")
    b.book.apply("ADDED", claim_spec("c", ask("500")))
    assert b.book.refused_pods() == []
    b.book.refusals(claim_pod("c"), ["n1"], b.cache.gpu_rooms)
    assert [(p.uid, p.key) for p in b.book.refused_pods()] == [("uid-cp", "team/cp")]
    assert b.book.refused_pods() == []  # handed out once


def test_a_relist_forgets_every_trace_of_a_claim_deleted_while_no_watch_ran() -> None:
    # Allocated on a node gpufrac does not know yet: not counted (unplaced), but what it consumes
    # is in the allocator's view. Gone from the next list, it must leave that view too, or the
    # replay would think its share still taken once the node is known.
    b = Book(gpu_node("n1", 1))
    b.book.apply("ADDED", claim("ghost", result("gpu-0", "700", pool="n9")))
    b.book.apply("ADDED", claim("held", result("gpu-0", "100")))
    b.book.apply("ADDED", claim_spec("c", ask("500")))
    b.book.relist([claim_spec("c", ask("500"))])
    assert b.held() == {} and b.book.held() == {} and b.problem("team/ghost") is None
    n9 = gpu_node("n9", 1)
    b.nodes["n9"] = n9
    b.cache.upsert_nodes([n9])
    annotation_pod(b, "p", "GPU-n9-0", "0.75")
    # The allocator sees gpu-0 of n9 free of claims and would take it: 250 really free.
    assert "GPU-n9-0" in b.book.refusals(claim_pod("c"), ["n9"], b.cache.gpu_rooms)["n9"]


def test_refusals_read_the_cache_only_for_unallocated_claims_and_take_any_pod_body() -> None:
    b = Book(gpu_node("n1", 1))
    b.book.apply("ADDED", claim("done", result("gpu-0", "500")) | {"spec": claim_spec("done", ask("500"))["spec"]})
    read: list[Sequence[str]] = []

    def rooms(nodes: Sequence[str]) -> Any:
        read.append(nodes)
        return b.cache.gpu_rooms(nodes)

    assert b.book.refusals(claim_pod("done"), ["n1"], rooms) == {} and read == []
    for hostile in ({"metadata": "x", "spec": {"resourceClaims": [{"name": "c", "resourceClaimName": "c"}]}},
                    {"spec": "x"}, {}):
        assert b.book.refusals(hostile, ["n1"], rooms) == {}


def test_a_watch_event_older_than_the_version_applied_never_undoes_it() -> None:
    # bind applies the claim as it wrote it (allocated, revision 12) under the node's lock;
    # the watch then delivers the finalizer's write (revision 11, no allocation yet): read
    # as a deallocation it freed the share for a moment, and a bind on the node in that
    # moment put a fifth quarter on a full GPU (tests/e2e/test_dra_ha_e2e.py).
    b = Book()

    def at(rv: str, obj: dict[str, Any]) -> dict[str, Any]:
        return {**obj, "metadata": {**obj["metadata"], "resourceVersion": rv}}

    allocated = claim("c", result("gpu-1", "250"))
    assert b.book.apply("MODIFIED", at("12", allocated)) is False
    assert b.book.apply("MODIFIED", at("11", claim("c"))) is False
    assert b.held() == {"GPU-n1-1": [250]}
    assert b.book.apply("MODIFIED", at("12", allocated)) is False
    assert b.held() == {"GPU-n1-1": [250]}
    assert b.book.apply("MODIFIED", at("13", claim("c"))) is True   # deallocated later: freed
    assert b.held() == {}
    assert b.book.apply("DELETED", at("14", claim("c"))) is False
    assert b.book.apply("ADDED", at("15", allocated)) is False      # made again: counted again
    assert b.held() == {"GPU-n1-1": [250]}
