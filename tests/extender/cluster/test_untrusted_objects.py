"""Issue 38: objects other than pods are untrusted too (nodes, inventories, request bodies).

Each test is one row of the issue's table, run against ``ClusterSync`` with a fake API that
lists fixed items (the watch is driven by calling its event handler), or against the app.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from extender.admin_config import scoring_config
from extender.cache import BindError, GpuCache
from extender.cluster import ClusterSync, SyncOptions
from extender.quarantine import Quarantine
from podspec import annotations as ann
from podspec.nodes import MAX_CLOCK_SKEW_S
from podspec.pods import pod_intent
from scoring.scorer import build_scorer
from tests.conftest import gpu_node, pod_json
from tests.extender.helpers import ListApi, client_for

NOW = datetime(2026, 11, 26, 12, 0, 0, tzinfo=UTC)


def node(name: str, uuids: list[str], created: str | None = "2026-01-01T00:00:00Z",
         heartbeat: datetime = NOW, memory_used_mib: int = 0) -> dict[str, Any]:
    """A Node with one 24 GiB GPU per UUID."""
    inv = ann.NodeInventory(node=name, heartbeat=heartbeat, gpus=[
        ann.GpuInventory(index=i, uuid=u, model="A10", memory_mib=24576, replicas=4,
                         memory_used_mib=memory_used_mib)
        for i, u in enumerate(uuids)])
    meta: dict[str, Any] = {"name": name, "annotations": {ann.INVENTORY: ann.dump_inventory(inv)}}
    if created is not None:
        meta["creationTimestamp"] = created
    return {"metadata": meta, "status": {"allocatable": {"cpu": "16", "memory": "64Gi"}}}


def synced(api: ListApi, now: datetime = NOW) -> tuple[ClusterSync, GpuCache]:
    """A sync that listed ``api``'s nodes and pods (its watches end at once)."""
    cache = GpuCache(build_scorer(scoring_config("default")))
    sync = ClusterSync(api, cache, SyncOptions(), now=lambda: now, quarantine=Quarantine())
    with pytest.raises(ConnectionError):
        sync._list_and_watch_nodes()
    with pytest.raises(ConnectionError):
        sync._list_and_watch_pods()
    return sync, cache


def usable(cache: GpuCache) -> dict[str, list[str]]:
    """Node -> the UUIDs the core may place on (ready node, healthy GPU)."""
    s = cache.state_copy()
    return {n: [u for c, u in enumerate(s.gpu_uuid[i]) if s.gpu_healthy[i, c] and s.node_ready[i]]
            for n, i in s.node_index.items()}


def quarantined(sync: ClusterSync) -> dict[tuple[str, str], str]:
    return {(r.kind, r.key): r.message for r in sync.quarantine.entries()}


# -- row 1: one GPU UUID on two nodes ---------------------------------------------------------

def test_a_uuid_on_two_nodes_stays_with_the_older_node_and_every_node_is_still_learned() -> None:
    # "clone" was made from "orig"'s VM image: it lists orig's GPU-a besides its own GPU-c.
    # Was: the node sync raised "duplicate UUID" and retried forever; no node was learned.
    api = ListApi([node("clone", ["GPU-a", "GPU-c"], created="2026-06-01T00:00:00Z"),
                   node("orig", ["GPU-a", "GPU-b"], created="2026-01-01T00:00:00Z"),
                   node("other", ["GPU-d"])])
    sync, cache = synced(api)
    assert sync.nodes_synced.is_set() and sync.pods_synced.is_set()
    # The older Node keeps GPU-a; the clone keeps only its own GPU.
    assert usable(cache) == {"clone": ["GPU-c"], "orig": ["GPU-a", "GPU-b"], "other": ["GPU-d"]}
    entries = quarantined(sync)
    assert list(entries) == [("gpu", "clone/GPU-a")]
    assert 'also listed by node "orig", which keeps it' in entries[("gpu", "clone/GPU-a")]

    # The watch: a third node lists GPU-d too, without a creation time (it loses).
    sync._apply_node("ADDED", node("third", ["GPU-d"], created=None))
    assert usable(cache)["third"] == [] and usable(cache)["other"] == ["GPU-d"]
    # The original node is deleted: the clone's GPU-a is usable there now, the entry gone.
    sync._apply_node("DELETED", node("orig", []))
    assert usable(cache)["clone"] == ["GPU-a", "GPU-c"]
    assert ("gpu", "clone/GPU-a") not in quarantined(sync)
    # An older node arriving later takes the UUID over in one batch (never on two nodes).
    sync._apply_node("ADDED", node("older", ["GPU-c"], created="2025-01-01T00:00:00Z"))
    assert usable(cache)["clone"] == ["GPU-a"] and usable(cache)["older"] == ["GPU-c"]
    assert ("gpu", "clone/GPU-c") in quarantined(sync)


