"""The second pod watch of bench scheduler's watcher setups, against a fake connection pool."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks import pod_watcher
from benchmarks.cli import build_parser


class FakeResponse:
    def __init__(self, status: int) -> None:
        self.status, self.released = status, False

    def stream(self, size: int) -> list[bytes]:
        return [b'{"type":"ADDED"}\n', b'{"type":"MODIFIED"}\n']

    def release_conn(self) -> None:
        self.released = True


@pytest.mark.parametrize(("encoding", "accept"), [("json", "application/json"),
                                                  ("protobuf", "application/vnd.kubernetes.protobuf;stream=watch")])
def test_it_watches_every_pod_in_the_encoding_asked_and_stops_after_its_requests(
        monkeypatch: pytest.MonkeyPatch, encoding: str, accept: str) -> None:
    calls: list[tuple[str, str, dict[str, Any]]] = []
    answers = [FakeResponse(500), FakeResponse(200)]

    def request(method: str, url: str, **kw: Any) -> FakeResponse:
        calls.append((method, url, kw))
        return answers[len(calls) - 1]

    api = SimpleNamespace(api_client=SimpleNamespace(configuration=SimpleNamespace(host="https://127.0.0.1:6443"),
                                                     rest_client=SimpleNamespace(pool_manager=SimpleNamespace(
                                                         request=request))))
    monkeypatch.setattr(pod_watcher, "kube_api", lambda path: api)
    monkeypatch.setattr("benchmarks.pod_watcher.time.sleep", lambda s: None)
    args = build_parser().parse_args(["pod-watcher", "kc", "--encoding", encoding, "--max-requests", "2"])
    assert args.kubeconfig == Path("kc")
    assert args.func(args) == 0
    assert [(m, u.split("?")[0], kw["headers"]["Accept"]) for m, u, kw in calls] == [
        ("GET", "https://127.0.0.1:6443/api/v1/pods", accept)] * 2
    assert "watch=true" in calls[0][1] and all(a.released for a in answers)


def test_a_watcher_no_request_of_which_was_answered_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    api = SimpleNamespace(api_client=SimpleNamespace(configuration=SimpleNamespace(host="https://h"),
                                                     rest_client=SimpleNamespace(pool_manager=SimpleNamespace(
                                                         request=lambda *a, **k: FakeResponse(403)))))
    monkeypatch.setattr(pod_watcher, "kube_api", lambda path: api)
    monkeypatch.setattr("benchmarks.pod_watcher.time.sleep", lambda s: None)
    args = build_parser().parse_args(["pod-watcher", "kc", "--max-requests", "3"])
    assert args.func(args) == 1
