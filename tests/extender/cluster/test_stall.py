"""``StallWatch`` (extender.cluster.stall) against a fake API: GPU pods of the profile that no
scheduler attempted, the Lease that says why, Events once per pod and cause, and every API
failure reported rather than raised. The real control plane: tests/e2e/test_faults_e2e.py."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from extender.cluster.stall import (
    EVENT_REASON,
    MAX_EVENTS_PER_PASS,
    StallOptions,
    StallWatch,
    asks_for_gpu,
    attempted,
)
from tests.extender.helpers import FakeResponse


def pod(name: str, gpus: str | int = "1", conditions: list[Any] | None = None, uid: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Pending"}
    if conditions is not None:
        status["conditions"] = conditions
    return {"metadata": {"name": name, "namespace": "team-a", "uid": uid or f"uid-{name}"},
            "spec": {"schedulerName": "gpufrac-scheduler",
                     "containers": [{"name": "c", "resources": {"limits": {"gpufrac.io/gpu": gpus}}}]},
            "status": status}


SCHEDULED_FALSE = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]


class Api:
    """Pods, the release's scheduler pods, Events written; failures on demand."""

    def __init__(self) -> None:
        self.pending: list[dict[str, Any]] = []
        self.schedulers: list[str] = ["gpufrac-scheduler-7d9f-abc"]
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.list_error: Exception | None = None
        self.event_status: int | None = None
        self.selectors: list[str] = []

    def list_pod_for_all_namespaces(self, **kw: Any) -> FakeResponse:
        assert kw["_request_timeout"] > 0 and kw["limit"] > 0
        self.selectors.append(kw["field_selector"])
        if self.list_error is not None:
            raise self.list_error
        return FakeResponse({"items": self.pending})

    def list_namespaced_pod(self, namespace: str, **kw: Any) -> FakeResponse:
        assert namespace == "gpufrac-system" and kw["label_selector"] == "app.kubernetes.io/component=scheduler"
        return FakeResponse({"items": [{"metadata": {"name": n, "namespace": namespace, "uid": n}}
                                       for n in self.schedulers]})

    def create_namespaced_event(self, namespace: str, body: dict[str, Any], **kw: Any) -> FakeResponse:
        assert kw["_request_timeout"] > 0
        if self.event_status is not None:
            raise ApiException(status=self.event_status, reason="refused")
        if any(b["metadata"]["name"] == body["metadata"]["name"] for _, b in self.events):
            raise ApiException(status=409, reason="AlreadyExists")
        self.events.append((namespace, body))
        return FakeResponse({})


class Leases:
    def __init__(self) -> None:
        self.spec: dict[str, Any] | None = None
        self.status = 404

    def read_namespaced_lease(self, name: str, namespace: str, **kw: Any) -> FakeResponse:
        assert (namespace, name) == ("gpufrac-system", "gpufrac-scheduler") and kw["_request_timeout"] > 0
        if self.spec is None:
            raise ApiException(status=self.status, reason="Not Found" if self.status == 404 else "Forbidden")
        return FakeResponse({"metadata": {"name": name}, "spec": self.spec})


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


OPTS = StallOptions(after_s=30, lease=("gpufrac-system", "gpufrac-scheduler"),
                    scheduler_pod_selector="app.kubernetes.io/component=scheduler")


def watch(opts: StallOptions = OPTS) -> tuple[StallWatch, Api, Leases, Clock]:
    api, leases, clock = Api(), Leases(), Clock()
    return StallWatch(api, opts, clock, leases), api, leases, clock


def test_a_pod_never_attempted_is_reported_after_the_window_with_the_stranger_holding_the_lease(
        caplog: pytest.LogCaptureFixture) -> None:
    w, api, leases, clock = watch()
    leases.spec = {"holderIdentity": "stranger", "renewTime": "2026-11-27T18:00:00.000000Z",
                   "leaseDurationSeconds": 10**9}
    api.pending = [pod("p1"), pod("cpu-only", gpus="0"), pod("tried", conditions=SCHEDULED_FALSE)]
    assert not w.check().stalled  # first seen now: not yet
    assert api.selectors[0] == "spec.schedulerName=gpufrac-scheduler,spec.nodeName=,status.phase=Pending"
    clock.t += 29
    assert not w.check().stalled
    clock.t += 1
    with caplog.at_level(logging.WARNING, logger="extender.cluster.stall"):
        report = w.check()
    assert report.pods == ("team-a/p1",) and report.oldest_s == 30
    detail = report.as_dict()
    assert detail["pods_not_attempted"] == 1 and detail["examples"] == ["team-a/p1"]
    assert detail["lease"]["holder"] == "stranger" and detail["lease"]["holder_in_release"] is False
    assert detail["lease"]["lease_duration_s"] == 10**9
    assert "held by 'stranger' (not a kube-scheduler pod of this release" in detail["cause"]
    assert "renewed 30 s ago as seen here" in detail["cause"]  # the renewTime never changed since first read
    assert "stranger" in caplog.text and "team-a/p1" in caplog.text
    [(ns, event)] = api.events
    assert ns == "team-a" and event["reason"] == EVENT_REASON and event["type"] == "Warning"
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "team-a", "name": "p1",
                                       "uid": "uid-p1"}
    assert "stranger" in event["message"] and "schedulerName gpufrac-scheduler" in event["message"]


