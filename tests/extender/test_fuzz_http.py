"""HTTP fuzzing of every endpoint (hypothesis on the wire models): no 5xx, and no state change
from a rejected request or from the side-effect-free verbs; the allocations stay feasible."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import gpu_node, pod_json
from tests.extender.helpers import client_for, infeasible

NODES = [gpu_node("a", 2, replicas=4), gpu_node("b", 1, model="A10", memory_mib=24576, replicas=4)]
NAMES = ["a", "b", "missing"]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)
annotation_values = st.one_of(st.sampled_from(["0.25", "0.5", "1", "0", "1.5", "abc", "", "8Gi", "-1Gi",
                                               "T4", "A10|T4", "|", "guaranteed", "best-effort",
                                               "platinum", "1e400", "NaN", "0.0001"]),
                              st.text(max_size=12))
gpufrac_annotations = st.dictionaries(
    st.sampled_from(["gpufrac.io/fraction", "gpufrac.io/memory", "gpufrac.io/gpu-model", "gpufrac.io/qos",
                     "gpufrac.io/assigned-gpus", "gpufrac.io/assigned-fraction", "other"]),
    annotation_values, max_size=4)


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    """A Pod that is often valid and often wrong in one field."""
    pod = pod_json(draw(st.sampled_from(["p1", "p2", "p3"])),
                   gpus=draw(st.one_of(st.none(), st.integers(0, 3))),
                   annotations=draw(gpufrac_annotations),
                   cpu=draw(st.sampled_from(["1", "100m", "bogus", "64"])),
                   node=draw(st.one_of(st.none(), st.sampled_from(NAMES))),
                   phase=draw(st.sampled_from(["Pending", "Running", "Succeeded"])))
    if draw(st.booleans()):
        pod["spec"]["priority"] = draw(st.one_of(st.integers(-5, 5), st.text(max_size=3)))
    if draw(st.integers(0, 9)) == 0:  # now and then, any JSON in any place
        where = draw(st.sampled_from(["metadata", "spec", "status"]))
        pod[where] = draw(json_values)
    return pod


def bodies(verb: str) -> st.SearchStrategy[Any]:
    names = st.lists(st.sampled_from(NAMES), max_size=3)
    if verb in ("filter", "prioritize"):
        good: st.SearchStrategy[Any] = st.fixed_dictionaries({"Pod": pods(), "NodeNames": names})
    elif verb == "bind":
        good = st.fixed_dictionaries({"PodName": st.sampled_from(["p1", "p2", "x", ""]),
                                      "PodNamespace": st.sampled_from(["default", ""]),
                                      "PodUID": st.sampled_from(["uid-p1", "uid-p2", "nope"]),
                                      "Node": st.sampled_from(NAMES)})
    elif verb == "preempt":
        victims = st.dictionaries(st.sampled_from(NAMES), st.fixed_dictionaries(
            {"Pods": st.lists(st.fixed_dictionaries({"UID": st.sampled_from(["uid-p1", "x"])}), max_size=2),
             "NumPDBViolations": st.integers(0, 3)}), max_size=3)
        good = st.fixed_dictionaries({"Pod": pods(), "NodeNameToMetaVictims": victims})
    else:
        good = st.lists(st.fixed_dictionaries({"type": st.sampled_from(["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]),
                                               "object": pods()}), max_size=3)
    return st.one_of(good, json_values)


def fuzz(verb: str, mutating: bool) -> None:
    with client_for(NODES) as (client, cache):
        client.post("/standalone/pod-events", json=[{"type": "ADDED", "object": pod_json("p1")}])

        @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(body=bodies(verb))
        def run(body: Any) -> None:
            before = (cache.summary(), cache.allocations())
            r = client.post(f"/{verb}", json=body)
            assert r.status_code < 500, (r.status_code, r.text)
            reply = r.json()
            rejected = r.status_code >= 400 or (isinstance(reply, dict) and reply.get("Error"))
            if rejected or not mutating:
                assert (cache.summary(), cache.allocations()) == before, (body, reply)
            assert infeasible(cache.allocations(), NODES) == []

        run()


def test_filter_never_5xx_and_never_changes_state() -> None:
    fuzz("filter", mutating=False)


def test_prioritize_never_5xx_and_never_changes_state() -> None:
    fuzz("prioritize", mutating=False)


def test_preempt_never_5xx_and_never_changes_state() -> None:
    fuzz("preempt", mutating=False)


def test_bind_never_5xx_and_a_refused_bind_changes_nothing() -> None:
    fuzz("bind", mutating=True)


def test_pod_events_never_5xx_and_a_rejected_batch_changes_nothing() -> None:
    fuzz("standalone/pod-events", mutating=True)


def test_malformed_json_bytes_get_400_on_every_verb() -> None:
    with client_for(NODES) as (client, _):
        for verb in ("filter", "prioritize", "bind", "preempt", "standalone/pod-events"):
            for raw in (b"", b"{", b"\xff\xfe", b"[1, 2", b'{"Pod": 1e999999}'):
                r = client.post(f"/{verb}", content=raw, headers={"content-type": "application/json"})
                assert 400 <= r.status_code < 500, (verb, raw, r.status_code)
