"""Issue 38: a property test per watch besides pods (nodes, claim ledgers).

Random hostile objects (wrong JSON types, extreme numbers, impossible NVML readings, GPU
UUIDs copied from valid nodes, heartbeats far ahead, oversized and malformed ledgers) are
mixed among valid ones, in a list and as watch events. Properties: nothing escapes the
event handler (the watch would stop), every valid object applies exactly as it would
alone, and afterwards a normal pod still binds. The pod watch has its own suite
(``test_fuzz_hostile``).
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender.admin_config import scoring_config
from extender.cache import GpuCache
from extender.cluster import ClusterSync, KubeBinder, SyncOptions
from extender.fence import ClaimFence, ledger_name
from podspec import annotations as ann
from podspec.pods import pod_intent
from scoring.scorer import build_scorer
from tests.conftest import gpu_node, pod_json
from tests.extender.cluster.test_untrusted_objects import NOW, node, usable
from tests.extender.helpers import ListApi
from tests.extender.test_fence import CasApi, claim, ledger_obj

EXAMPLES = int(os.environ.get("GPUFRAC_FUZZ_EXAMPLES", "60"))
"""Examples per property (CI: 60)."""

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**80), 2**80),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=10))
any_json = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)), max_leaves=8)
# What the API server can serve (its JSON has no NaN or Infinity): for whole objects.
wire_json = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**80), 2**80),
              st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=10)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8)
extreme_ints = st.one_of(st.integers(-(2**70), 2**70), st.sampled_from([0, -1, 2**24, 2**24 + 1, 2**63, 2**64]))


@st.composite
def hostile_node(draw: st.DrawFn, i: int, valid_uuids: list[str]) -> dict[str, Any]:
    """A Node wrong in one way; a copied UUID comes from a newer node (a clone)."""
    name = f"h{i}"
    obj = node(name, [f"GPU-{name}"], created="2026-09-01T00:00:00Z")
    inv = json.loads(obj["metadata"]["annotations"][ann.INVENTORY])
    mode = draw(st.integers(0, 7))
    if mode == 0:
        obj["metadata"]["annotations"][ann.INVENTORY] = draw(st.one_of(st.text(max_size=30), wire_json))
    elif mode == 1:  # an extreme or wrong value in one GPU field
        field = draw(st.sampled_from(["memory_mib", "memory_used_mib", "replicas", "index", "uuid", "model"]))
        inv["gpus"][0][field] = draw(st.one_of(extreme_ints, any_json))
    elif mode == 2 and valid_uuids:  # a clone: lists a valid node's GPU
        inv["gpus"].append({**inv["gpus"][0], "index": 1, "uuid": draw(st.sampled_from(valid_uuids))})
    elif mode == 3:  # far ahead, or not a time
        inv["heartbeat"] = draw(st.sampled_from(["9999-12-31T23:59:59-14:00", "2100-01-01T00:00:00Z", "never", 7]))
    elif mode == 4:  # impossible NVML readings
        inv["gpus"][0]["memory_used_mib"] = draw(st.integers(24577, 2**24))
    elif mode == 5:  # wrong shapes around the inventory
        obj[draw(st.sampled_from(["metadata", "status"]))] = draw(wire_json)
    elif mode == 6:
        obj["status"]["allocatable"] = draw(st.dictionaries(st.sampled_from(["cpu", "memory"]), wire_json))
    else:
        inv["gpus"] = inv["gpus"] * draw(st.integers(2, 80))  # duplicates, or over 64
    if mode in (1, 2, 3, 4, 7):
        obj["metadata"]["annotations"][ann.INVENTORY] = json.dumps(inv)
    return obj


@st.composite
def node_lists(draw: st.DrawFn) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """Valid nodes (older, own UUIDs) and hostile ones, shuffled; the valid ones' UUIDs."""
    n_valid = draw(st.integers(1, 4))
    valid = {f"v{i}": [f"GPU-v{i}-{j}" for j in range(draw(st.integers(1, 3)))] for i in range(n_valid)}
    uuids = [u for us in valid.values() for u in us]
    objs = [node(name, us) for name, us in valid.items()]
    objs += [draw(hostile_node(i, uuids)) for i in range(draw(st.integers(1, 5)))]
    return draw(st.permutations(objs)), valid


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(node_lists(), st.booleans())
def test_hostile_nodes_never_stop_the_node_watch_and_valid_ones_apply(
        case: tuple[list[dict[str, Any]], dict[str, list[str]]], as_events: bool) -> None:
    objs, valid = case
    cache = GpuCache(build_scorer(scoring_config("default")))
    api = ListApi([] if as_events else objs)
    sync = ClusterSync(api, cache, SyncOptions(), now=lambda: NOW)
    with pytest.raises(ConnectionError):  # the list applied; the watch is not served
        sync._list_and_watch_nodes()
    if as_events:
        for obj in objs:
            sync._apply_node("ADDED", obj)  # raises nothing, whatever the object
    got = usable(cache)
    for name, uuids in valid.items():
        assert got[name] == uuids  # every valid node applies, with all its GPUs
    listed = [u for us in got.values() for u in us]
    assert len(listed) == len(set(listed))  # no UUID usable twice
    # Every hostile node was judged by a check, none by the catch-all (a bug).
    assert not [r for r in sync.quarantine.entries() if r.message.startswith("internal:")]
    # A normal pod still binds on a valid node.
    cache.apply_pod_event("ADDED", pod_intent(pod_json("p", annotations={ann.FRACTION: "0.5"})))
    cache.bind("uid-p", "default", "p", "v0")


