"""The replay's picture: floors and committed baselines on the bundled trace, none for a smoke run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from benchmarks import picture, replay, trace
from benchmarks.replay import GRID, SeedResult


def args_of(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    replay.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_default_list_is_read_against_both_floors_and_both_baselines() -> None:
    pytest.importorskip("scipy")  # the floors' LP (the bench extra)
    marks = picture.references(args_of(), [42, 43])
    # benchmarks/README.md, "Replay": the floors on openb default and the committed presets'
    # per-seed numbers (results/replay-*-simulator.json), median over the two seeds.
    fgd = json.loads((picture.RESULTS / "replay-fgd-simulator.json").read_text())["seeds"]
    assert marks["fgd preset (committed)"] == pytest.approx(
        (fgd["42"]["unallocated_pct_100"] + fgd["43"]["unallocated_pct_100"]) / 2)
    assert set(marks) == {"floor (cutting-stock LP)", "work-conserving floor", "fgd preset (committed)",
                          "bestfit preset (committed)"}
    assert marks["floor (cutting-stock LP)"] < marks["work-conserving floor"] < marks["fgd preset (committed)"]


def test_a_smoke_run_or_another_cluster_gets_no_marks(tmp_path: Path) -> None:
    assert picture.references(args_of("--limit", "300"), [42]) == {}
    other = tmp_path / "nodes.csv"
    other.write_text(trace.DEFAULT_NODES.read_text())
    assert picture.references(args_of("--nodes", str(other)), [42]) == {}
    assert picture.references(args_of("--model-constrained", "10"), [42]) == {}


def test_draw_writes_two_panels_with_the_marks(tmp_path: Path) -> None:
    curve = [min(float(x), 96.0) for x in GRID]
    results = [SeedResult(seed=42, pods=10, gpu_pods_failed=0, cpu_pods_failed=0, bind_errors=0,
                          allocation_pct={}, unallocated_pct_100=4.0, unallocated_pct_130=4.0,
                          fragmentation_rate_100=0.0, seconds=1.0, pods_per_s=1.0, curve=curve)]
    out = tmp_path / "allocation.png"
    picture.draw(out, args_of(), "default", results, {"work-conserving floor": 3.67})
    assert out.stat().st_size > 20_000
