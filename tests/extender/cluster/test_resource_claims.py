"""One book: the shares ResourceClaims hold of gpu.gpufrac.io counted in the cache beside
annotation pods (``extender.cluster.resource_claims``), without a server.

``tests/e2e/test_dra_node_e2e.py`` runs the same book against claims kube-scheduler's DRA
allocator really wrote.
"""

from __future__ import annotations

from typing import Any

import pytest

from extender.admin_config import scoring_config
from extender.cache import BindError, GpuCache
from extender.cluster.resource_claims import KIND, ResourceClaimBook
from extender.quarantine import Quarantine
from podspec import annotations as ann
from podspec.claims import DRIVER, device_names
from podspec.pods import pod_intent
from scoring.scorer import build_scorer
from scoring.state import GpuSpec, NodeSpec
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
