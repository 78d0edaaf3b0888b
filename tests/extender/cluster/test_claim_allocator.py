"""gpufrac allocates ResourceClaims (``extender.cluster.claim_allocator``), without a server:
the plan read from the claim book, filter and prioritize on the claims' request, the claim
writes and the bind's hand-over from the pod's hold to the claims' records.

``tests/e2e/test_dra_node_e2e.py`` runs it against a real kube-scheduler profile, API server,
kubelet and the agent's DRA driver.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from extender.cache import BindError
from extender.cluster import claim_allocator as ca
from extender.cluster.binder import KubeBinder
from extender.cluster.claim_allocator import ClaimBinding, ClaimPlacement, ClaimWriter, claim_plan
from extender.verbs.filter import ExtenderArgs, filter
from extender.verbs.prioritize import prioritize
from podspec import annotations as ann
from podspec.claims import DRIVER
from podspec.pods import pod_intent
from tests.conftest import gpu_node, pod_json
from tests.extender.cluster.test_resource_claims import (
    Book,
    annotation_pod,
    ask,
    claim_pod,
    claim_spec,
    result,
)


def allocated(name: str, *results: dict[str, Any]) -> dict[str, Any]:
    obj = claim_spec(name, ask("250"))
    obj["status"] = {"allocation": {"devices": {"results": list(results)}}}
    return obj


def plan_of(b: Book, pod: dict[str, Any]) -> ca.ClaimPlan | None:
    intent = pod_intent(pod)
    return claim_plan(intent, b.book.claims_of(intent.namespace, intent.resource_claims))


def test_a_claims_requests_become_the_pods_gpu_request() -> None:
    b = Book()
    b.book.apply("ADDED", claim_spec("c", ask("250", memory="8Gi")))
    plan = plan_of(b, claim_pod("c"))
    assert plan is not None
    assert (plan.gpu_count, plan.gpu_milli, plan.gpu_memory_mib, plan.node) == (1, 250, 8192, "")
    b.book.apply("ADDED", claim_spec("w", ask(None, count=2)))
    whole = plan_of(b, claim_pod("w"))
    assert whole is not None and (whole.gpu_count, whole.gpu_milli, whole.gpu_memory_mib) == (2, 1000, None)
    b.book.apply("ADDED", claim_spec("other", ask("1", device_class="gpu.nvidia.com")))
    assert plan_of(b, pod_json("plain", gpus=None)) is None


@pytest.mark.parametrize(("claims", "pod", "message"), [
    ([], claim_pod(generated={"gpu": ""}), "not made yet"),
    ([], claim_pod("unseen"), "claim unseen not seen by gpufrac yet"),
    ([claim_spec("c", ask("500"), ask("1", device_class="gpu.nvidia.com"))], claim_pod("c"), "another DeviceClass"),
    ([claim_spec("c", ask("500", selectors=True))], claim_pod("c"), "CEL selectors"),
    ([claim_spec("c", ask("500"), ask("250"))], claim_pod("c"), "unequal shares"),
    ([claim_spec("c", ask("500", count=2))], claim_pod("c"), "a share below a whole GPU is placed on one device"),
    ([claim_spec("c", {"deviceClassName": DRIVER, "allocationMode": "All"})], claim_pod("c"), "asked by count"),
    ([allocated("a", result("gpu-0", pool="n1")), allocated("b", result("gpu-0", pool="n2"))], claim_pod("a", "b"),
     "allocated on different nodes: n1, n2"),
])
def test_what_gpufrac_cannot_allocate_is_refused_with_the_reason(claims: list[dict[str, Any]], pod: dict[str, Any],
                                                                  message: str) -> None:
    b = Book()
    for c in claims:
        b.book.apply("ADDED", c)
    with pytest.raises(ValueError, match=message):
        plan_of(b, pod)
    args = ExtenderArgs.model_validate({"Pod": pod, "NodeNames": ["n1", "n2"]})
    reply = filter(b.cache, args, shape=ClaimPlacement(b.book).shape)
    assert message in reply.body["Error"] and not reply.body["NodeNames"]


def test_both_annotations_and_claims_are_refused() -> None:
    b = Book()
    b.book.apply("ADDED", claim_spec("c", ask("500")))
    pod = claim_pod("c")
    pod["spec"]["containers"][0]["resources"] = {"limits": {ann.RESOURCE_GPU: "1"}}
    with pytest.raises(ValueError, match="both by gpufrac.io/gpu and by a ResourceClaim"):
        plan_of(b, pod)
    b.book.apply("ADDED", allocated("shared", result("gpu-0", share="100", pool="n1")))
    pod = claim_pod("shared")
    pod["spec"]["containers"][0]["resources"] = {"limits": {ann.RESOURCE_GPU: "1"}}
    with pytest.raises(ValueError, match="both by gpufrac.io/gpu and by a ResourceClaim"):
        plan_of(b, pod)


def test_filter_and_prioritize_place_the_claims_share_and_allocated_claims_pin_the_node() -> None:
    b = Book(gpu_node("n1", 1), gpu_node("n2", 1))
    annotation_pod(b, "busy", "GPU-n1-0", "0.6")  # n1's GPU has 400 left
    b.book.apply("ADDED", claim_spec("c", ask("500")))
    placement = ClaimPlacement(b.book)
    args = ExtenderArgs.model_validate({"Pod": claim_pod("c"), "NodeNames": ["n1", "n2"]})
    # Without the shape the pod asks no GPU and both nodes pass; with it only n2 has 500.
    assert set(filter(b.cache, args, decide=False).body["NodeNames"]) == {"n1", "n2"}
    reply = filter(b.cache, args, decide=False, refuse=placement.refusals, shape=placement.shape)
    assert reply.body["NodeNames"] == ["n2"] and "n1" in reply.body["FailedNodes"]
    scores = {h["Host"]: h["Score"] for h in prioritize(b.cache, args, placement.shape).body}
    assert scores["n2"] > scores["n1"]
    # A claim allocated on n1 (shared by another pod): this pod may only go to n1.
    b.book.apply("ADDED", allocated("shared", result("gpu-0", share="100", pool="n1")))
    pinned = ExtenderArgs.model_validate({"Pod": claim_pod("shared"), "NodeNames": ["n1", "n2"]})
    reply = filter(b.cache, pinned, decide=False, refuse=placement.refusals, shape=placement.shape)
    assert reply.body["NodeNames"] == ["n1"]
    assert reply.body["FailedNodes"] == {"n2": "gpufrac: the pod's claims are allocated on node n1"}


def test_a_claim_pod_filtered_is_requeued_once_share_is_freed_unless_bound_by_then() -> None:
    b = Book(gpu_node("n1", 1))
    b.book.apply("ADDED", claim_spec("c", ask("500")))
    b.book.apply("ADDED", claim_spec("d", ask("500")))
    placement = ClaimPlacement(b.book)
    waiting, bound = claim_pod("c"), claim_pod("d")
    waiting["metadata"].update(name="waiting", uid="uid-waiting")
    bound["metadata"].update(name="bound", uid="uid-bound")
    for pod in (waiting, bound):
        b.cache.apply_pod_event("ADDED", pod_intent(pod))
        filter(b.cache, ExtenderArgs.model_validate({"Pod": pod, "NodeNames": ["n1"]}), shape=placement.shape)
    b.cache.apply_pod_event("MODIFIED", pod_intent({**bound, "spec": {**bound["spec"], "nodeName": "n1"}}))
    assert [p.key for p in b.book.refused_pods()] == ["team/waiting"]
    assert b.book.refused_pods() == []  # forgotten once handed to the requeue


class FakeClaims:
    """The API side of ``ClaimWriter``: claims by name, every write recorded."""

    def __init__(self, *claims: dict[str, Any]) -> None:
        self.objects = {c["metadata"]["name"]: {**c, "metadata": {**c["metadata"], "resourceVersion": "1"}}
                        for c in claims}
        self.writes: list[tuple[str, dict[str, Any]]] = []
        self.fail_status: int | None = None

    def get(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return self.objects[args[4]]

    def write(self, api: Any, method: str, path: str, body: dict[str, Any], timeout_s: float = 0) -> dict[str, Any]:
        assert method == "PUT"
        if path.endswith("/status") and self.fail_status and "allocation" in (body.get("status") or {}):
            raise ApiException(status=self.fail_status, reason="Conflict")
        self.writes.append((path, body))
        name = path.removesuffix("/status").rsplit("/", 1)[1]
        self.objects[name] = body
        return body


def writer_over(b: Book, fake: FakeClaims, monkeypatch: pytest.MonkeyPatch) -> ClaimWriter:
    monkeypatch.setattr(ca, "write_json", fake.write)
    w = ClaimWriter.__new__(ClaimWriter)
    w._api, w._node_gpus, w._timeout_s = None, b.book.node_gpus, 1.0
    w._objects = type("Objects", (), {"get_namespaced_custom_object": staticmethod(fake.get)})()
    return w


def test_the_claim_is_written_as_kube_schedulers_allocator_writes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    b = Book()
    c = claim_spec("c", ask("250", memory="8Gi"))
    b.book.apply("ADDED", c)
    fake = FakeClaims(c)
    pod = claim_pod("c")
    intent = pod_intent(pod)
    plan = plan_of(b, pod)
    assert plan is not None
    written = writer_over(b, fake, monkeypatch).allocate(plan, intent, "n1", ["GPU-n1-1"])
    (meta_path, meta), (status_path, body) = fake.writes
    assert meta_path == "/apis/resource.k8s.io/v1/namespaces/team/resourceclaims/c"
    assert meta["metadata"]["finalizers"] == [ca.FINALIZER]
    assert status_path == meta_path + "/status"
    [res] = body["status"]["allocation"]["devices"]["results"]
    assert {k: v for k, v in res.items() if k != "shareID"} == {
        "request": "r0", "driver": DRIVER, "pool": "n1", "device": "gpu-1",
        "consumedCapacity": {"share": "250", "memory": "8192Mi", "slots": "1"}}
    assert len(res["shareID"]) == 36
    assert body["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"] == [
        {"key": "metadata.name", "operator": "In", "values": ["n1"]}]
    assert body["status"]["reservedFor"] == [{"resource": "pods", "name": "cp", "uid": intent.uid}]
    assert written == [body]


def test_a_claim_allocated_meanwhile_refuses_the_bind_and_undoes_what_was_written(
        monkeypatch: pytest.MonkeyPatch) -> None:
    b = Book()
    first, second = claim_spec("a", ask("250")), claim_spec("b", ask("250"))
    for c in (first, second):
        b.book.apply("ADDED", c)
    fake = FakeClaims(first, {**second, "status": {"allocation": {"devices": {"results": []}}}})
    # Two claims of 250 ask two devices below a whole GPU: refused before any write.
    with pytest.raises(ValueError, match="placed on one device"):
        plan_of(b, claim_pod("a", "b"))
    only_b = claim_pod("b")
    plan_b = plan_of(b, only_b)
    assert plan_b is not None
    with pytest.raises(BindError, match="allocated meanwhile"):
        writer_over(b, fake, monkeypatch).allocate(plan_b, pod_intent(only_b), "n1", ["GPU-n1-0"])
    assert fake.writes == []
    # A status write refused by the API server: the finalizer written stays, nothing else.
    fake = FakeClaims(first)
    fake.fail_status = 409
    plan_a = plan_of(b, claim_pod("a"))
    assert plan_a is not None
    with pytest.raises(BindError, match="409"):
        writer_over(b, fake, monkeypatch).allocate(plan_a, pod_intent(claim_pod("a")), "n1", ["GPU-n1-0"])
    assert [p for p, _ in fake.writes] == ["/apis/resource.k8s.io/v1/namespaces/team/resourceclaims/a"]
    assert "allocation" not in (fake.objects["a"].get("status") or {})


class StubWriter:
    """``ClaimWriter`` without the API: the claim allocated as asked, or a failure."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.undone: list[str] = []

    def allocate(self, plan: ca.ClaimPlan, pod: Any, node: str, gpu_uuids: Any) -> list[dict[str, Any]]:
        if self.fail:
            raise BindError("gpufrac: writing claim: 409 Conflict", "conflict")
        if not plan.asks:  # reserved already (the real writer skips it): nothing written
            return []
        view, a = plan.asks[0]
        obj = claim_spec(view.name, ask(str(a.gpu_milli)))
        obj["status"] = {"allocation": {"devices": {"results": [
            result(f"gpu-{gpu_uuids[0].rsplit('-', 1)[1]}", share=str(a.gpu_milli), pool=node, request="r0")]}}}
        return [obj]

    def undo(self, written: Any, pod: Any, ours: set[str]) -> list[dict[str, Any]]:
        self.undone = sorted(ours)
        return [{**w, "status": {}} for w in written]


