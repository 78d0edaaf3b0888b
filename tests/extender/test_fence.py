"""Fenced binds (``extender.fence``) without a server: the claim ledger's compare-and-swap.

The API is a fake that keeps ConfigMaps with resourceVersions and answers 409 as the API
server does (``replace`` with a stale ``metadata.resourceVersion``, ``create`` of an
existing name); ``tests/e2e/test_ha_e2e.py`` runs the same code against the real one.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from typing import Any

import pytest
import urllib3
from kubernetes.client.rest import ApiException

from extender.admin_config import scoring_config
from extender.cache import BindError, GpuCache
from extender.cache.evaluation import Evaluator
from extender.cluster import KubeBinder
from extender.cluster import binder as binder_module
from extender.fence import (
    CLAIMS_LABEL,
    Claim,
    ClaimFence,
    ClaimLedger,
    FenceConflict,
    ledger_name,
    parse_ledger,
)
from podspec import annotations as ann
from podspec.pods import allocation_annotations, pod_intent
from scoring.scorer import build_scorer
from tests.conftest import gpu_node, pod_json
from tests.extender.helpers import FakeApiClient, FakeResponse

NOW = dt.datetime(2026, 11, 24, 12, 0, 0, tzinfo=dt.UTC)


class CasApi:
    """ConfigMaps with compare-and-swap, pods for ``read_namespaced_pod``, Bindings recorded."""

    def __init__(self) -> None:
        self.maps: dict[str, dict[str, Any]] = {}
        self.rv = 0
        self.pods: dict[str, dict[str, Any]] = {}
        self.bindings: list[tuple[str, str]] = []
        self.api_client = FakeApiClient(self._write)

    def _bump(self, body: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        obj: dict[str, Any] = json.loads(json.dumps(body))
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.maps[obj["metadata"]["name"]] = obj
        return obj

    def read_namespaced_config_map(self, name: str, namespace: str, **kw: Any) -> FakeResponse:
        if name not in self.maps:
            raise ApiException(status=404, reason="Not Found")
        return FakeResponse(self.maps[name])

    def _write(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """POST creates a ConfigMap (409 when it exists), PUT replaces one when its
        ``metadata.resourceVersion`` is current (409 otherwise), POST .../binding binds."""
        if path.endswith("/binding"):
            self.bindings.append((body["metadata"]["name"], body["target"]["name"]))
            return 201, {"kind": "Status", "status": "Success"}
        name = body["metadata"]["name"]
        if method == "POST":
            assert path == "/api/v1/namespaces/gpufrac/configmaps"
            if name in self.maps:
                return 409, {"kind": "Status", "reason": "AlreadyExists"}
            return 201, self._bump(body)
        assert (method, path) == ("PUT", f"/api/v1/namespaces/gpufrac/configmaps/{name}")
        if name not in self.maps:
            return 404, {"kind": "Status", "reason": "NotFound"}
        if body["metadata"].get("resourceVersion") != self.maps[name]["metadata"]["resourceVersion"]:
            return 409, {"kind": "Status", "reason": "Conflict"}
        return 200, self._bump(body)

    def read_namespaced_pod(self, name: str, namespace: str, **kw: Any) -> FakeResponse:
        if name not in self.pods:
            raise ApiException(status=404, reason="Not Found")
        return FakeResponse(self.pods[name])


def claim(uid: str = "u1", at_s: float = 1000.0, owner: str = "a", node: str = "n1") -> Claim:
    return Claim(uid, "default", uid, node, ("GPU-n1-0",), 600, (9830,), owner, at_s)


# -- the ledger ----------------------------------------------------------------------------

def test_ledger_name_is_the_node_name_when_valid_else_a_digest() -> None:
    assert ledger_name("gpu-node-1") == "gpufrac-claims-gpu-node-1"
    assert ledger_name("a" * 300).startswith("gpufrac-claims-") and len(ledger_name("a" * 300)) == 15 + 32
    assert ledger_name("Bad_Name") != "gpufrac-claims-Bad_Name"


def test_a_malformed_claim_is_skipped_and_the_others_kept() -> None:
    good = claim().to_json()
    obj = {"metadata": {"resourceVersion": "7", "annotations": {"gpufrac.io/node": "n1"}},
           "data": {"claims.json": json.dumps([good, {"uid": "x"}, {**good, "uid": "u2", "milli": 5000},
                                               {**good, "uid": "u3", "memoryMiB": []},
                                               {**good, "uid": "u4", "gpus": "GPU-n1-0", "memoryMiB": [1] * 8},
                                               {**good, "uid": "u5", "memoryMiB": [-1]}])
                    .rstrip("]") + ', {"uid": "u6", "namespace": "d", "name": "u6", "node": "n1", '
                    '"gpus": ["GPU-n1-0"], "milli": 100, "memoryMiB": [1], "owner": "a", "at": Infinity}]'}}
    ledger = parse_ledger(obj)
    assert ledger is not None and ledger.resource_version == "7"
    # u4: a string is not a GPU list; u5: negative memory; u6: not a finite number
    assert [c.uid for c in ledger.claims] == ["u1"]
    assert ledger.problem == "claims.json[]: bad claim: missing 'gpus'; 6 claims skipped in all"
    assert parse_ledger({"metadata": {}}) is None  # names no node: not a ledger
    # Wrong shapes anywhere are no ledger, or an empty one, never an exception in the watch.
    assert parse_ledger({"metadata": {"annotations": ["gpufrac.io/node"]}}) is None
    assert parse_ledger({"metadata": {"annotations": {"gpufrac.io/node": "n1"}}, "data": ["x"]}) == \
        ClaimLedger("n1", None, ())
    garbage = {"metadata": {"annotations": {"gpufrac.io/node": "n1"}}, "data": {"claims.json": "{not json"}}
    assert parse_ledger(garbage) == ClaimLedger("n1", None, (), "claims.json: not JSON; read as empty")


def ledger_obj(claims: list[dict[str, Any]], node: str = "n1", rv: str = "5") -> dict[str, Any]:
    """A ledger ConfigMap as the API serves it."""
    return {"metadata": {"name": ledger_name(node), "namespace": "gpufrac", "resourceVersion": rv,
                         "labels": {CLAIMS_LABEL: "true"}, "annotations": {"gpufrac.io/node": node}},
            "data": {"claims.json": json.dumps(claims)}}


# -- issue 38: a ledger is as untrusted as any object ----------------------------------------

def test_claims_are_bounded_like_the_assigned_annotations() -> None:
    good = claim().to_json()
    bad = {"memoryMiB": [10**30], "milli": 10**30, "gpus": ["GPU-x"] * 65, "uid": "u" * 254,
           "owner": ["a"], "at": True}
    for key, value in bad.items():
        extra = {"memoryMiB": [1] * 65} if key == "gpus" else {}
        ledger = parse_ledger(ledger_obj([good, {**good, key: value, **extra}]))
        assert ledger is not None and [c.uid for c in ledger.claims] == ["u1"], key
        assert ledger.problem.startswith("claims.json[]: bad claim: "), ledger.problem


def test_an_absurd_claim_is_quarantined_and_the_claims_watch_and_binds_go_on() -> None:
    # Was: memoryMiB = 10**30 made /bind answer 500 (OverflowError in scoring/state.py), the
    # claims watch crash-looped and the half-applied update leaked share for good.
    from extender.cluster import ClusterSync, SyncOptions

    api = CasApi()
    cache_b, b = replica(api, "b")
    huge = {**claim("uid-a", owner="a").to_json(), "name": "a", "memoryMiB": [10**30]}
    sync = ClusterSync(api, cache_b, SyncOptions(), binder=b)
    sync._apply_ledger("ADDED", api._bump(ledger_obj([huge])))
    (entry,) = sync.quarantine.entries()
    assert (entry.kind, entry.key) == ("claims", "gpufrac/gpufrac-claims-n1")
    assert "memoryMiB: integers in [0, 16777216]" in entry.message
    assert cache_b.summary()["gpu_allocated_milli"] == 0  # nothing half-counted
    b.bind("uid-b", "default", "b", "n1")
    assert cache_b.summary()["gpu_allocated_milli"] == 600
    # A fixed ledger leaves the quarantine.
    sync._apply_ledger("MODIFIED", api._bump(ledger_obj([])))
    assert sync.quarantine.entries() == []


def test_a_claim_dated_far_ahead_expires_ttl_after_it_was_first_seen() -> None:
    # Was: a claim whose 'at' is 10**9 s ahead never expired: 1000 milli held for a pod that
    # is not bound, other pods refused on that GPU.
    api = CasApi()
    cache_b, b = replica(api, "b")
    assert b.fence is not None
    now = [1000.0]
    b.fence._clock = lambda: now[0]
    ahead = {**claim("uid-a", owner="a", at_s=1000.0 + 1e9).to_json(), "name": "a", "milli": 1000}
    api._bump(ledger_obj([ahead]))
    ledger = b.fence.refresh("n1")
    assert [left for _, left in b.fence.live(ledger)] == [60.0]
    with pytest.raises(BindError, match="insufficient GPU share"):
        b.bind("uid-b", "default", "b", "n1")
    now[0] = 1030.0  # rewritten by another instance, the claim copied as it was: same age
    rewritten = b.fence.observe("MODIFIED", api._bump(ledger_obj([ahead])))
    assert rewritten is not None and [left for _, left in b.fence.live(rewritten)] == [30.0]
    now[0] = 1061.0
    assert b.fence.live(b.fence.view("n1")) == []
    cache_b.expire_assumed(now=float("inf"))  # the cache's own hold of the claim ran out too
    b.bind("uid-b", "default", "b", "n1")
    assert api.bindings == [("b", "n1")]


def test_a_huge_ledger_is_read_as_empty_and_claimed_pods_are_read_outside_the_node_lock() -> None:
    # Was: a ledger of 5,000 claims of unknown pods (873 KB) made a bind read each pod
    # while holding the node's lock; kube-scheduler's timeout fired twice.
    unknown = [{**claim(f"ghost-{i}", owner="z").to_json(), "gpus": [f"GPU-{i:036d}"]} for i in range(5000)]
    ledger = parse_ledger(ledger_obj(unknown))
    assert ledger is not None and ledger.claims == ()
    assert "over 262144; read as empty" in ledger.problem

    api = CasApi()
    cache_b, b = replica(api, "b")
    reads: list[str] = []
    locked: list[bool] = []
    plain_read = api.read_namespaced_pod

    def read(name: str, namespace: str, **kw: Any) -> FakeResponse:
        reads.append(name)
        locked.append(b._group("n1").lock.locked())
        return plain_read(name, namespace, **kw)

    api.read_namespaced_pod = read  # type: ignore[method-assign]
    api._bump(ledger_obj(unknown[:300]))  # under the bounds: 300 claims read
    b.bind("uid-b", "default", "b", "n1")
    assert len(reads) == 300 and not any(locked)
    # Gone pods are remembered while their claims live: the next bind reads none again.
    cache_b.forget("uid-b")
    b.bind("uid-b", "default", "b", "n1")
    assert len(reads) == 300


def test_commit_creates_then_swaps_and_refuses_a_stale_version() -> None:
    api = CasApi()
    fence = ClaimFence(api, "gpufrac", "a", ttl_s=60, clock=lambda: 1000.0)
    first = fence.commit(fence.view("n1"), claim("u1"))
    assert first.resource_version == "1" and [c.uid for c in first.claims] == ["u1"]
    stored = api.maps["gpufrac-claims-n1"]
    assert stored["metadata"]["labels"] == {CLAIMS_LABEL: "true"}
    second = fence.commit(first, claim("u2"))
    assert second.resource_version == "2" and [c.uid for c in second.claims] == ["u1", "u2"]
    # Another writer saw version 1 too: its swap is refused, nothing written...
    other = ClaimFence(api, "gpufrac", "b", ttl_s=60, clock=lambda: 1000.0)
    with pytest.raises(FenceConflict, match="moved past version 1"):
        other.commit(first, claim("u3", owner="b"))
    assert api.rv == 2
    # ... and it has read the ledger again, so its next try swaps from version 2.
    assert other.view("n1").resource_version == "2"
    # Two creators of a new ledger: the second gets 409 AlreadyExists, also a conflict.
    with pytest.raises(FenceConflict, match=r"version \(none\)"):
        other.commit(ClaimLedger("n1", None), claim("u4", owner="b"))


def test_commit_drops_expired_claims_and_a_previous_claim_of_the_same_pod() -> None:
    api = CasApi()
    now = [1000.0]
    fence = ClaimFence(api, "gpufrac", "a", ttl_s=60, clock=lambda: now[0])
    ledger = fence.commit(fence.view("n1"), claim("old", at_s=1000.0))
    ledger = fence.commit(ledger, claim("u1", at_s=1000.0))
    now[0] = 1070.0  # 70 s later: both past the 60 s TTL
    ledger = fence.commit(ledger, claim("u1", at_s=1070.0))
    assert [(c.uid, c.at_s) for c in ledger.claims] == [("u1", 1070.0)]


# -- fenced binds --------------------------------------------------------------------------

def replica(api: CasApi, identity: str) -> tuple[GpuCache, KubeBinder]:
    """One gpufrac instance: its own cache (one 1-GPU node, pods a and b pending) and binder."""
    cache = GpuCache(build_scorer(scoring_config("default")))
    cache.set_nodes([gpu_node("n1", 1)])
    for name in ("a", "b"):
        obj = pod_json(name, annotations={ann.FRACTION: "0.6"})
        api.pods[name] = obj
        cache.apply_pod_event("ADDED", pod_intent(obj))
    fence = ClaimFence(api, "gpufrac", identity, ttl_s=60, clock=lambda: 1000.0)
    return cache, KubeBinder(api, cache, 60, fence=fence)


def test_split_brain_the_stale_instance_is_refused_by_the_fence() -> None:
    # Two instances both believe they lead. B read n1's (empty) ledger before A's bind and
    # its pod watch has not shown A's bind: B's cache says the GPU is free.
    api = CasApi()
    cache_a, a = replica(api, "a")
    cache_b, b = replica(api, "b")
    assert b.fence is not None
    b.fence.view("n1")
    a.bind("uid-a", "default", "a", "n1")
    assert api.bindings == [("a", "n1")]
    # 600 + 600 milli would over-commit the GPU: B's compare-and-swap fails, nothing bound.
    with pytest.raises(BindError, match="another gpufrac instance bound there first"):
        b.bind("uid-b", "default", "b", "n1")
    assert api.bindings == [("a", "n1")]
    assert cache_b.summary()["gpu_allocated_milli"] == 0  # B's hold was given back
    # kube-scheduler retries: B now folds A's claim and refuses by the fit itself.
    with pytest.raises(BindError, match="insufficient GPU share"):
        b.bind("uid-b", "default", "b", "n1")
    assert api.bindings == [("a", "n1")]
    assert cache_b.summary()["gpu_allocated_milli"] == 600  # a's share, held from the claim
    assert cache_a.summary()["gpu_allocated_milli"] == 600


def test_a_hold_taken_on_receipt_is_chosen_again_against_the_ledger() -> None:
    # B's cache has not seen A's claim when B's bind arrives: the hold it takes on receipt
    # (for the filters answered meanwhile) is on the GPU A claimed. The group commit gives it
    # back and chooses against the ledger, where A's claim counts: B is refused by the fit,
    # never committed on top of A.
    api = CasApi()
    cache_a, a = replica(api, "a")
    cache_b, b = replica(api, "b")
    a.bind("uid-a", "default", "a", "n1")
    assert b.fence is not None
    b.hold_on_receipt("uid-b", "default", "b", "n1")
    assert cache_b.summary()["gpu_allocated_milli"] == 600  # held on receipt, A's claim unseen
    with pytest.raises(BindError, match="insufficient GPU share"):
        b.bind("uid-b", "default", "b", "n1")
    assert api.bindings == [("a", "n1")]
    assert cache_b.summary()["gpu_allocated_milli"] == 600  # A's claim now, not B's hold
    assert {c.uid for c in b.fence.view("n1").claims} == {"uid-a"}


def test_a_hold_taken_on_receipt_that_nothing_else_touched_is_what_the_claim_commits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The ledger is empty and nothing moved n1 since the hold: choosing again would count the
    # same, so the group commit keeps it (one choice in all) and claims its GPU.
    api = CasApi()
    cache_b, b = replica(api, "b")
    assert b.fence is not None
    rows: list[int] = []
    on_node = Evaluator.on_node

    def counted(self: Evaluator, *a: Any) -> Any:
        rows.append(a[2])
        return on_node(self, *a)

    monkeypatch.setattr(Evaluator, "on_node", counted)
    b.hold_on_receipt("uid-b", "default", "b", "n1")
    b.bind("uid-b", "default", "b", "n1")
    assert len(rows) == 1 and api.bindings == [("b", "n1")]
    assert [(c.uid, c.gpu_uuids) for c in b.fence.view("n1").claims] == [("uid-b", ("GPU-n1-0",))]
    assert cache_b.summary()["gpu_allocated_milli"] == 600


def watermark_ahead(api: CasApi, b: KubeBinder) -> None:
    assert b.fence is not None
    b.fence.commit(b.fence.view("n1"), claim("other", owner="x"))
    api.maps[ledger_name("n1")]["data"]["seenRV"] = "999"  # past B's pod watch (which never ran)
    b.fence.refresh("n1")


def no_answer(api: CasApi, b: KubeBinder) -> None:
    # etcd stopped: the client raises the connection error as it is, not as an ApiException.
    def read(name: str, namespace: str, **kw: Any) -> FakeResponse:
        raise urllib3.exceptions.ReadTimeoutError(None, "/", "read timed out")  # type: ignore[arg-type]

    api.read_namespaced_config_map = read  # type: ignore[method-assign]


@pytest.mark.parametrize(("cause", "refusal"), [(watermark_ahead, "pod watch is behind"),
                                                (no_answer, "reading the claim ledger of n1: ReadTimeoutError")])
def test_a_hold_taken_on_receipt_is_given_back_when_the_bind_is_refused_before_its_commit(
        cause: Any, refusal: str) -> None:
    api = CasApi()
    cache_b, b = replica(api, "b")
    cause(api, b)
    b.hold_on_receipt("uid-b", "default", "b", "n1")
    assert cache_b.summary()["gpu_allocated_milli"] == 600
    with pytest.raises(BindError, match=refusal):
        b.bind("uid-b", "default", "b", "n1")
    assert cache_b.summary()["gpu_allocated_milli"] == 0 and api.bindings == []


def test_receipt_holds_past_the_bound_drop_only_the_expired_and_never_a_live_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Forgetting a live receipt hold would let its group commit keep a choice made without the
    # ledger; so past MAX_RECEIVED a bind takes no receipt hold until some hold's TTL is over.
    monkeypatch.setattr(binder_module, "MAX_RECEIVED", 2)
    api = CasApi()
    cache_b, b = replica(api, "b")
    live = time.monotonic() + 60
    b._received = {"x1": ("n1", live), "x2": ("n1", live)}
    b.hold_on_receipt("uid-b", "default", "b", "n1")
    assert cache_b.summary()["gpu_allocated_milli"] == 0 and set(b._received) == {"x1", "x2"}
    b._received["x2"] = ("n1", time.monotonic() - 1)  # its hold expired with its TTL
    b.hold_on_receipt("uid-b", "default", "b", "n1")
    assert cache_b.summary()["gpu_allocated_milli"] == 600 and set(b._received) == {"x1", "uid-b"}


def test_binds_arriving_together_read_a_node_ledger_once() -> None:
    # The first binds to a node all find its ledger never seen: one reads it, the others wait
    # for that read (on the 50-node benchmark each node's ledger was read up to 40 times).
    api = CasApi()
    reads: list[str] = []
    plain = api.read_namespaced_config_map

    def slow_read(name: str, namespace: str, **kw: Any) -> FakeResponse:
        reads.append(name)
        time.sleep(0.05)
        return plain(name, namespace, **kw)

    api.read_namespaced_config_map = slow_read  # type: ignore[method-assign]
    cache = GpuCache(build_scorer(scoring_config("default")))
    cache.set_nodes([gpu_node("n1", 8)])
    for i in range(6):
        obj = pod_json(f"p{i}", annotations={ann.FRACTION: "0.5"})
        api.pods[f"p{i}"] = obj
        cache.apply_pod_event("ADDED", pod_intent(obj))
    binder = KubeBinder(api, cache, 60, fence=ClaimFence(api, "gpufrac", "a", ttl_s=60, clock=lambda: 1000.0))
    threads = [threading.Thread(target=binder.bind, args=(f"uid-p{i}", "default", f"p{i}", "n1")) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert reads == [ledger_name("n1")]
    assert sorted(name for name, _ in api.bindings) == [f"p{i}" for i in range(6)]


def test_a_claim_of_a_pod_the_cache_has_not_seen_is_read_from_the_api() -> None:
    api = CasApi()
    _, a = replica(api, "a")
    cache_b = GpuCache(build_scorer(scoring_config("default")))
    cache_b.set_nodes([gpu_node("n1", 1)])
    cache_b.apply_pod_event("ADDED", pod_intent(api.pods["b"]))  # B's watch has not shown pod a
    b = KubeBinder(api, cache_b, 60, fence=ClaimFence(api, "gpufrac", "b", 60,
                                                      clock=lambda: 1000.0))
    a.bind("uid-a", "default", "a", "n1")
    with pytest.raises(BindError, match="insufficient GPU share"):
        b.bind("uid-b", "default", "b", "n1")
    assert api.bindings == [("a", "n1")]


def test_a_claim_whose_pod_is_gone_holds_nothing() -> None:
    api = CasApi()
    _, a = replica(api, "a")
    cache_b, b = replica(api, "b")
    a.bind("uid-a", "default", "a", "n1")
    del api.pods["a"]  # deleted before B's pod watch saw it bound
    cache_b.remove_pod("uid-a")
    b.bind("uid-b", "default", "b", "n1")
    assert api.bindings == [("a", "n1"), ("b", "n1")]


def test_an_unconfirmed_foreign_claim_does_not_pin_the_pod_to_its_node() -> None:
    # A claimed pod a on n1 but its Binding never landed; kube-scheduler (now with B) binds
    # a to n2: B gives up the claim's hold and binds (the API refuses a second Binding of
    # one pod, so this cannot double-place it).
    api = CasApi()
    _, a = replica(api, "a")
    cache_b, b = replica(api, "b")
    cache_b.set_nodes([gpu_node("n1", 1), gpu_node("n2", 1)])
    assert a.fence is not None
    a.fence.commit(a.fence.view("n1"), a.fence.claim_of("uid-a", "default", "a", "n1", ("GPU-n1-0",), 600,
                                                      (9830,)))
    assert b.fence is not None
    b.fold(b.fence.view("n1"))
    assert cache_b.summary()["gpu_allocated_milli"] == 600
    b.bind("uid-a", "default", "a", "n2")
    assert api.bindings == [("a", "n2")]
    assert [x["node"] for x in cache_b.allocations()] == ["n2"]


def test_another_instances_claim_of_the_same_pod_is_kept() -> None:
    # Two schedulers bound one pod at once: the API keeps one Binding, and until the pod
    # watch shows which, both claims must count. Only an instance's own earlier claim of
    # the pod is replaced.
    api = CasApi()
    x = ClaimFence(api, "gpufrac", "x", ttl_s=60, clock=lambda: 1000.0)
    y = ClaimFence(api, "gpufrac", "y", ttl_s=60, clock=lambda: 1000.0)
    ledger = x.commit(x.view("n1"), claim("a", owner="x"))
    ledger = y.commit(ledger, claim("a", owner="y"))
    assert [(c.uid, c.owner) for c in ledger.claims] == [("a", "x"), ("a", "y")]
    ledger = x.commit(ledger, claim("a", owner="x", at_s=1001.0))
    assert [(c.uid, c.owner, c.at_s) for c in ledger.claims] == [("a", "y", 1000.0), ("a", "x", 1001.0)]


def test_a_claim_of_a_pod_this_instance_binds_elsewhere_refuses_binds_to_its_node() -> None:
    # B has a bind of pod a to n2 in flight when it learns that A claimed a on n1: until one
    # of the two settles, what n1 holds is unknown, so B binds nothing there.
    api = CasApi()
    _, a = replica(api, "a")
    cache_b, b = replica(api, "b")
    cache_b.set_nodes([gpu_node("n1", 1), gpu_node("n2", 1)])
    cache_b.assume("uid-a", "default", "a", "n2", ttl_s=60)
    a.bind("uid-a", "default", "a", "n1")
    with pytest.raises(BindError, match="pod default/a is claimed on n1 by a while a bind of it by this instance"):
        b.bind("uid-b", "default", "b", "n1")
    assert api.bindings == [("a", "n1")]
    # B's bind of a fails (the API bound it to n1) and is given back: now the claim counts.
    cache_b.forget("uid-a")
    with pytest.raises(BindError, match="insufficient GPU share"):
        b.bind("uid-b", "default", "b", "n1")


def test_a_claim_counts_in_full_even_where_the_gpu_looks_full() -> None:
    # A committed claim passed the compare-and-swap against every earlier claim: if this
    # cache sees the GPU full, that is its own bind in flight that will fail. Counting the
    # claim only up to what looks free (as for an untrusted pod annotation) would leave
    # room on the GPU once that bind is given back.
    from extender.cache import ClaimedAllocation

    c = GpuCache(build_scorer(scoring_config("default")))
    c.set_nodes([gpu_node("n1", 1)])
    for name in ("a", "b"):
        c.apply_pod_event("ADDED", pod_intent(pod_json(name, annotations={ann.FRACTION: "0.6"})))
    c.assume("uid-a", "default", "a", "n1", ttl_s=60)  # ours, in flight: 600 milli
    claim_b = ClaimedAllocation("uid-b", "default", "b", "n1", ("GPU-n1-0",), 600, (9830,), "other", 60)
    c.count_claim(claim_b)
    assert c.summary()["gpu_allocated_milli"] == 1200  # 600 + 600: b in full, not the 400 left
    c.forget("uid-a")  # our bind lost: b's 600 is all that is there
    assert c.summary()["gpu_allocated_milli"] == 600
    # The pod watch read b's annotations while a looked present: an over-commit, counted
    # short (400); the claim, still live, restores it to what was committed.
    c.remove_pod("uid-b")
    c.assume("uid-a", "default", "a", "n1", ttl_s=60)
    record = allocation_annotations(["GPU-n1-0"], 600, [9830], NOW)
    c.apply_pod_event("MODIFIED", pod_intent(pod_json("b", node="n1", annotations={ann.FRACTION: "0.6", **record})))
    assert c.summary()["gpu_allocated_milli"] == 1000  # 600 + the 400 that looked free
    c.count_claim(claim_b)
    assert c.summary()["gpu_allocated_milli"] == 1200


# -- the watermark: claims leave the ledger once the pod watch shows them bound ---------------

def bound_event(api: CasApi, name: str, node: str = "n1") -> dict[str, Any]:
    """Pod ``name`` as the pod watch shows it after the Binding gpufrac wrote (its claim's
    GPUs and share)."""
    ledger = parse_ledger(api.maps[ledger_name(node)])
    assert ledger is not None
    c = next(c for c in ledger.claims if c.name == name)
    record = allocation_annotations(c.gpu_uuids, c.gpu_milli, c.gpu_memory_mib, NOW)
    return pod_json(name, node=node, annotations={ann.FRACTION: "0.6", **record})


def test_claims_the_pod_watch_shows_bound_leave_the_ledger_under_a_watermark() -> None:
    api = CasApi()
    cache_a, a = replica(api, "a")
    a.bind("uid-a", "default", "a", "n1")
    # A's pod watch shows the Binding at revision 100: the claim is redundant from there.
    cache_a.apply_pod_event("MODIFIED", pod_intent(bound_event(api, "a")))
    a.pods_rv, a.bound_rv = (lambda: 100), (lambda uid: 100 if uid == "uid-a" else None)
    cache_a.apply_pod_event("ADDED", pod_intent(pod_json("c", annotations={ann.FRACTION: "0.2"})))
    api.pods["c"] = pod_json("c", annotations={ann.FRACTION: "0.2"})
    a.bind("uid-c", "default", "c", "n1")
    ledger = parse_ledger(api.maps[ledger_name("n1")])
    assert ledger is not None and [c.uid for c in ledger.claims] == ["uid-c"] and ledger.watermark == 100


def test_an_instance_whose_pod_watch_is_behind_the_watermark_never_commits() -> None:
    # B has not seen a's Binding; the ledger no longer carries a's claim (watermark 100).
    # Committing from its cache would put b (0.6) beside a (0.6) on one GPU.
    api = CasApi()
    cache_a, a = replica(api, "a")
    cache_b, b = replica(api, "b")
    a.bind("uid-a", "default", "a", "n1")
    seen_a = bound_event(api, "a")
    cache_a.apply_pod_event("MODIFIED", pod_intent(seen_a))
    a.pods_rv, a.bound_rv = (lambda: 100), (lambda uid: 100 if uid == "uid-a" else None)
    cache_a.apply_pod_event("ADDED", pod_intent(pod_json("c", annotations={ann.FRACTION: "0.2"})))
    api.pods["c"] = pod_json("c", annotations={ann.FRACTION: "0.2"})
    a.bind("uid-c", "default", "c", "n1")
    b.pods_rv = lambda: 90
    assert b.fence is not None
    b.fence.refresh("n1")
    with pytest.raises(BindError, match=r"pod watch is behind the claim ledger of n1 \(revision 90 < 100\)"):
        b.bind("uid-b", "default", "b", "n1")
    assert len(api.bindings) == 2 and cache_b.summary()["gpu_allocated_milli"] == 0  # nothing held
    # Its watch catches up: a is counted from the pod itself, and the fit refuses b.
    cache_b.apply_pod_event("MODIFIED", pod_intent(seen_a))
    b.pods_rv = lambda: 100
    with pytest.raises(BindError, match="insufficient GPU share"):
        b.bind("uid-b", "default", "b", "n1")
    assert [name for name, _ in api.bindings] == ["a", "c"]


# -- group commit: binds to one node that arrive during a write share the next one ------------

def test_binds_arriving_during_a_claim_write_share_the_next_write() -> None:
    import threading
    import time

    api = CasApi()
    cache = GpuCache(build_scorer(scoring_config("default")))
    cache.set_nodes([gpu_node("n1", 2)])
    names = [f"q{i}" for i in range(8)]
    for name in names:
        api.pods[name] = pod_json(name, annotations={ann.FRACTION: "0.25"})
        cache.apply_pod_event("ADDED", pod_intent(api.pods[name]))
    binder = KubeBinder(api, cache, 60, fence=ClaimFence(api, "gpufrac", "a", ttl_s=60, clock=lambda: 1000.0))
    writes: list[int] = []
    plain = api._write

    def slow_write(method: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if "/configmaps" in path:
            writes.append(len(json.loads(body["data"]["claims.json"])))
            time.sleep(0.05)  # a write in flight: the other binds queue meanwhile
        return plain(method, path, body)

    api.api_client = FakeApiClient(slow_write)
    errors: list[Exception] = []

    def bind(name: str) -> None:
        try:
            binder.bind(f"uid-{name}", "default", name, "n1")
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=bind, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert errors == [] and sorted(n for n, _ in api.bindings) == names
    # 8 binds, fewer writes: the first alone, the rest in groups; every claim written once.
    assert len(writes) < 8 and sum(writes) >= 8
    ledger = parse_ledger(api.maps[ledger_name("n1")])
    assert ledger is not None and sorted(c.name for c in ledger.claims) == names
    per_gpu: dict[str, int] = {}
    for c in ledger.claims:
        per_gpu[c.gpu_uuids[0]] = per_gpu.get(c.gpu_uuids[0], 0) + c.gpu_milli
    assert max(per_gpu.values()) <= 1000 and cache.summary()["gpu_allocated_milli"] == 2000


def test_a_conflict_refuses_the_whole_group_and_holds_nothing() -> None:
    api = CasApi()
    cache_a, a = replica(api, "a")
    _, b = replica(api, "b")
    assert a.fence is not None and b.fence is not None
    a.fence.view("n1")
    b.bind("uid-b", "default", "b", "n1")  # the ledger moves past what A saw
    with pytest.raises(BindError, match="another gpufrac instance bound there first") as refused:
        a.bind("uid-a", "default", "a", "n1")
    assert refused.value.reason == "conflict"
    assert cache_a.summary()["gpu_allocated_milli"] == 0 and [n for n, _ in api.bindings] == ["b"]


def test_claim_ttls_run_on_the_monotonic_clock_and_other_replicas_skew_is_measured() -> None:
    # Replica b's wall clock is 600 s ahead of a's; a's wall clock is then stepped back an hour
    # (NTP): neither moves a TTL, which runs on a's monotonic clock from first sight.
    api = CasApi()
    mono, wall = [50.0], [1000.0]
    a = ClaimFence(api, "gpufrac", "a", ttl_s=60, clock=lambda: mono[0], wall=lambda: wall[0])
    b = ClaimFence(api, "gpufrac", "b", ttl_s=60, clock=lambda: 7.0, wall=lambda: 1600.0)
    ledger = b.commit(b.view("n1"), b.claim_of("u1", "default", "u1", "n1", ["GPU-n1-0"], 500, [8192]))
    assert ledger.claims[0].at_s == 1600.0  # stamped by b's wall clock, for people
    seen = a.observe("MODIFIED", api.maps["gpufrac-claims-n1"])
    assert seen is not None and a.skews() == {"b": 600.0}
    wall[0] -= 3600.0
    mono[0] += 59.0
    assert [c.uid for c, _ in a.live(seen)] == ["u1"]  # 59 s of a's monotonic clock
    mono[0] += 2.0
    assert a.live(seen) == []  # 61 s: expired, whatever either wall clock says
    assert b.skews() == {}  # its own claims are not skew
