"""The core-decision benchmark runs end to end and records what it measured."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import bench_core, cli
from scoring.state import ClusterState


def test_fill_reaches_the_load_without_breaking_the_state() -> None:
    import numpy as np

    from benchmarks import trace

    state = ClusterState.from_nodes(bench_core.synthetic_nodes(30))
    reached = bench_core.fill(state, trace.load_pods(trace.DEFAULT_PODS), 70.0, np.random.default_rng(1))
    assert 70.0 <= reached < 80.0  # stops at the first pod past the target
    assert (state.gpu_used_milli <= 1000).all() and (state.cpu_used_milli <= state.cpu_alloc_milli).all()
    assert state.workload.task_types() is not None  # the placed pods are the learned demand


def test_bench_core_writes_one_row_per_size(tmp_path: Path) -> None:
    out = tmp_path / "core.json"
    assert cli.main(["bench", "core", "--nodes", "10,20", "--samples", "3", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [r["nodes"] for r in doc["rows"]] == [10, 20] and doc["meta"]["samples"] == 3
    for r in doc["rows"]:
        assert 0 < r["full_p50_ms"] <= r["full_p99_ms"]
        assert 0 < r["incremental_p50_ms"] <= r["incremental_p99_ms"]
        assert 0 <= r["incremental_full_pct"] <= 100 and r["incremental_rows_rescored_mean"] >= 0
