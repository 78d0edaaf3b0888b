"""The node agent on the fake NVML backend: inventory, health, staleness, publishing cadence."""

from __future__ import annotations

import datetime as dt
import json
import threading
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from agent.inventory import build_inventory, pod_uid_of_pid, replicas_for
from agent.nvml import FakeNvml, ProcessReading, XidEvent
from agent.publisher import Publisher, PublishOptions
from extender.admin_config import scoring_config
from extender.cache import GpuCache
from extender.translate import outbound
from podspec import annotations as ann
from podspec.nodes import node_observation
from podspec.pods import pod_intent
from scoring.fit import Reason
from scoring.scorer import build_scorer
from tests.conftest import pod_json
from tests.extender.helpers import FakeResponse

T0 = dt.datetime(2026, 11, 22, 12, 0, 0, tzinfo=dt.UTC)
UID = "0b7e1a52-3c4d-4e5f-8a9b-0c1d2e3f4a5b"


class FakeNodeApi:
    """One Node: ``read_node`` returns its labels, ``patch_node`` records annotations."""

    def __init__(self, name: str = "n1", labels: dict[str, str] | None = None) -> None:
        self.name = name
        self.labels = labels or {}
        self.annotations: dict[str, str] = {}
        self.patches = 0

    def read_node(self, name: str, **kw: Any) -> FakeResponse:
        return FakeResponse({"metadata": {"name": name, "labels": self.labels}})

    def patch_node(self, name: str, body: dict[str, Any], **kw: Any) -> FakeResponse:
        self.annotations.update(body["metadata"]["annotations"])
        self.patches += 1
        return FakeResponse({})

    def node_json(self) -> dict[str, Any]:
        return {"metadata": {"name": self.name, "annotations": self.annotations},
                "status": {"allocatable": {"cpu": "32", "memory": "128Gi"}}}


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def fake(node: str = "n1", **extra: Any) -> FakeNvml:
    return FakeNvml.from_config({"node": node, "gpus": [{"name": "A10", "memory_mib": 24576, "count": 2}],
                                 **extra})


def publisher(api: FakeNodeApi, backend: FakeNvml, clock: Clock | None = None, **opts: Any) -> Publisher:
    return Publisher(api, api.name, backend, PublishOptions(**opts), now=lambda: T0,
                     monotonic=clock or Clock())


def test_inventory_validates_against_the_committed_schema_and_the_extender_parser() -> None:
    backend = fake()
    backend.update(0, memory_used_mib=3000, utilization_pct=40,
                   processes=(ProcessReading(101, 2000), ProcessReading(102, 1000)))
    inv = build_inventory("n1", backend.read(), publisher(FakeNodeApi(), backend).health, 4, T0,
                          pod_of=lambda pid: UID)
    text = ann.dump_inventory(inv)
    jsonschema.validate(json.loads(text), json.loads(ann.SCHEMA_PATH.read_text()))
    parsed = ann.parse_inventory(text)
    g0 = parsed.gpus[0]
    assert (g0.uuid, g0.model, g0.memory_mib, g0.memory_used_mib, g0.replicas) == (
        "GPU-fake-n1-0", "A10", 24576, 3000, 4)
    # Both processes belong to one pod: 2000 + 1000 MiB.
    assert [(p.uid, p.memory_used_mib) for p in g0.pods] == [(UID, 3000)]


def test_fatal_xid_marks_the_gpu_unhealthy_and_the_extender_refuses_it() -> None:
    backend = FakeNvml.from_config({"node": "n1", "gpus": [{"name": "A10", "memory_mib": 24576}]})
    api = FakeNodeApi()
    pub = publisher(api, backend)
    stop = threading.Event()
    backend.inject_xid("GPU-fake-n1-0", 13)   # application error: ignored
    backend.inject_xid("GPU-fake-n1-0", 79)   # fallen off the bus: fatal

    def stop_after_two_writes() -> None:
        while pub.writes < 2 and not stop.is_set():
            stop.wait(0.01)
        stop.set()

    watcher = threading.Thread(target=stop_after_two_writes)
    watcher.start()
    pub.run(stop, xid_poll_s=0.01)
    watcher.join()
    (gpu,) = ann.parse_inventory(api.annotations[ann.INVENTORY]).gpus
    assert (gpu.healthy, gpu.health_reason) == (False, "XID 79")

    cache = GpuCache(build_scorer(scoring_config("default")))
    cache.set_nodes([node_observation(api.node_json()).spec(T0, 180)])
    ev = cache.evaluate(pod_intent(pod_json("p", annotations={ann.FRACTION: "0.25"})), ["n1"])
    assert Reason(int(ev.evaluation.reason[0])) == Reason.GPU_UNHEALTHY


def test_application_xids_do_not_change_health() -> None:
    pub = publisher(FakeNodeApi(), fake())
    assert [pub.health.observe(XidEvent("GPU-fake-n1-0", x)) for x in (13, 31, 43, 45, 68, 109)] == [False] * 6
    assert pub.health.reason("GPU-fake-n1-0") == ""