def binder_over(b: Book, writer: StubWriter, binding_status: int | None = None) -> tuple[KubeBinder, list[Any]]:
    binder = KubeBinder(None, b.cache, assume_ttl_s=30.0)
    binder.claims = ClaimBinding(ClaimPlacement(b.book), writer, b.book, b.cache)  # type: ignore[arg-type]
    bindings: list[Any] = []

    def create_binding(uid: str, ns: str, name: str, node: str, annotations: Any) -> None:
        if binding_status:
            raise ApiException(status=binding_status, reason="Refused")
        bindings.append((name, node, dict(annotations)))
    binder._create_binding = create_binding  # type: ignore[method-assign,assignment]
    return binder, bindings


def test_bind_places_the_claim_on_the_cores_gpu_and_hands_the_hold_to_the_claim(
        caplog: pytest.LogCaptureFixture) -> None:
    b = Book(gpu_node("n1", 2))
    annotation_pod(b, "busy", "GPU-n1-0", "0.6")
    b.book.apply("ADDED", claim_spec("c", ask("300")))
    pod = claim_pod("c")
    b.cache.apply_pod_event("ADDED", pod_intent(pod))
    binder, bindings = binder_over(b, StubWriter())
    binder.bind(pod["metadata"]["uid"], "team", "cp", "n1")
    # The core's choice: the 300 fits beside the 600 (best fit), not on the empty GPU.
    assert b.held() == {"GPU-n1-0": [600, 300]}
    assert b.book.held() == {"team/c": ("resourceclaim/uid-c/0",)}
    assert bindings == [("cp", "n1", {})]  # no allocation annotation: the claim is the record
    assert b.cache.summary()["gpu_allocated_milli"] == 900  # counted once
    # The pod's hold is given back before the claim is counted: never read as an over-commit.
    assert "not one gpufrac could have made" not in caplog.text
    assert all(a["overcommit"] == "" for a in b.cache.allocations())


