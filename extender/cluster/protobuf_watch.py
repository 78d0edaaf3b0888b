"""The pod watch in protobuf: the API server's cached protobuf encoding of each pod event,
the one kube-scheduler's informer reads, serves gpufrac too (issue 55, item 1; record 0031).

A JSON watch makes the API server encode every pod event a second time, in JSON, for
gpufrac alone; in protobuf it reuses the encoding it already made for kube-scheduler. The
stream (``Accept: application/vnd.kubernetes.protobuf;stream=watch``) is a sequence of
frames, each a 4-byte big-endian length and a ``meta.v1.WatchEvent`` whose object is
``k8s\\x00`` followed by a ``runtime.Unknown`` holding the Pod (or, for ``ERROR``, a
``meta.v1.Status``). ``PodWatch.stream`` reads one watch request and yields each event as
``kubernetes.watch.Watch`` does with plain dicts (``{"type": ..., "object": ...}``); the
object is ``pod_fields``: the Pod's fields that ``podspec.pods.pod_intent`` reads, in the
API's JSON form, so the rest of the sync reads a protobuf event as it reads a JSON list
item. The list (on start and after ``410 Gone``) stays JSON: relist and resume are unchanged.

The message types come from ``kube-core-v1.binpb``, the ``FileDescriptorSet`` of
``k8s.io/api``'s ``core/v1/generated.proto`` and its imports, written by
``python deploy/kube_protos.py`` (``tests/deploy/test_kube_protos.py`` checks the committed
file against the Go module) and loaded into a ``DescriptorPool`` per ``KubeProtos``.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message, message_factory
from kubernetes.client.rest import ApiException

PROTOBUF_WATCH = "application/vnd.kubernetes.protobuf;stream=watch"
"""The ``Accept`` header of a protobuf watch."""
MAGIC = b"k8s\x00"
"""The prefix of every protobuf-encoded Kubernetes object (``runtime.Unknown`` follows)."""
MAX_EVENT_BYTES = 64 << 20
"""The largest watch frame read, bytes; a longer one ends the watch with ``ValueError``
(the API server stores objects of at most ~1.5 MiB; the length prefix is untrusted)."""
DESCRIPTORS = "kube-core-v1.binpb"
"""The descriptor set's file name in this package."""
MAX_TIME_S = 253_402_300_800
"""Seconds from 1970 to the year 10000: the times RFC 3339 can write."""
_LENGTH = struct.Struct(">I")


class KubeProtos:
    """The Pod, WatchEvent, Unknown and Status message classes, from ``DESCRIPTORS``.

    Parameters
    ----------
    data : bytes, optional
        A serialized ``FileDescriptorSet``; the packaged ``DESCRIPTORS`` when None.

    Raises
    ------
    google.protobuf.message.DecodeError, TypeError, KeyError
        When the descriptor set cannot be read or lacks one of the four messages.
    """

    def __init__(self, data: bytes | None = None) -> None:
        if data is None:
            data = resources.files(__package__).joinpath(DESCRIPTORS).read_bytes()
        pool = descriptor_pool.DescriptorPool()
        for file in descriptor_pb2.FileDescriptorSet.FromString(data).file:
            pool.Add(file)

        def cls(name: str) -> Any:
            return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))

        self.pod = cls("k8s.io.api.core.v1.Pod")
        self.watch_event = cls("k8s.io.apimachinery.pkg.apis.meta.v1.WatchEvent")
        self.unknown = cls("k8s.io.apimachinery.pkg.runtime.Unknown")
        self.status = cls("k8s.io.apimachinery.pkg.apis.meta.v1.Status")

    def event(self, frame: bytes) -> tuple[str, dict[str, Any]]:
        """One watch frame as ``(type, object)``: the Pod as ``pod_fields``, an ``ERROR``'s
        Status as ``{"code", "reason", "message"}``.

        Raises
        ------
        ValueError
            When the frame or its object is not what the API server writes (a protobuf
            ``DecodeError`` is one).
        """
        try:
            ev = self.watch_event.FromString(frame)
            raw = ev.object.raw
            if raw[:4] != MAGIC:
                raise ValueError(f"watch event {ev.type!r}: the object lacks the protobuf prefix")
            inner = self.unknown.FromString(raw[4:]).raw
            if ev.type == "ERROR":
                s = self.status.FromString(inner)
                return ev.type, {"code": s.code, "reason": s.reason, "message": s.message}
            return ev.type, pod_fields(self.pod.FromString(inner))
        except message.DecodeError as exc:
            raise ValueError(f"watch frame of {len(frame)} bytes is not a WatchEvent: {exc}") from None


