"""The mixed-memory cluster and memory requests (benchmarks.memory) on the real openb lists."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import compare, memory, trace
from extender.clusterfile import load_cluster_file


def test_mixed_memory_cluster_has_four_sizes_and_round_trips(tmp_path: Path) -> None:
    nodes = memory.mixed_memory_nodes(load_cluster_file(trace.DEFAULT_NODES, replicas_per_gpu=4))
    assert sorted({g.memory_mib for n in nodes for g in n.gpus}) == [16384, 24576, 32768, 81920]
    assert {g.memory_mib for n in nodes for g in n.gpus if g.model == "G3"} == {81920}
    back = load_cluster_file(memory.write_cluster_file(nodes, tmp_path / "c.json"))
    assert back == nodes


def test_memory_requests_follow_the_rule_and_fit_somewhere() -> None:
    nodes = memory.mixed_memory_nodes(load_cluster_file(trace.DEFAULT_NODES, replicas_per_gpu=1))
    pods = trace.load_pods(trace.DEFAULT_PODS)
    out = memory.request_memory(pods, 30, nodes)
    asked = [p for p in out if p.gpu_memory_mib]
    assert len(asked) == round(0.3 * sum(1 for p in pods if p.num_gpu))  # 2,119 of 7,064
    assert out == memory.request_memory(pods, 30, nodes) != memory.request_memory(pods, 30, nodes, seed=1)
    for p in asked:
        # at least 512 MiB, at most 3 x the share of 16 GiB, and some node holds it whole
        assert memory.MIN_REQUEST_MIB <= p.gpu_memory_mib <= max(3 * 16384 * p.gpu_milli // 1000, 512)
        assert any(len(n.gpus) >= p.num_gpu and min(g.memory_mib for g in n.gpus) >= p.gpu_memory_mib
                   and n.cpu_milli >= p.cpu_milli for n in nodes if n.gpus)
    annotations = asked[0].pod_object(1)["metadata"]["annotations"]
    assert annotations["gpufrac.io/memory"] == f"{asked[0].gpu_memory_mib}Mi"
    clone = trace.arrival_sequence(out, 1, 6_212_000)[-1]
    assert clone.name.endswith(tuple(f"-clone-{i}" for i in range(10_000)))
    assert clone.gpu_memory_mib == next(p.gpu_memory_mib for p in out if clone.name.startswith(p.name + "-"))


def test_variant_names_combine() -> None:
    assert compare.parse_variant("default-m20-g30") == ("default", 20.0, 30.0)
    assert compare.parse_variant("default-g30") == ("default", 0.0, 30.0)
    assert compare.parse_variant("gpushare40") == ("gpushare40", 0.0, 0.0)
    with pytest.raises(ValueError, match="at most 100"):
        compare.parse_variant("default-g101")