def test_an_agent_that_stops_publishing_makes_the_node_stale() -> None:
    api = FakeNodeApi()
    publisher(api, fake()).publish_once()
    obs = node_observation(api.node_json())
    cache = GpuCache(build_scorer(scoring_config("default")))
    intent = pod_intent(pod_json("p", annotations={ann.FRACTION: "0.25"}))
    # Fresh within the extender's limit (180 s), stale one second after it.
    cache.set_nodes([obs.spec(T0 + dt.timedelta(seconds=180), 180)])
    assert cache.evaluate(intent, ["n1"]).evaluation.node_fits[0]
    cache.set_nodes([obs.spec(T0 + dt.timedelta(seconds=181), 180)])
    ev = cache.evaluate(intent, ["n1"]).evaluation
    assert Reason(int(ev.reason[0])) == Reason.NODE_NOT_READY
    passed, failed, _ = outbound.filter_result(ev, intent, ["n1"])
    assert passed == [] and "inventory stale" in failed["n1"]


def test_publishing_cadence_heartbeat_and_min_interval() -> None:
    api, backend, clock = FakeNodeApi(), fake(), Clock()
    pub = publisher(api, backend, clock, heartbeat_s=60, min_interval_s=10)
    assert pub.publish_once() is True           # first write
    clock.t = 5
    assert pub.publish_once() is False          # nothing changed, heartbeat not due
    backend.update(0, memory_used_mib=512)
    assert pub.publish_once() is False          # changed, but within min_interval (5 s < 10 s)
    clock.t = 10
    assert pub.publish_once() is True           # changed and 10 s since the last write
    clock.t = 69
    assert pub.publish_once() is False          # unchanged, 59 s < heartbeat
    clock.t = 70
    assert pub.publish_once() is True           # heartbeat
    assert api.patches == 3


def test_gfd_replicas_label_wins_over_the_config() -> None:
    assert replicas_for({"nvidia.com/gpu.replicas": "8"}, 4) == 8
    assert replicas_for({"nvidia.com/gpu.replicas": "zero"}, 4) == 4
    assert replicas_for({}, 4) == 4
    api = FakeNodeApi(labels={"nvidia.com/gpu.replicas": "8"})
    assert {g.replicas for g in publisher(api, fake()).inventory().gpus} == {8}


def test_mig_devices_are_their_own_placement_units() -> None:
    backend = FakeNvml.from_config({"node": "n1", "gpus": [{"name": "A100", "memory_mib": 40960, "mig": [
        {"profile": "3g.20gb", "memory_mib": 19968}, {"profile": "1g.5gb", "memory_mib": 4864}]}]})
    inv = publisher(FakeNodeApi(), backend).inventory()
    assert [(g.index, g.uuid, g.model, g.memory_mib, g.replicas, g.mig_parent) for g in inv.gpus] == [
        (0, "MIG-fake-n1-0-0", "A100 MIG 3g.20gb", 19968, 1, "GPU-fake-n1-0"),
        (0, "MIG-fake-n1-0-1", "A100 MIG 1g.5gb", 4864, 1, "GPU-fake-n1-0")]
    # The extender accepts two units with one GPU index when they are MIG devices.
    assert len(ann.parse_inventory(ann.dump_inventory(inv)).gpus) == 2


@pytest.mark.parametrize("line", [
    f"0::/kubepods/burstable/pod{UID}/0123abcd\n",
    f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
    "cri-containerd-0123abcd.scope\n",
])
def test_pod_uid_from_cgroup_both_drivers(tmp_path: Path, line: str) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(line)
    assert pod_uid_of_pid(4242, tmp_path) == UID


def test_process_outside_pods_or_gone_has_no_pod(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "cgroup").write_text("0::/system.slice/sshd.service\n")
    assert pod_uid_of_pid(1, tmp_path) is None
    assert pod_uid_of_pid(99999, tmp_path) is None


def test_missing_nvml_library_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    from agent.nvml import NvmlUnavailable, PynvmlBackend

    def no_library() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    with pytest.raises(NvmlUnavailable, match=r"^NVML could not be initialised \(NVML Shared Library Not Found\)"):
        PynvmlBackend()


def test_real_backend_calls_exist_in_pynvml() -> None:
    # The real backend runs only on a GPU node; at least every NVML name it uses must exist
    # in the installed pynvml (a typo would otherwise surface on the first GPU node).
    import re

    import pynvml

    from agent import nvml

    used = set(re.findall(r"nv\.([A-Za-z_0-9]+)", Path(nvml.__file__).read_text()))
    assert len(used) > 15
    assert sorted(n for n in used if not hasattr(pynvml, n)) == []


def test_once_prints_the_inventory_without_any_api_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    # "print the inventory JSON and exit, write nothing": no kubeconfig, no in-cluster
    # service account, and it still works (it asked for credentials before).
    from agent.cli import main

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    fake = tmp_path / "gpus.yaml"
    fake.write_text("gpus:\n- {name: NVIDIA A10, memory_mib: 24576, count: 2}\n")
    assert main(["--node-name", "n1", "--nvml", "fake", "--fake-config", str(fake), "--once"]) == 0
    inventory = json.loads(capsys.readouterr().out)
    assert inventory["node"] == "n1" and [g["memory_mib"] for g in inventory["gpus"]] == [24576, 24576]