class WatchFirstWriter(StubWriter):
    """The claim watch shows each written claim before ``allocate`` returns, as it may under
    load: the pod's own hold still counts the same GPUs at that moment."""

    def __init__(self, b: Book) -> None:
        super().__init__()
        self.b = b

    def allocate(self, plan: ca.ClaimPlan, pod: Any, node: str, gpu_uuids: Any) -> list[dict[str, Any]]:
        written = super().allocate(plan, pod, node, gpu_uuids)
        for obj in written:
            self.b.book.apply("MODIFIED", obj)
        return written


def test_a_claim_the_watch_shows_before_the_hand_over_is_counted_in_full_after_it() -> None:
    b = Book(gpu_node("n1", 1))
    annotation_pod(b, "busy", "GPU-n1-0", "0.6")
    b.book.apply("ADDED", claim_spec("c", ask("300")))
    pod = claim_pod("c")
    b.cache.apply_pod_event("ADDED", pod_intent(pod))
    binder, bindings = binder_over(b, WatchFirstWriter(b))
    binder.bind(pod["metadata"]["uid"], "team", "cp", "n1")
    assert bindings == [("cp", "n1", {})]
    # Counted once and in full: read while the hold was counted it was an over-commit of 900 + 300,
    # kept at the 100 that was free; had it stayed so, the GPU would show 200 free that the claim holds.
    assert b.held() == {"GPU-n1-0": [600, 300]}
    assert b.cache.summary()["gpu_allocated_milli"] == 900
    assert all(a["overcommit"] == "" for a in b.cache.allocations())
    # And the next 0.25 pod does not fit there (it would on a GPU counted short).
    late = pod_json("late", annotations={ann.FRACTION: "0.25"})
    b.cache.apply_pod_event("ADDED", pod_intent(late))
    with pytest.raises(BindError):
        binder.bind(late["metadata"]["uid"], "default", "late", "n1")