@st.composite
def hostile_claim(draw: st.DrawFn) -> Any:
    good = claim(f"x{draw(st.integers(0, 9))}", owner="z").to_json()
    mode = draw(st.integers(0, 3))
    if mode == 0:
        return draw(any_json)
    if mode == 1:
        field = draw(st.sampled_from(sorted(good)))
        return {**good, field: draw(st.one_of(extreme_ints, any_json))}
    if mode == 2:
        return {**good, "at": draw(st.one_of(st.floats(allow_nan=True, allow_infinity=True), extreme_ints))}
    return {k: v for k, v in good.items() if draw(st.booleans())}


@st.composite
def ledgers(draw: st.DrawFn) -> tuple[Any, list[str]]:
    """A ledger ConfigMap (or garbage in its place) and the uids of its valid claims."""
    if draw(st.integers(0, 5)) == 0:
        return draw(st.one_of(any_json, st.fixed_dictionaries({"metadata": any_json, "data": any_json}))), []
    valid = [claim(f"ok-{i}", owner="z").to_json() for i in range(draw(st.integers(0, 3)))]
    items = draw(st.permutations(valid + draw(st.lists(hostile_claim(), max_size=4))))
    obj = ledger_obj(list(items))
    if draw(st.integers(0, 9)) == 0:
        obj["data"]["claims.json"] = "[" + ",".join(["{}"] * 100_000) + "]"  # over 256 KiB
        valid = []
    return obj, [c["uid"] for c in items if c in valid]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ledgers(), min_size=1, max_size=4))
def test_hostile_ledgers_never_stop_the_claims_watch_and_valid_claims_count(cases: list[tuple[Any, list[str]]]) -> None:
    api = CasApi()
    cache = GpuCache(build_scorer(scoring_config("default")))
    cache.set_nodes([gpu_node("n1", 2)])
    cache.apply_pod_event("ADDED", pod_intent(pod_json("b", annotations={ann.FRACTION: "0.5"})))
    fence = ClaimFence(api, "gpufrac", "b", ttl_s=60, clock=lambda: 1000.0)
    binder = KubeBinder(api, cache, 60, fence=fence)
    sync = ClusterSync(api, cache, SyncOptions(), binder=binder)
    for obj, uids in cases:
        if isinstance(obj, dict) and isinstance(obj.get("metadata"), dict) and \
                obj["metadata"].get("name") == ledger_name("n1"):
            obj = api._bump(obj)  # the API holds what the watch shows
        sync._apply_ledger("MODIFIED", obj)  # raises nothing, whatever the object
        if uids:  # every valid claim is read (a hostile one may happen to be valid too)
            read = [c.uid for c in fence.view("n1").claims]
            assert [u for u in read if u in uids] == uids
    assert not [r for r in sync.quarantine.entries() if r.message.startswith("internal:")]
    # Afterwards a normal pod binds: every claim names a pod that does not exist (read
    # from the API: 404), so none of them holds anything.
    api.pods["b"] = pod_json("b", annotations={ann.FRACTION: "0.5"})
    binder.bind("uid-b", "default", "b", "n1")
    assert api.bindings == [("b", "n1")]
    assert [c.uid for c in fence.view("n1").claims][-1] == "uid-b"


def test_the_hostile_strategies_produce_what_they_say() -> None:
    """The generators are not vacuous: hostile nodes are quarantined, valid ones are not."""
    objs = [node("v0", ["GPU-v0-0"]), node("h0", ["GPU-v0-0"], created="2026-09-01T00:00:00Z"),
            node("h1", ["GPU-h1"], heartbeat=datetime(9999, 12, 31, tzinfo=UTC)),
            node("s1", ["GPU-s1"], heartbeat=NOW + timedelta(days=400))]
    sync = ClusterSync(ListApi(objs), GpuCache(build_scorer(scoring_config("default"))), SyncOptions(),
                       now=lambda: NOW)
    with pytest.raises(ConnectionError):
        sync._list_and_watch_nodes()
    assert {(r.kind, r.key) for r in sync.quarantine.entries()} == {("gpu", "h0/GPU-v0-0"), ("node", "h1")}
    # A heartbeat 400 days ahead is a clock that disagrees, not an invalid object: usable,
    # its skew visible (freshness is judged by when it changes).
    assert sync.clock_skews()["s1"] == 400 * 86400.0