def test_one_event_per_pod_and_cause_one_log_line_per_cause(caplog: pytest.LogCaptureFixture) -> None:
    w, api, leases, clock = watch()
    leases.spec = {"holderIdentity": "stranger", "renewTime": "t1", "leaseDurationSeconds": 10**9}
    api.pending = [pod("p1")]
    w.check()
    clock.t += 40
    with caplog.at_level(logging.WARNING, logger="extender.cluster.stall"):
        w.check()
        clock.t += 5
        w.check()  # the renew age changed, the cause did not
    assert len(api.events) == 1
    assert sum("not attempted" in r.message for r in caplog.records) == 1
    leases.spec = {"holderIdentity": "gpufrac-scheduler-7d9f-abc_1f2e", "renewTime": "t2", "leaseDurationSeconds": 15}
    clock.t += 5
    report = w.check()  # a new cause: the release's own scheduler holds it (and is not attempting)
    assert "one of this release's kube-scheduler pods" in report.cause() and "renewed 0 s ago" in report.cause()
    assert len(api.events) == 2
    api.pending = []
    with caplog.at_level(logging.WARNING, logger="extender.cluster.stall"):
        assert not w.check().stalled
    assert "attempted again" in caplog.text


def test_a_replica_restarted_does_not_repeat_the_event_another_wrote() -> None:
    w1, api, leases, clock = watch()
    api.pending = [pod("p1")]
    w1.check()
    clock.t += 30
    w1.check()
    w2 = StallWatch(api, OPTS, clock, leases)
    w2.check()
    clock.t += 30
    assert w2.check().stalled
    assert len(api.events) == 1  # the same name: 409, counted as told


def test_the_lease_missing_forbidden_or_unjudged_is_said() -> None:
    w, api, leases, clock = watch()
    api.pending = [pod("p1")]
    w.check()
    clock.t += 31
    assert "does not exist: no kube-scheduler of the profile has been elected" in w.check().cause()
    leases.status = 403
    assert "cannot be read: 403 Forbidden" in w.check().cause()
    leases.spec = {}
    assert "has no holder" in w.check().cause()
    w2, api2, leases2, clock2 = watch(StallOptions(after_s=1, lease=("gpufrac-system", "gpufrac-scheduler")))
    leases2.spec = {"holderIdentity": "x_1"}
    api2.pending = [pod("p1")]
    w2.check()
    clock2.t += 1
    assert "not checked against the release's pods" in w2.check().cause()
    w3, api3, _, clock3 = watch(StallOptions(after_s=1))
    api3.pending = [pod("p1")]
    w3.check()
    clock3.t += 1
    assert w3.check().cause() == "the scheduler's Lease is not read (--scheduler-lease unset)"


def test_api_failures_are_reported_never_raised() -> None:
    w, api, leases, clock = watch()
    api.pending = [pod("p1")]
    w.check()
    clock.t += 31
    api.event_status = 403
    assert w.check().stalled and api.events == []  # not written: tried again next pass
    api.event_status = None
    w.check()
    assert len(api.events) == 1
    api.list_error = ApiException(status=500, reason="Internal Server Error")
    report = w.check()
    assert report.error == "cannot list the pending pods of gpufrac-scheduler: 500 Internal Server Error"
    api.list_error = TimeoutError("read timed out")
    assert "TimeoutError" in w.check().error


def test_events_per_pass_are_bounded_and_the_longest_waiting_go_first() -> None:
    w, api, leases, clock = watch()
    api.pending = [pod("old")]
    w.check()
    clock.t += 10
    api.pending = [pod("old")] + [pod(f"p{i:03d}") for i in range(3 * MAX_EVENTS_PER_PASS)]
    w.check()
    clock.t += 30
    report = w.check()
    assert report.pods[0] == "team-a/old" and report.oldest_s == 40
    assert len(api.events) == MAX_EVENTS_PER_PASS and api.events[0][1]["involvedObject"]["name"] == "old"
    w.check()
    assert len(api.events) == 2 * MAX_EVENTS_PER_PASS


@pytest.mark.parametrize("bad", [
    {"metadata": "x"}, {"metadata": {"name": "n", "namespace": "ns"}},  # no uid
    {"metadata": {"name": "n" * 300, "namespace": "ns", "uid": "u"}}, {"metadata": None}, "not a pod",
    {"metadata": {"name": "n", "namespace": "ns", "uid": "u", "deletionTimestamp": "2026-11-27T18:00:00Z"}},
])
def test_unreadable_pods_are_skipped(bad: Any) -> None:
    w, api, _, clock = watch(StallOptions(after_s=1))
    template = pod("p")
    api.pending = [bad if not isinstance(bad, dict) else {**template, **bad}, pod("good")]
    w.check()
    clock.t += 1
    assert w.check().pods == ("team-a/good",)


def test_what_counts_as_a_gpu_pod_and_as_attempted() -> None:
    assert asks_for_gpu(pod("a", "2")) and asks_for_gpu(pod("a", 1))
    assert not asks_for_gpu(pod("a", "0")) and not asks_for_gpu(pod("a", "-1")) and not asks_for_gpu(pod("a", "x"))
    assert not asks_for_gpu({"spec": {"containers": "x"}}) and not asks_for_gpu({})
    assert not attempted(pod("a")) and not attempted(pod("a", conditions=[{"type": "Initialized"}]))
    assert attempted(pod("a", conditions=SCHEDULED_FALSE))
    assert attempted(pod("a", conditions=[{"type": "PodScheduled", "status": "True"}]))
    assert attempted({"status": {"conditions": "garbage"}})  # unreadable: never a false alarm