def test_a_bind_of_a_pod_already_bound_there_is_refused_and_leaves_its_record() -> None:
    # Two schedulers race for the pod: the other's Binding landed and the pod watch showed it
    # (bound, no GPU of its own: its claims hold them), then this instance's bind comes.
    b = Book(gpu_node("n1", 1))
    b.book.apply("ADDED", claim_spec("c", ask("300")))
    pod = claim_pod("c")
    bound = {**pod, "spec": {**pod["spec"], "nodeName": "n1"}, "status": {"phase": "Running"}}
    b.cache.apply_pod_event("ADDED", pod_intent(bound))
    before = b.cache.allocations()
    writer = StubWriter()
    binder, bindings = binder_over(b, writer)
    with pytest.raises(BindError, match="already bound to n1"):
        binder.bind(pod["metadata"]["uid"], "team", "cp", "n1")
    assert bindings == [] and b.book.held() == {}
    assert b.cache.allocations() == before  # its record kept, nothing written for it


@pytest.mark.parametrize("where", ["claim", "binding"])
def test_a_failed_bind_holds_nothing_and_undoes_the_claim(where: str) -> None:
    b = Book(gpu_node("n1", 1))
    b.book.apply("ADDED", claim_spec("c", ask("300")))
    pod = claim_pod("c")
    b.cache.apply_pod_event("ADDED", pod_intent(pod))
    writer = StubWriter(fail=where == "claim")
    binder, bindings = binder_over(b, writer, binding_status=500 if where == "binding" else None)
    with pytest.raises(BindError):
        binder.bind(pod["metadata"]["uid"], "team", "cp", "n1")
    assert b.cache.summary()["gpu_allocated_milli"] == 0 and not bindings
    assert b.book.held() == {}
    assert writer.undone == (["uid-c"] if where == "binding" else [])


