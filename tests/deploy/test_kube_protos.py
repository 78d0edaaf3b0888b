"""``extender/cluster/kube-core-v1.binpb`` is what ``python deploy/kube_protos.py`` writes from
the Kubernetes API protos (Go modules), and it holds the messages the pod watch reads."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from google.protobuf import descriptor_pb2

from extender.cluster.protobuf_watch import KubeProtos

ROOT = Path(__file__).resolve().parents[2]


def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kube_protos", ROOT / "deploy" / "kube_protos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_descriptors_are_what_the_script_writes(tmp_path: Path) -> None:
    kube_protos = script()
    committed = kube_protos.OUT.read_bytes()
    fresh = kube_protos.generate(tmp_path / "kube-core-v1.binpb").read_bytes()
    parse = descriptor_pb2.FileDescriptorSet.FromString
    assert parse(fresh) == parse(committed)
    assert {f.name for f in parse(committed).file} >= set(kube_protos.PROTOS)


def test_the_descriptors_hold_the_pod_and_the_watch_event() -> None:
    protos = KubeProtos()
    fields = {f.name: f.number for f in protos.pod.DESCRIPTOR.fields}
    assert fields == {"metadata": 1, "spec": 2, "status": 3}
    assert {f.name for f in protos.watch_event.DESCRIPTOR.fields} == {"type", "object"}
    assert protos.status.DESCRIPTOR.fields_by_name["code"].number == 6
