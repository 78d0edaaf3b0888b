"""Cluster-mode decision logic without a server: assumed allocations, rollback, node parsing.

The API is a fake here (unit tests); ``tests/e2e`` runs the same code against the real
kube-apiserver and kube-scheduler.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
import time
from typing import Any

import pytest
import urllib3

from extender.admin_config import scoring_config
from extender.cache import BindError, GpuCache
from extender.cluster import ClusterSync, KubeBinder, SyncOptions
from podspec import annotations as ann
from podspec.kubeio import core_path
from podspec.nodes import node_observation
from podspec.pods import PodIntent, allocation_annotations, pod_intent
from scoring.scorer import build_scorer
from scoring.shape_prior import NO_PRIOR
from tests.conftest import gpu_node, pod_json
from tests.extender.helpers import FakeApiClient, FakeResponse

NOW = dt.datetime(2026, 11, 22, 12, 0, 0, tzinfo=dt.UTC)


def cache_with(*nodes: Any, prior: bool = True) -> GpuCache:
    """A cache of the default preset; ``prior=False``: the workload counts observed pods only
    (the tests of what is counted; ``tests/scoring/test_shape_prior.py`` tests the prior)."""
    config = scoring_config("default")
    c = GpuCache(build_scorer(config if prior else dataclasses.replace(config, prior=NO_PRIOR)))
    c.set_nodes(list(nodes))
    return c


def pending(c: GpuCache, name: str, **kw: Any) -> PodIntent:
    intent = pod_intent(pod_json(name, **kw))
    c.apply_pod_event("ADDED", intent)
    return intent


# -- assume / forget / expire ------------------------------------------------------------

def test_assume_holds_the_share_until_forgotten() -> None:
    c = cache_with(gpu_node("n1", 1))
    pending(c, "a", annotations={ann.FRACTION: "0.6"})
    pending(c, "b", annotations={ann.FRACTION: "0.6"})
    rec = c.assume("uid-a", "default", "a", "n1", ttl_s=60)
    assert rec.assumed_until is not None and rec.gpu_uuids == ("GPU-n1-0",)
    # 600 + 600 > 1000: b cannot have it while a's bind is in flight.
    with pytest.raises(BindError, match="insufficient GPU share"):
        c.assume("uid-b", "default", "b", "n1", ttl_s=60)
    assert c.forget("uid-a") is True
    assert c.summary()["gpu_allocated_milli"] == 0
    assert c.assume("uid-b", "default", "b", "n1", ttl_s=60).allocation is not None


def test_fgd_workload_counts_pending_and_placed_gpu_pods_once() -> None:
    def counts(c: GpuCache) -> dict[tuple[int, int, int, int], float]:
        tt = c.state_copy().workload.task_types()
        if tt is None:
            return {}
        rows = zip(tt.gpu_count.tolist(), tt.gpu_milli.tolist(), tt.cpu_milli.tolist(),
                   tt.memory_mib.tolist(), strict=True)
        return dict(zip(rows, tt.popularity.tolist(), strict=True))

    c = cache_with(gpu_node("n1", 1), prior=False)
    pending(c, "a", annotations={ann.FRACTION: "0.6"})      # 1 GPU x 600, 1 core, 1 GiB
    pending(c, "b", annotations={ann.FRACTION: "0.6"})
    pending(c, "cpu", gpus=None)                           # CPU-only: not a GPU task
    pending(c, "w", annotations={})                       # 1 whole GPU
    # three GPU pods waiting: 2 of type (1, 600) and 1 of (1, 1000)
    assert counts(c) == pytest.approx({(1, 600, 1000, 1024): 2 / 3, (1, 1000, 1000, 1024): 1 / 3})
    c.assume("uid-a", "default", "a", "n1", ttl_s=60)   # placed: still counted once
    assert counts(c) == pytest.approx({(1, 600, 1000, 1024): 2 / 3, (1, 1000, 1000, 1024): 1 / 3})
    c.forget("uid-a")                                    # pending again: still once
    assert counts(c) == pytest.approx({(1, 600, 1000, 1024): 2 / 3, (1, 1000, 1000, 1024): 1 / 3})
    c.set_nodes([gpu_node("n1", 1), gpu_node("n2", 2)])  # state rebuilt: pending re-counted
    assert counts(c) == pytest.approx({(1, 600, 1000, 1024): 2 / 3, (1, 1000, 1000, 1024): 1 / 3})
    c.remove_pod("uid-b")
    c.remove_pod("uid-w")
    assert counts(c) == {(1, 600, 1000, 1024): 1.0}
    c.remove_pod("uid-a")
    assert counts(c) == {}


def test_fgd_workload_knows_which_models_a_pod_accepts() -> None:
    c = cache_with(gpu_node("n1", 1), gpu_node("n2", 1, model="V100M32", memory_mib=32768), prior=False)
    pending(c, "v", annotations={ann.GPU_MODEL: "V100M32"})
    c.assume("uid-v", "default", "v", "n2", ttl_s=60)
    st = c.state_copy()
    tt = st.workload.task_types()
    assert tt is not None and tt.model_mask is not None
    assert tt.model_mask.tolist() == [1 << st.models.index("V100M32")]
    # The T4 is of no use to that task type: all of n1's share counts as its fragment.
    allowed = tt.allowed(st.gpu_model)
    assert allowed is not None
    assert allowed[:, 0, 0].tolist() == [False, True]


def test_concurrent_assumes_for_the_last_share_exactly_one_wins() -> None:
    c = cache_with(gpu_node("n1", 1))
    for i in range(8):
        pending(c, f"p{i}", annotations={ann.FRACTION: "0.6"})
    barrier = threading.Barrier(8)
    results: list[bool] = []

    def bind(i: int) -> None:
        barrier.wait()
        try:
            c.assume(f"uid-p{i}", "default", f"p{i}", "n1", ttl_s=60)
            results.append(True)
        except BindError:
            results.append(False)

    threads = [threading.Thread(target=bind, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]
    assert c.summary()["gpu_allocated_milli"] == 600


def test_watch_confirmation_stops_expiry_and_unconfirmed_expire() -> None:
    c = cache_with(gpu_node("n1", 2))
    pending(c, "a", annotations={ann.FRACTION: "0.5"})
    pending(c, "b", annotations={ann.FRACTION: "0.5"})
    a = c.assume("uid-a", "default", "a", "n1", ttl_s=10)
    c.assume("uid-b", "default", "b", "n1", ttl_s=10)
    # The watch shows a bound to n1 with the annotations gpufrac wrote: confirmed.
    assert a.allocation is not None and a.assumed_until is not None
    record = allocation_annotations(a.gpu_uuids, 500, a.allocation.gpu_memory_mib, NOW)
    c.apply_pod_event("MODIFIED", pod_intent(
        pod_json("a", node="n1", phase="Running", annotations={ann.FRACTION: "0.5", **record})))
    assert c.expire_assumed(now=a.assumed_until + 1) == ["default/b"]
    assert [x["name"] for x in c.allocations()] == ["a"]
    assert c.summary()["gpu_allocated_milli"] == 500


def test_unbound_pod_event_during_a_bind_keeps_the_assumed_allocation() -> None:
    c = cache_with(gpu_node("n1", 1))
    pending(c, "a", annotations={ann.FRACTION: "0.5"})
    c.assume("uid-a", "default", "a", "n1", ttl_s=10)
    # The watch delivers an older, still unbound version of the pod while the Binding is in flight.
    c.apply_pod_event("MODIFIED", pod_intent(pod_json("a", annotations={ann.FRACTION: "0.5"})))
    assert c.summary()["gpu_allocated_milli"] == 500


def test_rebuild_from_annotations_uses_the_recorded_share_and_memory() -> None:
    c = cache_with(gpu_node("n1", 2, memory_mib=16384))
    # Recorded at bind: 0.25 and 3000 MiB on GPU 1 (the request may have changed since).
    record = allocation_annotations(["GPU-n1-1"], 250, [3000], NOW)
    c.set_pods([pod_intent(pod_json("a", node="n1", phase="Running", annotations=record))])
    (alloc,) = c.allocations()
    assert (alloc["gpu_indices"], alloc["gpu_milli"], alloc["gpu_memory_mib"]) == ([1], 250, [3000])


def test_pod_listed_before_its_node_is_accounted_when_the_node_arrives() -> None:
    c = cache_with()
    record = allocation_annotations(["GPU-n1-0"], 500, [8192], NOW)
    c.set_pods([pod_intent(pod_json("a", node="n1", phase="Running", annotations=record))])
    assert c.allocations() == []
    c.upsert_nodes([gpu_node("n1", 1)])
    assert [a["gpu_milli"] for a in c.allocations()] == [500]


def test_set_pods_forgets_vanished_pods_but_keeps_binds_in_flight() -> None:
    c = cache_with(gpu_node("n1", 2))
    pending(c, "a", annotations={ann.FRACTION: "0.5"})
    pending(c, "b", annotations={ann.FRACTION: "0.5"})
    c.bind("uid-a", "default", "a", "n1")
    c.assume("uid-b", "default", "b", "n1", ttl_s=60)
    c.set_pods([])  # a new list after a watch gap: a is gone, b's Binding is in flight
    assert [x["name"] for x in c.allocations()] == ["b"]


# -- node parsing ------------------------------------------------------------------------

def node_json(name: str = "n1", inventory: str | None = None, cpu: str = "8", memory: str = "32Gi") -> dict[str, Any]:
    annotations = {} if inventory is None else {ann.INVENTORY: inventory}
    return {"metadata": {"name": name, "annotations": annotations},
            "status": {"allocatable": {"cpu": cpu, "memory": memory, ann.RESOURCE_GPU: "8"}}}


def inventory(node: str = "n1", heartbeat: dt.datetime = NOW, healthy: bool = True) -> str:
    return ann.dump_inventory(ann.NodeInventory(node=node, heartbeat=heartbeat, gpus=[
        ann.GpuInventory(index=1, uuid="GPU-b", model="A10", memory_mib=24576, replicas=4),
        ann.GpuInventory(index=0, uuid="GPU-a", model="A10", memory_mib=24576, replicas=4,
                         healthy=healthy, health_reason="" if healthy else "XID 79")]))


def test_node_observation_reads_allocatable_and_inventory() -> None:
    obs = node_observation(node_json(inventory=inventory(healthy=False)))
    # 8 cores = 8000 milli; 32 GiB = 32768 MiB; GPUs sorted by index.
    assert (obs.cpu_milli, obs.memory_mib, obs.problem) == (8000, 32768, "")
    assert [(g.index, g.uuid, g.healthy) for g in obs.gpus] == [(0, "GPU-a", False), (1, "GPU-b", True)]
    assert obs.spec(NOW + dt.timedelta(seconds=180), 180).ready is True
    assert obs.spec(NOW + dt.timedelta(seconds=181), 180).ready is False


@pytest.mark.parametrize(("inv", "problem"), [
    (None, "no gpufrac.io/inventory annotation"),
    ("{not json", "gpufrac.io/inventory: (root): Invalid JSON"),
    (inventory(node="other"), 'published for node "other"'),
])
def test_unusable_inventory_keeps_cpu_and_memory_but_no_gpus(inv: str | None, problem: str) -> None:
    obs = node_observation(node_json(inventory=inv))
    assert problem in obs.problem
    assert obs.gpus == () and obs.cpu_milli == 8000
    assert obs.spec(NOW, 180).ready is False


def test_allocation_annotations_round_trip() -> None:
    record = allocation_annotations(["GPU-a", "GPU-b"], 1000, [24576, 24576], NOW)
    assert record == {ann.ASSIGNED_GPUS: "GPU-a,GPU-b", ann.ASSIGNED_FRACTION: "1",
                      ann.ASSIGNED_MEMORY: "24576Mi,24576Mi", ann.ASSIGNED_AT: "2026-11-22T12:00:00Z"}
    intent = pod_intent(pod_json("a", gpus=2, node="n1", annotations=record))
    assert (intent.assigned_gpus, intent.assigned_gpu_milli, intent.assigned_memory_mib) == (
        ("GPU-a", "GPU-b"), 1000, (24576, 24576))


# -- binder against a fake API -----------------------------------------------------------

class FakeApi:
    """Records Binding calls; ``fail`` is the HTTP status the API answers a Binding with."""

    def __init__(self, fail: int | None = None, bound_to: str = "",
                 annotations: dict[str, str] | None = None) -> None:
        self.fail = fail
        self.bound_to = bound_to
        self.annotations = annotations
        self.bindings: list[tuple[str, dict[str, str]]] = []

        self.api_client = FakeApiClient(self._write)

    def _write(self, method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        assert (method, path) == ("POST", f"/api/v1/namespaces/default/pods/{body['metadata']['name']}/binding")
        self.bindings.append((body["target"]["name"], body["metadata"]["annotations"]))
        if self.fail is not None:
            return self.fail, {"kind": "Status", "code": self.fail}
        return 201, {"kind": "Status", "status": "Success"}

    def read_namespaced_pod(self, name: str, namespace: str, **kw: Any) -> FakeResponse:
        """The pod as the API has it: bound to ``bound_to`` with ``annotations``."""
        return FakeResponse(pod_json(name, uid=f"uid-{name}", node=self.bound_to or None,
                                     annotations={ann.FRACTION: "0.5", **(self.annotations or {})}))


def test_bind_writes_the_allocation_record_with_the_binding() -> None:
    c = cache_with(gpu_node("n1", 1))
    pending(c, "a", annotations={ann.FRACTION: "0.5"})
    api = FakeApi()
    KubeBinder(api, c, 60, now=lambda: NOW).bind("uid-a", "default", "a", "n1")
    # One API call: the Binding carries the annotations the API server writes on the pod.
    assert api.bindings == [("n1", allocation_annotations(["GPU-n1-0"], 500, [8192], NOW))]
    # Held as assumed until the pod watch shows the pod bound.
    assert c.summary()["gpu_allocated_milli"] == 500


def test_a_bind_holds_the_share_as_it_arrives_so_the_next_filter_counts_it() -> None:
    # kube-scheduler sends the next pod's filter while this pod's bind waits for its worker:
    # the hold taken on receipt makes that filter choose from what is left (issue 55: without
    # it, 32 binds of each 50-node fill were refused at bind and retried).
    c = cache_with(gpu_node("n1", 1), gpu_node("n2", 1))
    pending(c, "a", annotations={ann.FRACTION: "0.75"})
    b = pending(c, "b", annotations={ann.FRACTION: "0.5"})
    api = FakeApi()
    binder = KubeBinder(api, c, 60, now=lambda: NOW)
    assert c.evaluate(b, ["n1", "n2"]).evaluation.node_fits.all()
    binder.hold_on_receipt("uid-a", "default", "a", "n1")
    assert c.summary()["gpu_allocated_milli"] == 750 and api.bindings == []
    assert c.evaluate(b, ["n1", "n2"]).evaluation.node_fits.tolist() == [False, True]
    binder.bind("uid-a", "default", "a", "n1")  # finds the hold: one Binding, the same GPU, counted once
    assert api.bindings == [("n1", allocation_annotations(["GPU-n1-0"], 750, [12288], NOW))]
    assert c.summary()["gpu_allocated_milli"] == 750


def test_a_hold_on_receipt_that_cannot_be_taken_leaves_the_refusal_to_bind() -> None:
    c = cache_with(gpu_node("n1", 1))
    pending(c, "a", annotations={ann.FRACTION: "0.75"})
    pending(c, "b", annotations={ann.FRACTION: "0.5"})
    binder = KubeBinder(FakeApi(), c, 60)
    binder.hold_on_receipt("uid-a", "default", "a", "n1")
    binder.hold_on_receipt("uid-b", "default", "b", "n1")  # does not fit: nothing held, nothing raised
    binder.hold_on_receipt("uid-x", "default", "x", "n1")  # unknown pod: bind reads it from the API
    assert c.summary()["gpu_allocated_milli"] == 750
    with pytest.raises(BindError, match="insufficient GPU share"):
        binder.bind("uid-b", "default", "b", "n1")


def test_bind_bodies_naming_unknown_nodes_are_refused_and_leave_no_lock_behind() -> None:
    # A bind body is untrusted: each node name it sends must not leave a per-node group.
    c = cache_with(gpu_node("n1", 1))
    pending(c, "a", annotations={ann.FRACTION: "0.5"})
    binder = KubeBinder(FakeApi(), c, 60)
    for i in range(500):
        binder.hold_on_receipt("uid-a", "default", "a", f"no-such-node-{i}")  # nothing held, nothing raised
        with pytest.raises(BindError, match="not in gpufrac's cache"):
            binder.bind("uid-a", "default", "a", f"no-such-node-{i}")
    assert set(binder._groups) == set() and c.summary()["gpu_allocated_milli"] == 0
    binder.bind("uid-a", "default", "a", "n1")
    assert set(binder._groups) == {"n1"} and c.summary()["gpu_allocated_milli"] == 500


def test_binding_failure_gives_the_share_back() -> None:
    c = cache_with(gpu_node("n1", 1))
    pending(c, "a", annotations={ann.FRACTION: "0.5"})
    api = FakeApi(fail=500)
    with pytest.raises(BindError, match="binding pod default/a to n1: 500"):
        KubeBinder(api, c, 60).bind("uid-a", "default", "a", "n1")
    assert c.summary()["gpu_allocated_milli"] == 0 and c.allocations() == []
    # The pod is pending again: a later bind may place it.
    KubeBinder(FakeApi(), c, 60).bind("uid-a", "default", "a", "n1")
    assert c.summary()["gpu_allocated_milli"] == 500


def test_the_binding_is_one_post_with_the_token_and_a_name_stays_one_path_segment() -> None:
    c = cache_with(gpu_node("n1", 1))
    pending(c, "a", annotations={ann.FRACTION: "0.5"})
    api = FakeApi()
    KubeBinder(api, c, 60).bind("uid-a", "default", "a", "n1")
    ((method, path, headers),) = api.api_client.requests
    assert (method, path) == ("POST", "/api/v1/namespaces/default/pods/a/binding")
    assert headers["authorization"] == "Bearer fake-token"
    assert headers["Content-Type"] == "application/json"
    # A name from a request body is quoted into one segment: it cannot reach another path.
    assert core_path("namespaces", "default", "pods", "../../nodes/x", "binding") == \
        "/api/v1/namespaces/default/pods/..%2F..%2Fnodes%2Fx/binding"


def test_no_answer_from_the_api_server_refuses_the_bind_and_gives_the_share_back() -> None:
    c = cache_with(gpu_node("n1", 1))
    pending(c, "a", annotations={ann.FRACTION: "0.5"})
    api = FakeApi()

    def reset(method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        raise urllib3.exceptions.ProtocolError("Connection aborted.")

    api.api_client = FakeApiClient(reset)
    with pytest.raises(BindError, match=r"binding pod default/a to n1: 0 no answer from the API server"):
        KubeBinder(api, c, 60).bind("uid-a", "default", "a", "n1")
    assert c.summary()["gpu_allocated_milli"] == 0


def test_retried_bind_that_already_went_through_is_a_success() -> None:
    c = cache_with(gpu_node("n1", 1))
    pending(c, "a", annotations={ann.FRACTION: "0.5"})
    first = FakeApi()
    KubeBinder(first, c, 60).bind("uid-a", "default", "a", "n1")
    # kube-scheduler timed out and retries: the API says the pod is already bound (409).
    KubeBinder(FakeApi(fail=409, bound_to="n1", annotations=first.bindings[0][1]), c, 60).bind(
        "uid-a", "default", "a", "n1")
    assert c.summary()["gpu_allocated_milli"] == 500
    with pytest.raises(BindError, match="409"):
        KubeBinder(FakeApi(fail=409, bound_to="n2"), c, 60).bind("uid-a", "default", "a", "n1")


def test_a_409_because_another_instance_bound_the_pod_there_counts_its_gpus() -> None:
    # Two schedulers bound one pod to the same node; the other instance's Binding (GPU 1)
    # landed first. Ours (GPU 0) gets 409: a success for kube-scheduler, and the cache
    # counts what the pod really holds, not what we chose.
    c = cache_with(gpu_node("n1", 2))
    pending(c, "a", annotations={ann.FRACTION: "0.5"})
    theirs = allocation_annotations(["GPU-n1-1"], 500, [8192], NOW)
    KubeBinder(FakeApi(fail=409, bound_to="n1", annotations=theirs), c, 60).bind("uid-a", "default", "a", "n1")
    (alloc,) = c.allocations()
    assert alloc["gpu_uuids"] == ["GPU-n1-1"]


def test_the_watch_corrects_an_assumed_allocation_when_the_pod_is_bound_on_other_gpus() -> None:
    c = cache_with(gpu_node("n1", 2))
    pending(c, "a", annotations={ann.FRACTION: "0.5"})
    assert c.assume("uid-a", "default", "a", "n1", ttl_s=60).gpu_uuids == ("GPU-n1-0",)
    theirs = allocation_annotations(["GPU-n1-1"], 500, [8192], NOW)
    c.apply_pod_event("MODIFIED", pod_intent(pod_json("a", node="n1", annotations={ann.FRACTION: "0.5", **theirs})))
    (alloc,) = c.allocations()
    assert alloc["gpu_uuids"] == ["GPU-n1-1"] and c.summary()["gpu_allocated_milli"] == 500


def test_freed_share_requeues_pending_pods_of_our_profile_only() -> None:

    c = cache_with(gpu_node("n1", 1))
    record = allocation_annotations(["GPU-n1-0"], 1000, [16384], NOW)
    bound = pod_json("holder", node="n1", phase="Running", annotations=record)
    mine = pod_json("waiting", annotations={ann.FRACTION: "0.5"})
    mine["spec"]["schedulerName"] = "gpufrac-scheduler"
    other = pod_json("other-scheduler", annotations={ann.FRACTION: "0.5"})
    for pod in (bound, mine, other):
        c.apply_pod_event("ADDED", pod_intent(pod))

    class PatchApi:
        def __init__(self) -> None:
            self.patched: list[tuple[str, dict[str, Any]]] = []

        def patch_namespaced_pod(self, name: str, namespace: str, body: Any, **kw: Any) -> FakeResponse:
            self.patched.append((name, body))
            return FakeResponse()

    api = PatchApi()
    sync = ClusterSync(api, c, SyncOptions(requeue_delay_s=0.01))
    worker = threading.Thread(target=sync._run_requeue)
    worker.start()
    sync._apply_pod("DELETED", bound)   # frees the whole GPU
    deadline = time.monotonic() + 5
    while not api.patched and time.monotonic() < deadline:
        time.sleep(0.01)
    sync.stop()
    worker.join(5)
    assert [name for name, _ in api.patched] == ["waiting"]
    body = api.patched[0][1]
    assert body["metadata"]["uid"] == "uid-waiting" and ann.REQUEUE in body["metadata"]["annotations"]


def test_an_expired_hold_requeues_the_waiting_pods() -> None:
    # A hold that expires (a replica died between its claim and its Binding, a Binding
    # lost) frees share like a deletion: the pods waiting for it are retried at once, not
    # after kube-scheduler's 5-minute flush (found by tests/e2e/test_faults_e2e.py).
    c = cache_with(gpu_node("n1", 1))
    pending(c, "held", annotations={ann.FRACTION: "1"})
    c.assume("uid-held", "default", "held", "n1", ttl_s=0.0)
    sync = ClusterSync(object(), c, SyncOptions())
    assert not sync._released.is_set()
    sync.housekeeping()
    assert sync._released.is_set() and c.summary()["gpu_allocated_milli"] == 0


def test_fgd_workload_knows_the_gpu_memory_a_pod_asks_for() -> None:
    # Waiting and placed, the pod's explicit gpufrac.io/memory is part of its task type; a pod
    # that asks for a share's proportion counts 0 (TaskTypes.gpu_memory_mib).
    c = cache_with(gpu_node("n1", 1, memory_mib=81920), prior=False)
    pending(c, "m", annotations={ann.FRACTION: "0.25", ann.MEMORY: "40Gi"})
    pending(c, "p", annotations={ann.FRACTION: "0.25"})
    tt = c.state_copy().workload.task_types()
    assert tt is not None and tt.gpu_memory_mib is not None
    assert sorted(tt.gpu_memory_mib.tolist()) == [0, 40 * 1024]
    c.assume("uid-m", "default", "m", "n1", ttl_s=60)
    tt = c.state_copy().workload.task_types()
    assert tt is not None and tt.gpu_memory_mib is not None and sorted(tt.gpu_memory_mib.tolist()) == [0, 40 * 1024]
    c.remove_pod("uid-m")
    tt = c.state_copy().workload.task_types()
    assert tt is not None and tt.gpu_memory_mib is None


def test_housekeeping_reserves_for_a_starved_pod_and_requeues_when_the_hold_ends() -> None:
    # Starvation protection runs in housekeeping, on gpufrac's monotonic clock: a 2-GPU pod
    # waiting behind a half GPU on each node gets a node held once it has waited 0.05 s; when
    # the hold expires (0.2 s), the waiting pods are retried (the node is open again).
    from extender.cache.reservations import StarvationPolicy
    from extender.tenants import NO_TENANTS

    c = cache_with(gpu_node("n1", 2), gpu_node("n2", 2))
    c.set_policy(build_scorer(scoring_config("default")), NO_TENANTS,
                 starvation=StarvationPolicy(reserve_after_s=0.05, reservation_ttl_s=0.2))
    for i, node in enumerate(("n1", "n2")):
        pending(c, f"half-{i}", annotations={ann.FRACTION: "0.5"})
        c.assume(f"uid-half-{i}", "default", f"half-{i}", node, ttl_s=None)
    pending(c, "big", gpus=2)
    sync = ClusterSync(object(), c, SyncOptions())
    sync.housekeeping()  # first seen pending
    assert c.reservations() == []
    time.sleep(0.06)
    sync.housekeeping()
    assert [r.pod for r in c.reservations()] == ["default/big"] and not sync._released.is_set()
    time.sleep(0.21)
    sync.housekeeping()  # expired (and at once held again: the pod still waits)
    assert sync._released.is_set()