def test_a_bind_to_another_node_than_the_allocated_claims_is_refused() -> None:
    b = Book()
    b.book.apply("ADDED", allocated("shared", result("gpu-0", share="100", pool="n1")))
    pod = claim_pod("shared")
    b.cache.apply_pod_event("ADDED", pod_intent(pod))
    binder, bindings = binder_over(b, StubWriter())
    with pytest.raises(BindError, match="allocated on node n1, not n2"):
        binder.bind(pod["metadata"]["uid"], "team", "cp", "n2")
    assert not bindings


def fenced_replica(api: Any, identity: str, claim_pod_obj: dict[str, Any], other: dict[str, Any]) -> tuple[Book, KubeBinder]:
    """One fenced gpufrac instance over the shared fake API: n1 (one GPU), the claim pod and
    another pod pending, a claim book of its own (its own claim watch)."""
    from extender.fence import ClaimFence

    b = Book(gpu_node("n1", 1))
    for obj in (claim_pod_obj, other):
        api.pods[obj["metadata"]["name"]] = obj
        b.cache.apply_pod_event("ADDED", pod_intent(obj))
    binder = KubeBinder(api, b.cache, 60, fence=ClaimFence(api, "gpufrac", identity, ttl_s=60, clock=lambda: 1000.0))
    binder.claims = ClaimBinding(ClaimPlacement(b.book), StubWriter(), b.book, b.cache)  # type: ignore[arg-type]
    return b, binder


def team_pod(name: str, fraction: str) -> dict[str, Any]:
    pod = pod_json(name, annotations={ann.FRACTION: fraction})
    pod["metadata"]["namespace"] = "team"
    return pod


