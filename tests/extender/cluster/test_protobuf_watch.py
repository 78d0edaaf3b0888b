"""The pod watch in protobuf (``extender.cluster.protobuf_watch``): a Pod reads the same as in
JSON, and the stream's frames, errors and ends are handled as the JSON watch handles them.

Pods are turned into protobuf here with ``google.protobuf.json_format`` (quantities and times
wrapped as their messages); ``tests/e2e/test_protobuf_watch.py`` checks the same equality on
the API server's own encoding.
"""

from __future__ import annotations

import copy
import io
import struct
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from google.protobuf import json_format
from kubernetes.client.rest import ApiException

from extender.cache import GpuCache
from extender.cluster.objects import Gone, SyncOptions
from extender.cluster.protobuf_watch import MAGIC, MAX_EVENT_BYTES, KubeProtos, PodWatch, frames, pod_fields
from extender.cluster.sync import ClusterSync
from podspec import annotations as ann
from podspec.pods import pod_intent
from podspec.quantities import PodSpecError
from scoring.presets import PRESETS
from scoring.scorer import build_scorer
from tests.conftest import pod_json
from tests.extender.helpers import ListApi
from tests.pod_variants import variants

PROTOS = KubeProtos()


def to_proto(pod: dict[str, Any]) -> Any:
    """A JSON Pod as the API server's protobuf Pod (quantities and times as their messages)."""
    pod = copy.deepcopy(pod)
    for key in ("containers", "initContainers"):
        for c in pod["spec"].get(key, []):
            res = c.get("resources", {})
            for part in ("limits", "requests"):
                res[part] = {k: {"string": v} for k, v in res.get(part, {}).items()}
    meta = pod["metadata"]
    if "creationTimestamp" in meta:
        when = datetime.strptime(meta["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        meta["creationTimestamp"] = {"seconds": int(when.timestamp())}
    return json_format.ParseDict(pod, PROTOS.pod())


@pytest.mark.parametrize("pod", variants(), ids=lambda p: p["metadata"]["name"])
def test_a_pod_reads_the_same_from_protobuf_as_from_json(pod: dict[str, Any]) -> None:
    fields = pod_fields(to_proto(pod))
    assert pod_intent(fields) == pod_intent(pod)
    assert fields["metadata"]["name"] == pod["metadata"]["name"]


@pytest.mark.parametrize(("edit", "rule"), [
    (lambda p: p["spec"]["containers"][0]["resources"]["requests"].update(cpu="lots"), "cpu"),
    (lambda p: p["spec"]["containers"][0]["resources"].update(limits={"gpufrac.io/gpu": "1.5"}), "whole number"),
    (lambda p: p["metadata"]["annotations"].update({ann.FRACTION: "2"}), ann.FRACTION),
])
def test_a_bad_pod_fails_with_the_same_message_from_protobuf(edit: Callable[[dict[str, Any]], None],
                                                            rule: str) -> None:
    pod = pod_json("bad")
    edit(pod)
    with pytest.raises(PodSpecError) as from_json:
        pod_intent(pod)
    with pytest.raises(PodSpecError) as from_proto:
        pod_intent(pod_fields(to_proto(pod)))
    assert str(from_proto.value) == str(from_json.value) and rule in str(from_json.value)


def test_fields_the_pod_does_not_set_are_left_out_as_in_json() -> None:
    """An empty resourceVersion would resume the watch from "now"; a missing one keeps the
    last revision (``ClusterSync._stream``), as a JSON event without it does."""
    fields = pod_fields(PROTOS.pod())
    assert fields == {"metadata": {"annotations": {}}, "spec": {"containers": []}, "status": {}}
    with pytest.raises(PodSpecError) as from_proto:
        pod_intent(fields)
    with pytest.raises(PodSpecError) as from_json:
        pod_intent({"metadata": {}, "spec": {}, "status": {}})
    assert str(from_proto.value) == str(from_json.value)


def test_a_time_rfc3339_cannot_write_is_left_unordered() -> None:
    pod = to_proto(pod_json("far"))
    pod.metadata.creationTimestamp.seconds = 2**62
    assert pod_fields(pod)["metadata"]["creationTimestamp"] == ""
    assert pod_intent(pod_fields(pod)).created_at == ""


# -- the stream ------------------------------------------------------------------------------


def event(kind: str, obj: Any, type_kind: str = "Pod") -> bytes:
    """One watch frame as the API server writes it: length, then the WatchEvent."""
    unknown = PROTOS.unknown(raw=obj.SerializeToString())
    unknown.typeMeta.apiVersion, unknown.typeMeta.kind = "v1", type_kind
    ev = PROTOS.watch_event(type=kind)
    ev.object.raw = MAGIC + unknown.SerializeToString()
    data: bytes = ev.SerializeToString()
    return struct.pack(">I", len(data)) + data


def gone() -> bytes:
    return event("ERROR", PROTOS.status(code=410, reason="Expired", message="too old resource version"), "Status")


class Response(io.BytesIO):
    """A urllib3 response's ``read``, ``close`` and ``release_conn`` over fixed bytes."""

    released = False

    def release_conn(self) -> None:
        self.released = True


class Calls:
    """A ``list_*`` method: records each watch call's arguments, answers with the next body."""

    def __init__(self, *bodies: bytes) -> None:
        self.bodies, self.kwargs, self.responses = list(bodies), list[dict[str, Any]](), list[Response]()

    def __call__(self, **kw: Any) -> Response:
        self.kwargs.append(kw)
        self.responses.append(Response(self.bodies.pop(0)))
        return self.responses[-1]


def read(calls: Calls) -> list[tuple[str, str]]:
    w = PodWatch(PROTOS)
    return [(e["type"], e["object"]["metadata"].get("name", "")) for e in w.stream(calls, resource_version="7")]


def test_the_stream_yields_each_event_and_ends_with_the_request() -> None:
    bookmark = PROTOS.pod()
    bookmark.metadata.resourceVersion = "12"
    calls = Calls(event("ADDED", to_proto(pod_json("a"))) + event("MODIFIED", to_proto(pod_json("b", node="n1")))
                  + event("BOOKMARK", bookmark) + event("DELETED", to_proto(pod_json("a"))))
    assert read(calls) == [("ADDED", "a"), ("MODIFIED", "b"), ("BOOKMARK", ""), ("DELETED", "a")]
    # A protobuf watch request: the Accept header, watch on, the body streamed, not preloaded.
    (kw,) = calls.kwargs
    assert kw["_headers"] == {"Accept": "application/vnd.kubernetes.protobuf;stream=watch"}
    assert kw["watch"] is True and kw["_preload_content"] is False and kw["resource_version"] == "7"
    assert calls.responses[0].closed and calls.responses[0].released


def test_an_error_event_is_an_api_exception_with_its_code() -> None:
    calls = Calls(event("ADDED", to_proto(pod_json("a"))) + gone())
    with pytest.raises(ApiException) as err:
        read(calls)
    assert err.value.status == 410 and "too old resource version" in str(err.value.reason)
    assert calls.responses[0].closed


@pytest.mark.parametrize(("body", "message"), [
    (struct.pack(">I", MAX_EVENT_BYTES + 1), "over"),
    (b"\x00\x00", "cut inside a frame (2 bytes left over)"),
    (struct.pack(">I", 100) + b"\x0a" * 10, "cut inside a frame (14 bytes left over)"),
    (struct.pack(">I", 3) + b"\xff\xff\xff", "is not a WatchEvent"),
    ("no prefix", "lacks the protobuf prefix"),
])
def test_a_frame_the_api_server_does_not_write_ends_the_watch_with_a_clear_error(body: Any, message: str) -> None:
    if body == "no prefix":  # the Pod's bytes without k8s\x00 and runtime.Unknown
        ev = PROTOS.watch_event(type="ADDED")
        ev.object.raw = to_proto(pod_json("a")).SerializeToString()
        body = struct.pack(">I", ev.ByteSize()) + ev.SerializeToString()
    calls = Calls(body)
    with pytest.raises(ValueError, match="watch") as err:
        read(calls)
    assert message in str(err.value)
    assert calls.responses[0].closed


def test_stop_ends_the_stream_at_the_next_event() -> None:
    w = PodWatch(PROTOS)
    calls = Calls(event("ADDED", to_proto(pod_json("a"))) + event("ADDED", to_proto(pod_json("b"))))
    seen = []
    for e in w.stream(calls, resource_version="1"):
        seen.append(e["object"]["metadata"]["name"])
        w.stop()
    assert seen == ["a"] and calls.responses[0].closed


def test_the_sync_resumes_from_the_last_revision_and_relists_on_gone() -> None:
    """``ClusterSync._stream`` over the protobuf watch: request after request from the last
    resourceVersion seen (bookmarks included); 410 is ``Gone`` (the sync lists again)."""
    sync = ClusterSync(ListApi([]), GpuCache(build_scorer(PRESETS["default"])), SyncOptions(watch_timeout_s=30))
    bookmark = PROTOS.pod()
    bookmark.metadata.resourceVersion = "20"
    a = to_proto(pod_json("a"))
    a.metadata.resourceVersion = "15"
    calls = Calls(event("ADDED", a), event("BOOKMARK", bookmark), gone())
    seen = []
    with pytest.raises(Gone):
        for kind, obj in sync._stream(calls, "10", "pod", lambda: PodWatch(PROTOS)):
            seen.append((kind, obj["metadata"]["name"]))
    assert seen == [("ADDED", "a")]  # the bookmark moves the revision, and is not an event
    assert [kw["resource_version"] for kw in calls.kwargs] == ["10", "15", "20"]
    assert all(r.closed for r in calls.responses) and sync._watches == []


@pytest.mark.parametrize("chunk_bytes", [1, 5, 1000, 65_536])
def test_frames_are_whole_however_the_connection_splits_them(chunk_bytes: int) -> None:
    bodies = [event("ADDED", to_proto(pod_json(f"p{i}", annotations={"x": "y" * 300 * i}))) for i in range(4)]
    got = list(frames(Response(b"".join(bodies)), chunk_bytes))
    assert got == [b[4:] for b in bodies]