def test_a_restarted_sync_with_conflicting_nodes_becomes_ready() -> None:
    # Was: after a restart gpufrac never became ready (503 with 0 nodes for over 60 s).
    nodes = [node(f"n{i}", [f"GPU-{i}", "GPU-shared"], created=f"2026-01-{i + 1:02d}T00:00:00Z")
             for i in range(5)]
    sync, cache = synced(ListApi(nodes))
    assert sync.synced is False  # namespaces are not listed by this fake
    assert sync.nodes_synced.is_set() and cache.summary()["nodes"] == 5
    assert usable(cache)["n0"] == ["GPU-0", "GPU-shared"]
    assert [usable(cache)[f"n{i}"] for i in range(1, 5)] == [[f"GPU-{i}"] for i in range(1, 5)]
    assert len([k for k in quarantined(sync) if k[0] == "gpu"]) == 4


# -- row 5: heartbeats and clocks that disagree -------------------------------------------------

def test_an_implausible_heartbeat_is_invalid_and_no_age_is_negative() -> None:
    far = datetime.fromisoformat("9999-12-31T23:59:59-14:00")
    near = NOW + timedelta(seconds=MAX_CLOCK_SKEW_S / 2)  # clocks that merely disagree
    sync, cache = synced(ListApi([node("far", ["GPU-f"], heartbeat=far),
                                  node("near", ["GPU-n"], heartbeat=near)]))
    # Was: accepted, the node never went stale, and its age read -2.5e11 s.
    assert usable(cache) == {"far": [], "near": ["GPU-n"]}
    assert "is not a plausible time" in quarantined(sync)[("node", "far")]
    assert sync.inventory_ages() == {"far": None, "near": pytest.approx(0.0, abs=5.0)}  # just seen
    assert sync.clock_skews() == {"near": MAX_CLOCK_SKEW_S / 2}


class Clocks:
    """A replica's wall clock ``offset_s`` from the agents', and its monotonic clock."""

    def __init__(self, offset_s: float) -> None:
        self.agents = NOW
        self.offset_s = offset_s
        self.mono = 1000.0

    def wall(self) -> datetime:
        return self.agents + timedelta(seconds=self.offset_s)

    def advance(self, seconds: float) -> None:
        self.agents += timedelta(seconds=seconds)
        self.mono += seconds


@pytest.mark.parametrize("offset_s", [-600.0, 0.0, 600.0])
def test_freshness_is_judged_by_when_the_heartbeat_changes_not_by_either_clock(offset_s: float) -> None:
    # A replica ten minutes ahead of the agents (or behind) read every inventory as 600 s old
    # and refused every node ("inventory stale"). Now the age is the time since this replica
    # saw the heartbeat change, on its own monotonic clock; the offset only shows as skew.
    clocks = Clocks(offset_s)
    api = ListApi([node("a", ["GPU-a"], heartbeat=clocks.agents), node("b", ["GPU-b"], heartbeat=clocks.agents)])
    cache = GpuCache(build_scorer(scoring_config("default")))
    sync = ClusterSync(api, cache, SyncOptions(inventory_stale_after_s=180), now=clocks.wall,
                       quarantine=Quarantine(), monotonic=lambda: clocks.mono)
    with pytest.raises(ConnectionError):
        sync._list_and_watch_nodes()
    assert usable(cache) == {"a": ["GPU-a"], "b": ["GPU-b"]}
    assert sync.clock_skews() == {"a": -offset_s, "b": -offset_s}
    # 170 s on: a's agent beat again, b's did not.
    clocks.advance(170)
    sync._nodes.apply("MODIFIED", node("a", ["GPU-a"], heartbeat=clocks.agents))
    assert sync.inventory_ages() == {"a": 0.0, "b": 170.0}
    # 20 s more: b has not changed for 190 s > 180: stale, whatever the clocks say.
    clocks.advance(20)
    cache.upsert_nodes(sync._nodes.specs())
    assert usable(cache) == {"a": ["GPU-a"], "b": []}
    # b beats again (a heartbeat value its agent has not written before): fresh at once.
    sync._nodes.apply("MODIFIED", node("b", ["GPU-b"], heartbeat=clocks.agents))
    cache.upsert_nodes(sync._nodes.specs())
    assert usable(cache) == {"a": ["GPU-a"], "b": ["GPU-b"]}