def fenced_pair(other_fraction: str) -> tuple[Any, dict[str, Any], dict[str, Any], dict[str, Any],
                                               tuple[Book, KubeBinder], tuple[Book, KubeBinder]]:
    """Two fenced replicas over one fake API (``CasApi``): claim c asking 600 milli, its pod
    cp, and an annotation pod q pending."""
    from tests.extender.test_fence import CasApi

    api = CasApi()
    pod, other = claim_pod("c"), team_pod("q", other_fraction)
    return (api, claim_spec("c", ask("600")), pod, other,
            fenced_replica(api, "a", pod, other), fenced_replica(api, "b", pod, other))


def test_fenced_another_replica_counts_the_claim_until_its_claim_watch_shows_it() -> None:
    api, c, pod, other, (a, binder_a), (b, binder_b) = fenced_pair("0.6")
    small = team_pod("s", "0.4")
    for rep in (a, b):
        rep.book.apply("ADDED", c)
        api.pods["s"] = small
        rep.cache.apply_pod_event("ADDED", pod_intent(small))
    binder_a.bind(pod["metadata"]["uid"], "team", "cp", "n1")
    assert a.held() == {"GPU-n1-0": [600]} and [n for n, _ in api.bindings] == ["cp"]
    # B has seen neither the bind nor the claim's allocation: A's fence claim counts.
    with pytest.raises(BindError, match="insufficient GPU share"):
        binder_b.bind(other["metadata"]["uid"], "team", "q", "n1")
    # B's pod watch shows the pod bound with no GPU of its own, its claim watch is behind:
    # the fence claim would count nothing, so B refuses to bind there.
    bound = {**pod, "spec": {**pod["spec"], "nodeName": "n1"}, "status": {**pod["status"], "phase": "Running"}}
    b.cache.apply_pod_event("MODIFIED", pod_intent(bound))
    with pytest.raises(BindError, match="claim watch has not shown allocated yet"):
        binder_b.bind(other["metadata"]["uid"], "team", "q", "n1")
    # B's claim watch delivers the allocation: the book counts it, the fence claim is left
    # out (not counted twice): 400 are left, the 0.4 pod fits, the 0.6 one does not.
    written = {**c, "status": {"allocation": {"devices": {"results": [
        result("gpu-0", share="600", pool="n1", request="r0")]}}}}
    b.book.apply("MODIFIED", written)
    with pytest.raises(BindError, match="insufficient GPU share"):
        binder_b.bind(other["metadata"]["uid"], "team", "q", "n1")
    binder_b.bind(small["metadata"]["uid"], "team", "s", "n1")
    assert sorted(sum(b.held().values(), [])) == [400, 600]


def test_fenced_a_bind_that_only_reserves_allocated_claims_writes_no_empty_fence_claim() -> None:
    # The other replica's kube-scheduler binds the same pod after its claim was allocated:
    # the pod holds no GPU, so there is nothing to fence; a claim of no GPUs in the ledger
    # was read by every replica as a bad entry (quarantined, logged at every read).
    import json

    from extender.fence import DATA_KEY

    api, c, pod, _other, (a, binder_a), (b, binder_b) = fenced_pair("0.2")
    a.book.apply("ADDED", c)
    binder_a.bind(pod["metadata"]["uid"], "team", "cp", "n1")
    [ledger] = api.maps.values()
    written = {**c, "status": {"allocation": {"devices": {"results": [
        result("gpu-0", share="600", pool="n1", request="r0")]}}, "reservedFor": [
            {"resource": "pods", "name": "cp", "uid": pod["metadata"]["uid"]}]}}
    b.book.apply("ADDED", written)
    binder_b.bind(pod["metadata"]["uid"], "team", "cp", "n1")   # reserves only: already reserved
    assert [n for n, _ in api.bindings] == ["cp", "cp"]
    assert [ledger] == list(api.maps.values())                   # no write: nothing to fence
    assert [cl["gpus"] for cl in json.loads(ledger["data"][DATA_KEY])] == [["GPU-n1-0"]]
