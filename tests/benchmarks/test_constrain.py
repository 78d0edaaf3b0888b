"""The model-constraint rule (benchmarks.constrain) on the real openb lists."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks import compare, constrain, trace
from extender.clusterfile import load_cluster_file
from scoring.specs import NodeSpec

Openb = tuple[list[trace.TracePod], list[NodeSpec]]


@pytest.fixture(scope="module")
def openb() -> Openb:
    return trace.load_pods(trace.DEFAULT_PODS), load_cluster_file(trace.DEFAULT_NODES, replicas_per_gpu=1)


@pytest.mark.parametrize("pct", [10, 20, 33])
def test_the_stated_share_is_restricted_and_every_pod_still_fits_somewhere(openb: Openb, pct: int) -> None:
    pods, nodes = openb
    out = constrain.restrict_models(pods, pct, nodes)
    gpu_pods = [p for p in pods if p.num_gpu]
    restricted = [q for q in out if q.gpu_spec]
    # openb default has 7,064 GPU pods: 706 / 1,413 / 2,331 of them (every chosen pod has a
    # model that can hold it, so none is skipped).
    assert len(restricted) == round(pct / 100 * len(gpu_pods))
    assert [(p.name, p.cpu_milli, p.num_gpu, p.gpu_milli) for p in pods] == \
        [(q.name, q.cpu_milli, q.num_gpu, q.gpu_milli) for q in out]
    assert all(q.num_gpu for q in restricted)  # CPU-only pods have no GPU to choose
    for q in restricted:
        models = q.gpu_spec.split("|")
        assert 1 <= len(models) <= 3 and models == sorted(set(models))
        assert any(sum(1 for g in n.gpus if g.model in models) >= q.num_gpu and n.cpu_milli >= q.cpu_milli
                   and n.memory_mib >= q.memory_mib for n in nodes if any(g.model in models for g in n.gpus))


def test_models_are_drawn_by_capacity_and_the_rule_is_seeded(openb: Openb) -> None:
    pods, nodes = openb
    out = constrain.restrict_models(pods, 33, nodes)
    assert out == constrain.restrict_models(pods, 33, nodes)
    assert out != constrain.restrict_models(pods, 33, nodes, seed=1)
    alone = Counter(q.gpu_spec for q in out if q.gpu_spec and "|" not in q.gpu_spec)
    # G2 holds 4,392 of the 6,212 GPUs, T4 842, A10 2: single-model pods follow that order.
    assert alone["G2"] > alone["T4"] > alone.get("A10", 0)
    assert alone.get("A10", 0) <= 3


def test_variant_names() -> None:
    assert constrain.parse_variant("default-m20") == ("default", 20.0)
    assert constrain.parse_variant("multigpu50") == ("multigpu50", 0.0)
    assert compare.pods_path("cpu050-m10") == trace.TRACE_DIR / "openb_pod_list_cpu050.csv"
    assert compare.variant_names(["default-m33"]) == ["default-m33"]
    with pytest.raises(ValueError, match="at most 100"):
        constrain.parse_variant("default-m150")
    with pytest.raises(ValueError, match=r"pct must be in \[0, 100\]"):
        constrain.restrict_models([], -1, [])
