"""Every request a real kube-scheduler sent (tests/data/kube-scheduler-wire) gets a reply of
the shape kube-scheduler decodes, both as captured (a pod gpufrac does not manage) and
rewritten to ask for gpufrac.io/gpu."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest

from tests.conftest import gpu_node
from tests.extender.helpers import client_for

WIRE = Path(__file__).resolve().parents[1] / "data" / "kube-scheduler-wire"
CAPTURES = sorted(WIRE.glob("nodecache-*/*.request.json"))
VERBS = {"filter", "prioritize", "bind", "preempt"}
FAKE_NODES = [gpu_node(f"fake-node-{i:03d}", 4) for i in range(3)]


def verb_of(path: Path) -> str:
    return str(json.loads(path.read_text())["path"]).rsplit("/", 1)[-1]


def as_gpufrac(body: dict[str, Any]) -> dict[str, Any]:
    """The captured body with its placeholder resource renamed to gpufrac.io/gpu."""
    text = json.dumps(body).replace("example.com/gpu-share", "gpufrac.io/gpu")
    return cast(dict[str, Any], json.loads(text))


def test_captures_cover_every_verb() -> None:
    assert {verb_of(p) for p in CAPTURES} == VERBS
    assert len(CAPTURES) >= 20


@pytest.mark.parametrize("path", [p for p in CAPTURES if verb_of(p) in VERBS],
                         ids=lambda p: f"{p.parent.name}/{p.name}")
@pytest.mark.parametrize("rewrite", [False, True], ids=["as-captured", "gpufrac-pod"])
@pytest.mark.parametrize("decision", ["filter", "prioritize"])
def test_captured_request_gets_well_formed_reply(path: Path, rewrite: bool, decision: str) -> None:
    capture = json.loads(path.read_text())
    body = as_gpufrac(capture["body"]) if rewrite else capture["body"]
    verb = verb_of(path)
    with client_for(FAKE_NODES, decision=decision) as (client, cache):
        if verb == "bind":
            pod = {"metadata": {"name": body["PodName"], "namespace": body["PodNamespace"],
                                "uid": body["PodUID"]},
                   "spec": {"containers": [{"name": "c", "resources": {"limits": {"gpufrac.io/gpu": "1"}}}]}}
            client.post("/standalone/pod-events", json=[{"type": "ADDED", "object": pod}])
        r = client.post(f"/{verb}", json=body)
        assert r.status_code == 200, r.text
        reply = r.json()
        if verb == "filter":
            assert set(reply) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
            assert reply["Error"] == ""
            sent = body["NodeNames"] or [n["metadata"]["name"] for n in body["Nodes"]["items"]]
            got = reply["NodeNames"] if body["NodeNames"] is not None else [
                n["metadata"]["name"] for n in reply["Nodes"]["items"]]
            failed = set(reply["FailedNodes"]) | set(reply["FailedAndUnresolvableNodes"])
            assert not set(got) & failed and set(got) | failed <= set(sent)
            if decision == "prioritize":  # every node is passed or failed
                assert set(got) | failed == set(sent)
            else:  # only the chosen node passes; the other feasible ones are left out
                assert len(got) == (1 if len(failed) < len(set(sent)) else 0)
            if body["NodeNames"] is None:
                assert reply["NodeNames"] is None
                # passing Node objects are echoed whole, as kube-scheduler expects
                assert all("status" in n for n in reply["Nodes"]["items"])
        elif verb == "prioritize":
            sent = body["NodeNames"] or [n["metadata"]["name"] for n in body["Nodes"]["items"]]
            assert [h["Host"] for h in reply] == sent
            assert all(set(h) == {"Host", "Score"} and 0 <= h["Score"] <= 10 for h in reply)
            assert sum(h["Score"] == 10 for h in reply) == 1
        elif verb == "preempt":
            # the captured victims are not pods gpufrac holds: no node where preemption works,
            # and never a node with an empty victim list (kube-scheduler rejects that)
            assert reply == {"NodeNameToMetaVictims": {}}
        else:
            assert reply == {"Error": ""}
            assert cache.summary()["pods_bound"] == 1