# -- row 6: nodes and pods deleted while no watch ran --------------------------------------------

def test_a_relist_forgets_quarantined_objects_that_are_gone() -> None:
    bad_node = {"metadata": {"name": "bad", "annotations": {ann.INVENTORY: "{not json"}},
                "status": {"allocatable": {"cpu": "1", "memory": "1Gi"}}}
    bad_pod = pod_json("poison", annotations={ann.FRACTION: "7"})
    api = ListApi([node("good", ["GPU-g"]), bad_node], [bad_pod])
    sync, _ = synced(api)
    assert {("node", "bad"), ("pod", "default/poison")} <= set(quarantined(sync))
    # Both deleted while the watches were down (no DELETED event ever seen): the relist
    # drops their entries. Was: still listed at /quarantine after a successful relist.
    api.nodes, api.pods = [node("good", ["GPU-g"])], []
    with pytest.raises(ConnectionError):
        sync._list_and_watch_nodes()
    with pytest.raises(ConnectionError):
        sync._list_and_watch_pods()
    assert quarantined(sync) == {}


# -- row 7: impossible NVML readings ---------------------------------------------------------

def test_memory_used_above_total_flags_the_gpu_and_nothing_is_placed_there() -> None:
    # 16 TiB used on a 24 GiB GPU. Was: accepted; the node still took pods asking no memory.
    sync, cache = synced(ListApi([node("n", ["GPU-x"], memory_used_mib=2**24)]))
    assert usable(cache) == {"n": []}
    assert "memory_used_mib: 16777216 MiB is above memory_mib 24576 MiB" in quarantined(sync)[("gpu", "n/GPU-x")]
    cache.apply_pod_event("ADDED", pod_intent(pod_json("p", annotations={ann.FRACTION: "0.25"})))
    with pytest.raises(BindError):
        cache.bind("uid-p", "default", "p", "n")
    # A sane reading again: the GPU is usable and the entry leaves.
    sync._apply_node("MODIFIED", node("n", ["GPU-x"], memory_used_mib=1024))
    assert usable(cache) == {"n": ["GPU-x"]} and quarantined(sync) == {}
    cache.bind("uid-p", "default", "p", "n")


# -- row 8: a number no JSON encoder of 64-bit integers writes ----------------------------------

def test_filter_echoes_a_node_item_with_a_huge_integer() -> None:
    # Was: HTTP 500, orjson cannot write 2**70 back (the other verbs answered).
    with client_for([gpu_node("n1", 1)]) as (client, _):
        item = {"metadata": {"name": "n1", "labels": {}}, "spec": {"weird": 2**70}}
        body = {"Pod": pod_json("p", annotations={ann.FRACTION: "0.5"}), "Nodes": {"items": [item]},
                "NodeNames": None}
        r = client.post("/filter", content=json.dumps(body), headers={"Content-Type": "application/json"})
        assert r.status_code == 200, r.text
        assert json.loads(r.text)["Nodes"]["items"][0]["spec"]["weird"] == 2**70


# -- row 2 (the verb's side): a bind that fails inside is answered and counted -----------------

def test_an_internal_error_in_bind_is_an_error_reply_counted_as_error() -> None:
    from extender.verbs.bind import ExtenderBindingArgs, bind

    def overflowing(uid: str, namespace: str, name: str, node: str) -> None:
        raise OverflowError("Python int too large to convert to C long")

    args = ExtenderBindingArgs(PodName="p", PodNamespace="default", PodUID="uid-p", Node="n1")
    reply = bind(overflowing, args)
    # Was: HTTP 500, and gpufrac_bind_total{result="error"} did not move.
    assert reply.status == 200 and reply.result == "error"
    assert reply.body == {"Error": "gpufrac: internal error binding pod default/p: OverflowError; see gpufrac's log"}


def test_the_older_node_is_judged_by_instant_not_by_how_its_timestamp_is_written() -> None:
    # 05:00+05:00 is 00:00Z, older than 01:00Z although its text sorts after it.
    api = ListApi([node("late", ["GPU-s"], created="2026-01-01T01:00:00Z"),
                   node("early", ["GPU-s"], created="2026-01-01T05:00:00+05:00")])
    _, cache = synced(api)
    assert usable(cache) == {"early": ["GPU-s"], "late": []}