def _time(t: Any) -> str:
    """A ``meta.v1.Time`` as the API server writes it in JSON (RFC 3339, UTC, seconds); ``""``
    outside years 1970-9999 (``podspec.pods`` reads a creation time it cannot order as none)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t.seconds)) if 0 <= t.seconds < MAX_TIME_S else ""


def _containers(items: Any) -> list[dict[str, Any]]:
    out = []
    for c in items:
        limits, requests = c.resources.limits, c.resources.requests
        out.append({"name": c.name, "resources": {"limits": {k: limits[k].string for k in limits},
                                                  "requests": {k: requests[k].string for k in requests}}})
    return out


def _scalars(msg: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """The string fields ``names`` of ``msg`` that are not empty: the API server's JSON leaves
    an empty one out (``omitempty``), so a reader falls back as it does on JSON."""
    return {k: v for k in names if (v := getattr(msg, k))}


def _claim_refs(items: Any, key: str) -> list[dict[str, str]]:
    return [{"name": r.name, **({key: getattr(r, key)} if r.HasField(key) else {})} for r in items]


def pod_fields(pod: Any) -> dict[str, Any]:
    """The fields of a protobuf Pod that gpufrac reads, as the API's JSON has them.

    ``podspec.pods.pod_intent`` of the result equals its ``pod_intent`` of the same Pod read
    as JSON (``tests/e2e/test_protobuf_watch.py`` checks it on the API server's own output):
    metadata's name, namespace, uid, resourceVersion, creationTimestamp, labels,
    annotations and controller reference; the containers' and init containers' names and
    resources; ``priority``, ``nodeName``, ``schedulerName``, ``nodeSelector``, the required
    affinity terms and the spread constraints' ``whenUnsatisfiable`` (present or not, as the
    defragmentation plan reads them); the resource claims by name; the phase. Optional
    fields the Pod does not set are left out, as in JSON.

    Parameters
    ----------
    pod : k8s.io.api.core.v1.Pod message

    Returns
    -------
    dict
        ``{"metadata": ..., "spec": ..., "status": ...}``.
    """
    m, s = pod.metadata, pod.spec
    meta: dict[str, Any] = {**_scalars(m, ("name", "namespace", "uid", "resourceVersion")),
                            "annotations": dict(m.annotations)}
    if m.labels:
        meta["labels"] = dict(m.labels)
    if m.HasField("creationTimestamp"):
        meta["creationTimestamp"] = _time(m.creationTimestamp)
    if m.ownerReferences:
        meta["ownerReferences"] = [{"kind": r.kind, "name": r.name, "controller": r.controller}
                                   for r in m.ownerReferences]
    spec: dict[str, Any] = {"containers": _containers(s.containers), **_scalars(s, ("nodeName", "schedulerName"))}
    if s.initContainers:
        spec["initContainers"] = _containers(s.initContainers)
    if s.HasField("priority"):
        spec["priority"] = s.priority
    if s.nodeSelector:
        spec["nodeSelector"] = dict(s.nodeSelector)
    if s.HasField("affinity"):
        a = s.affinity
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                             {"nodeSelectorTerms": [{}] * len(
                                 a.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms)}}
            if a.nodeAffinity.HasField("requiredDuringSchedulingIgnoredDuringExecution") else {},
            **{key: {"requiredDuringSchedulingIgnoredDuringExecution": [{}] * len(
                getattr(a, key).requiredDuringSchedulingIgnoredDuringExecution)}
               for key in ("podAffinity", "podAntiAffinity")}}
    if s.topologySpreadConstraints:
        spec["topologySpreadConstraints"] = [
            {"whenUnsatisfiable": c.whenUnsatisfiable} if c.HasField("whenUnsatisfiable") else {}
            for c in s.topologySpreadConstraints]
    if s.resourceClaims:
        spec["resourceClaims"] = _claim_refs(s.resourceClaims, "resourceClaimName")
    status: dict[str, Any] = _scalars(pod.status, ("phase",))
    if pod.status.resourceClaimStatuses:
        status["resourceClaimStatuses"] = _claim_refs(pod.status.resourceClaimStatuses, "resourceClaimName")
    return {"metadata": meta, "spec": spec, "status": status}


def frames(resp: Any, chunk_bytes: int = 65_536) -> Iterator[bytes]:
    """The length-prefixed frames of a watch response, read as they arrive (``read1``: at most
    one read of the connection a call, so an event is yielded as soon as it is whole); ends
    when the server ends the request.

    Raises
    ------
    ValueError
        For a frame over ``MAX_EVENT_BYTES``, or a stream cut inside a frame.
    """
    buf, pos = b"", 0
    while True:
        if len(buf) - pos >= 4:
            (n,) = _LENGTH.unpack_from(buf, pos)
            if n > MAX_EVENT_BYTES:
                raise ValueError(f"watch frame of {n} bytes is over {MAX_EVENT_BYTES}")
            if len(buf) - pos >= 4 + n:
                pos += 4 + n
                yield buf[pos - n:pos]
                continue
        chunk = resp.read1(chunk_bytes)
        if not chunk:
            if len(buf) > pos:
                raise ValueError(f"watch stream cut inside a frame ({len(buf) - pos} bytes left over)")
            return
        buf, pos = buf[pos:] + chunk, 0


@dataclass(eq=False)
class PodWatch:
    """One protobuf pod watch at a time, stoppable from another thread (as
    ``kubernetes.watch.Watch``: ``ClusterSync`` keeps either kind).

    Parameters
    ----------
    protos : KubeProtos
    """

    protos: KubeProtos
    _response: Any = None
    _stopped: bool = False

    def stop(self) -> None:
        """End the stream: it returns at its next event, or now when the connection closes."""
        self._stopped = True
        resp = self._response
        if resp is not None:
            resp.close()

    def stream(self, func: Callable[..., Any], **kwargs: Any) -> Iterator[dict[str, Any]]:
        """One watch request of ``func`` (a ``list_*`` method of ``CoreV1Api``), its events
        as ``{"type", "object"}`` dicts.

        Raises
        ------
        kubernetes.client.rest.ApiException
            For a non-2xx answer, and for an ``ERROR`` event with a code (410: the
            ``resourceVersion`` is too old), as ``kubernetes.watch.Watch`` does.
        ValueError
            For a frame over ``MAX_EVENT_BYTES``, cut short, or not a watch event.
        """
        resp = func(watch=True, _preload_content=False, _headers={"Accept": PROTOBUF_WATCH}, **kwargs)
        self._response = resp
        try:
            for frame in frames(resp):
                if self._stopped:
                    return
                kind, obj = self.protos.event(frame)
                if kind == "ERROR":
                    raise ApiException(status=obj["code"], reason=f"{obj['reason']}: {obj['message']}")
                yield {"type": kind, "object": obj}
        except Exception:
            if not self._stopped:  # stopped: the read of the closed connection failed, as asked
                raise
        finally:
            self._response = None
            resp.close()
            resp.release_conn()
