"""Watches with a deadline (issue 52): a connection that goes silent is given up and the watch
resumed from its last resourceVersion on a new one; a watch with no sign of life is named.

The watch requests are played by a fake ``kubernetes.watch.Watch.stream``: each call is one
request, scripted (events, a clean end at the server's timeout, or a read that times out).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import urllib3
from kubernetes import watch

from extender.cache import GpuCache
from extender.cluster.objects import SyncOptions
from extender.cluster.sync import ClusterSync
from extender.quarantine import Quarantine
from scoring.presets import PRESETS
from scoring.scorer import build_scorer
from tests.extender.helpers import ListApi


def node_event(name: str, rv: str) -> dict[str, Any]:
    return {"type": "ADDED", "object": {"metadata": {"name": name, "resourceVersion": rv},
                                        "status": {"allocatable": {"cpu": "1", "memory": "1Gi"}}}}


class Requests:
    """What each watch request does, in order; records the resourceVersion and timeouts asked."""

    def __init__(self, sync: ClusterSync, clock: list[float], script: list[Any]) -> None:
        self.sync, self.clock, self.script = sync, clock, script
        self.asked: list[tuple[str, int, tuple[float, float]]] = []

    def stream(self, func: Any, **kw: Any) -> Iterator[dict[str, Any]]:
        # A generator, as Watch.stream is: the request is made at the first read.
        self.asked.append((kw["resource_version"], kw["timeout_seconds"], kw["_request_timeout"]))
        step = self.script.pop(0)
        if step == "silent":  # nothing arrives: the client's read deadline ends it
            self.clock[0] += kw["_request_timeout"][1]
            raise urllib3.exceptions.ReadTimeoutError(None, "/api/v1/nodes", "Read timed out.")  # type: ignore[arg-type]
        if step == "stop":
            self.sync._stop.set()
            return
        self.clock[0] += 1
        yield from step


def test_a_silent_watch_is_resumed_on_a_new_connection_and_named_meanwhile(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    cache = GpuCache(build_scorer(PRESETS["default"]))
    sync = ClusterSync(ListApi([]), cache, SyncOptions(watch_timeout_s=30, watch_read_margin_s=15),
                       quarantine=Quarantine(), monotonic=lambda: clock[0])
    script: list[Any] = [[node_event("a", "5")], "silent", [node_event("b", "9")], [], "stop"]
    requests = Requests(sync, clock, script)
    monkeypatch.setattr(watch.Watch, "stream", requests.stream)
    seen = [obj["metadata"]["name"] for _, obj in sync._stream(lambda **kw: None, "1", "node")]
    assert seen == ["a", "b"]
    # Every request asks the server to end it at 30 s and reads it with a 45 s deadline; the
    # one after the silent connection resumes from the last revision seen (5), not a relist.
    assert [rv for rv, _, _ in requests.asked] == ["1", "5", "5", "9", "9"]
    assert {(t, r[1]) for _, t, r in requests.asked} == {(30, 45.0)}
    assert sync.silent_watches() == {}  # it came back


def test_silence_past_the_deadline_is_named_and_readiness_drops() -> None:
    clock = [0.0]
    sync = ClusterSync(ListApi([]), GpuCache(build_scorer(PRESETS["default"])),
                       SyncOptions(watch_timeout_s=30, watch_read_margin_s=15), monotonic=lambda: clock[0])
    sync._alive("pod")
    sync._alive("node")
    clock[0] = 40.0
    sync._alive("node")
    clock[0] = 46.0  # pod: 46 s without a sign of life, past 30 + 15
    assert sync.silent_watches() == {"pod": 46.0}
    assert sync.watch_silences() == {"pod": 46.0, "node": 6.0}


def test_the_back_off_starts_anew_after_a_list_that_worked(monkeypatch: pytest.MonkeyPatch) -> None:
    # Was: the delay kept doubling across relists that succeeded, up to 30 s between them.
    sync = ClusterSync(ListApi([]), GpuCache(build_scorer(PRESETS["default"])), SyncOptions())
    waits: list[float] = []
    calls = [0]

    def list_and_watch() -> None:
        calls[0] += 1
        if calls[0] in (1, 2):
            raise ConnectionError("refused")  # two failures before anything is listed
        if calls[0] == 5:
            sync._stop.set()
        sync._alive("pod")  # listed, then the watch failed
        raise ConnectionError("reset")

    def wait(seconds: float) -> bool:
        waits.append(seconds)
        return False

    monkeypatch.setattr(sync._stop, "wait", wait)
    sync._loop(list_and_watch, "pod")
    assert waits == [0.5, 1.0, 0.5, 0.5, 0.5]
