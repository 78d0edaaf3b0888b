"""``GpuModelsPublisher``: the admission policy's list of GPU models, kept from the cache."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from extender.cluster.models import MAX_MODELS, GpuModelsPublisher, ModelsOptions, published_value
from extender.cluster.objects import MERGE_PATCH
from tests.extender.helpers import FakeResponse


class ConfigMapApi:
    """One ConfigMap, or none; every read and patch recorded; ``fail`` raises on the next call."""

    def __init__(self, data: dict[str, str] | None = None, exists: bool = True) -> None:
        self.data, self.exists, self.rv = data, exists, 7
        self.calls: list[tuple[str, Any]] = []
        self.fail: Exception | None = None

    def _check(self) -> None:
        if self.fail is not None:
            raise self.fail
        if not self.exists:
            raise ApiException(status=404, reason="Not Found")

    def read_namespaced_config_map(self, name: str, namespace: str, **kw: Any) -> FakeResponse:
        self.calls.append(("read", (namespace, name, kw["_request_timeout"])))
        self._check()
        body: dict[str, Any] = {"metadata": {"name": name, "resourceVersion": str(self.rv)}}
        if self.data is not None:
            body["data"] = dict(self.data)
        return FakeResponse(body)

    def patch_namespaced_config_map(self, name: str, namespace: str, body: dict[str, Any], **kw: Any) -> FakeResponse:
        self.calls.append(("patch", (body, kw["_content_type"])))
        self._check()
        self.data, self.rv = {**(self.data or {}), **body["data"]}, self.rv + 1
        return FakeResponse({})


def publisher(api: ConfigMapApi, models: list[str], ready: bool = True) -> GpuModelsPublisher:
    return GpuModelsPublisher(api, lambda: iter(models), ModelsOptions("gpufrac-system", "gpufrac-gpu-models"),
                              ready=lambda: ready)


def test_the_published_list_is_sorted_and_unique_and_fails_open_on_forged_names() -> None:
    assert published_value(["T4", "A100", "T4", "NVIDIA A10"]) == "A100,NVIDIA A10,T4"
    assert published_value([]) == ""
    # Names are what agents wrote: too many, or one holding the separator, publish nothing
    # (the policy then checks no model) rather than a list that would refuse real models.
    assert published_value([f"M{i}" for i in range(MAX_MODELS)]) != ""
    assert published_value([f"M{i}" for i in range(MAX_MODELS + 1)]) == ""
    assert published_value(["T4", "A100,H100"]) == ""


def test_a_changed_list_is_written_with_the_version_it_read_and_an_unchanged_one_is_not() -> None:
    api = ConfigMapApi()  # created by the install without data
    pub = publisher(api, ["T4", "A10", "T4"])
    assert pub.publish_once() == "written"
    (_, (body, content_type)) = api.calls[-1]
    assert body == {"metadata": {"resourceVersion": "7"}, "data": {"models": "A10,T4"}}
    assert content_type == MERGE_PATCH
    assert pub.publish_once() == "unchanged" and api.calls[-1][0] == "read"
    assert api.calls[0][1] == ("gpufrac-system", "gpufrac-gpu-models", 5.0)  # every call has a timeout


def test_nothing_is_read_or_written_before_the_cache_is_synced() -> None:
    api = ConfigMapApi()
    assert publisher(api, [], ready=False).publish_once() == "not synced" and api.calls == []


@pytest.mark.parametrize(("status", "outcome"), [(404, "missing"), (409, "error: 409 Conflict"),
                                                 (500, "error: 500 Boom")])
def test_api_refusals_are_outcomes_never_raised(status: int, outcome: str) -> None:
    api = ConfigMapApi(data={"models": "T4"})
    api.fail = ApiException(status=status, reason="Conflict" if status == 409 else "Boom")
    if status == 404:
        api.fail, api.exists = None, False
    assert publisher(api, ["A10"]).publish_once() == outcome
    api.fail = ConnectionError("reset")
    api.exists = True
    assert publisher(api, ["A10"]).publish_once().startswith("error: ConnectionError")


def test_the_loop_survives_a_failing_source_and_stops_when_told() -> None:
    api = ConfigMapApi()
    calls = 0

    def models() -> list[str]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("cache gone")
        return ["T4"]

    stop = threading.Event()
    pub = GpuModelsPublisher(api, models, ModelsOptions("ns", "cm", poll_s=0.01))
    t = threading.Thread(target=pub.loop, args=(stop,))
    t.start()
    deadline = threading.Event()
    for _ in range(500):
        if api.data == {"models": "T4"}:
            break
        deadline.wait(0.01)
    stop.set()
    t.join(5)
    assert not t.is_alive() and api.data == {"models": "T4"} and calls >= 2
