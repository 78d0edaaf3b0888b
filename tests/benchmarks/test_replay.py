"""The replay end to end through a real uvicorn extender on loopback, and the checker."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from benchmarks import check_placements, extender_client, replay, trace
from benchmarks.cli import main
from benchmarks.scheduler_emulation import Profile
from extender.admin_config import AdminConfig, scoring_config
from extender.clusterfile import load_cluster_file
from scoring.fragmentation import TaskTypes

NODES, PODS = trace.DEFAULT_NODES, trace.DEFAULT_PODS
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def replay_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("replay")
    # 300 pods of seed 42 through HTTP: filter, prioritize, bind, pod events, then deletes.
    rc = main(["replay", "--seeds", "42", "--limit", "300", "--jobs", "1", "--out", str(out),
               "--no-progress"])
    assert rc == 0
    return out


def _strict(constant: str) -> None:
    raise ValueError(f"not JSON: {constant}")


def test_replay_writes_the_contracted_files(replay_out: Path) -> None:
    # Strict JSON: a trace cut short measures no fragmentation at 100 % arrived, and that
    # is null, not a bare NaN that strict parsers refuse.
    result = json.loads((replay_out / "result.json").read_text(), parse_constant=_strict)
    assert result["seeds"]["42"]["fragmentation_rate_100"] is None
    assert 0 < result["seeds"]["42"]["arrived_pct"] < 100
    assert set(result["median"]) >= {"allocation_pct", "unallocated_pct_100", "unallocated_pct_130",
                                     "gpu_pods_failed", "pods_per_s"}
    seed = result["seeds"]["42"]
    assert seed["pods"] == 300 and seed["bind_errors"] == 0
    assert (replay_out / "allocation.png").stat().st_size > 10_000
    # A --limit run is a smoke run: recorded as one, and read against no floor or baseline.
    assert result["smoke"] == {"limit": 300, "arrived_pct": seed["arrived_pct"]}
    assert result["references"] == {}
    rows = list(csv.DictReader((replay_out / "placements-42.csv").open()))
    assert list(rows[0]) == ["pod_name", "node", "gpu_indices", "gpu_milli"]
    # early in the trace the cluster is nearly empty: every pod is placed
    assert len(rows) == 300 - seed["gpu_pods_failed"] - seed["cpu_pods_failed"] and seed["gpu_pods_failed"] == 0
    # fractional pods were packed: fewer GPUs touched than fractional pods placed
    frac = [r for r in rows if r["gpu_milli"] not in ("0", "1000")]
    assert len({(r["node"], r["gpu_indices"]) for r in frac}) < len(frac)


def test_in_process_replay_places_exactly_as_the_http_replay(replay_out: Path, tmp_path: Path) -> None:
    # Same seed and pods without HTTP: the pure-core replay used to tune weights must make
    # the very decisions the served extender makes, or its numbers would say nothing.
    rc = main(["replay", "--seeds", "42", "--limit", "300", "--in-process", "--out", str(tmp_path),
               "--no-progress"])
    assert rc == 0
    http_rows = (replay_out / "placements-42.csv").read_text()
    assert http_rows.count("\n") > 250
    assert (tmp_path / "placements-42.csv").read_text() == http_rows


def test_deciding_in_filter_places_exactly_as_deciding_in_prioritize(tmp_path: Path) -> None:
    # The whole of seed 42 (about 8,000 pods), in process: with --decision filter only the
    # chosen node passes filter and kube-scheduler's scoring is skipped; with prioritize
    # every feasible node passes and gpufrac's 10 at weight 200 decides. Same placements.
    outs = {}
    for decision in ("filter", "prioritize"):
        outs[decision] = tmp_path / decision
        assert main(["replay", "--seeds", "42", "--in-process", "--decision", decision,
                     "--out", str(outs[decision]), "--no-progress"]) == 0
    rows = (outs["filter"] / "placements-42.csv").read_bytes()
    assert rows.count(b"\n") > 7000
    assert (outs["prioritize"] / "placements-42.csv").read_bytes() == rows


def test_python_m_benchmarks_runs_seeds_in_worker_processes(tmp_path: Path) -> None:
    # As README command 1 runs it: `python -m benchmarks`, two seeds in two spawned worker
    # processes (each pickles the parsed arguments; a handler defined in __main__ could not
    # be found there).
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "benchmarks", "replay", "--seeds", "42,43", "--limit", "150",
                        "--in-process", "--jobs", "2", "--no-progress", "--out", str(tmp_path)],
                       cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert sorted(result["seeds"]) == ["42", "43"]
    assert all(s["pods"] == 150 for s in result["seeds"].values())


def test_simulator_profile_places_the_same_through_http_and_in_process(tmp_path: Path) -> None:
    # Under the simulator profile CPU-only pods go through filter and bind too.
    sim = str(REPO / "benchmarks" / "scheduler-config-simulator.yaml")
    common = ["replay", "--seeds", "42", "--limit", "300", "--preset", "bestfit", "--jobs", "1",
              "--scheduler-config", sim, "--no-progress"]
    assert main([*common, "--out", str(tmp_path / "http")]) == 0
    assert main([*common, "--in-process", "--out", str(tmp_path / "core")]) == 0
    http_rows = (tmp_path / "http" / "placements-42.csv").read_text()
    assert http_rows == (tmp_path / "core" / "placements-42.csv").read_text()
    # CPU-only pods are among the identical placements (rows without GPU indices)
    assert any(line.split(",")[2] == "" for line in http_rows.splitlines()[1:])


def test_replay_placements_pass_the_independent_check(replay_out: Path) -> None:
    assert check_placements.check(NODES, PODS, replay_out / "placements-42.csv") == []


def test_checker_catches_violations(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    # openb-pod-0000: 1 whole GPU, 12000m. openb-pod-0001: 460 milli. node-0000: P100 x2, 64000m.
    # GPU 0: 1000 + 460 + 460 (clone-1) = 1920; GPU 1: clones 1, 2, 3 = 1380
    bad.write_text("pod_name,node,gpu_indices,gpu_milli\n"
                   "openb-pod-0000,openb-node-0000,0,1000\n"
                   "openb-pod-0001,openb-node-0000,0,460\n"
                   "openb-pod-0001-clone-1,openb-node-0000,1|0,460\n"
                   "openb-pod-0001-clone-2,openb-node-0000,1,460\n"
                   "openb-pod-0001-clone-3,openb-node-0000,1,460\n"
                   "openb-pod-0000-clone-4,openb-node-0000,7,1000\n")
    problems = check_placements.check(NODES, PODS, bad)
    text = "\n".join(problems)
    assert "whole-GPU pod shares" in text
    assert "('openb-node-0000', 0): 1920 milli > 1000" in text
    assert "openb-pod-0001-clone-1: 2 distinct GPUs, trace asks 1" in text
    assert "openb-pod-0000-clone-4: GPU 7 not on openb-node-0000" in text
    assert "('openb-node-0000', 1): 1380 milli > 1000" in text  # clones 1, 2, 3: 3 x 460


def test_cli_check_placements_exit_codes(replay_out: Path, tmp_path: Path) -> None:
    assert main(["check-placements", str(replay_out / "placements-42.csv"), "--nodes", str(NODES),
                 "--pods", str(PODS)]) == 0
    bad = tmp_path / "bad.csv"
    bad.write_text("pod_name,node,gpu_indices,gpu_milli\nopenb-pod-0000,openb-node-0000,0|1,1000\n")
    assert main(["check-placements", str(bad), "--nodes", str(NODES), "--pods", str(PODS)]) == 1


def test_compare_writes_table_json_and_plots(tmp_path: Path) -> None:
    # Two policies on two variants, 300 pods each, in process: the table has a row per
    # variant and a column per policy, and its numbers are the cells' own medians.
    # bestfit runs under the simulator's profile (every pod through the extender).
    sim = REPO / "benchmarks" / "scheduler-config-simulator.yaml"
    rc = main(["replay", "--compare", f"bestfit@{sim},random", "--variants", "default,gpushare40",
               "--seeds", "42", "--limit", "300", "--in-process", "--out", str(tmp_path),
               "--no-progress"])
    assert rc == 0
    cells = json.loads((tmp_path / "compare.json").read_text())
    assert set(cells) == {"default", "gpushare40"}
    assert set(cells["default"]) == {"bestfit@simulator", "random"}
    # each cell records the profile it ran under: the simulator's has the in-tree scores off
    assert cells["default"]["bestfit@simulator"]["profile"]["fit_weight"] == 0
    assert cells["default"]["random"]["profile"]["fit_weight"] == 1
    # Under the simulator profile the extender bound the CPU-only pods too (no GPU indices).
    table = (tmp_path / "compare.md").read_text()
    for variant in ("default", "gpushare40"):
        row = next(line for line in table.splitlines() if line.startswith(f"| {variant} |"))
        for policy in ("bestfit@simulator", "random"):
            assert f"{cells[variant][policy]['median']['unallocated_pct_100']:.2f}" in row
    assert "| gpushare40 |" in table and "6.04 |" in table  # published FGD beside it
    for png in ("compare-allocation.png", "compare-variants.png"):
        assert (tmp_path / png).stat().st_size > 10_000
    # each cell's placements are feasible
    for variant in ("default", "gpushare40"):
        for policy in ("bestfit@simulator", "random"):
            pods = trace.TRACE_DIR / f"openb_pod_list_{variant}.csv"
            assert check_placements.check(NODES, pods, tmp_path / variant / policy / "placements-42.csv") == []


def test_compare_rejects_an_unknown_variant(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:  # a usage error (exit 2) with the message, not a traceback
        main(["replay", "--compare", "bestfit", "--variants", "gpushare99", "--seeds", "42",
              "--limit", "10", "--in-process", "--out", str(tmp_path), "--no-progress"])
    assert exc.value.code == 2 and "no pod list" in capsys.readouterr().err


@pytest.mark.parametrize(("config", "cpu_pods_filtered"), [
    ("gpu-pods-only", False),                                 # managedResources: gpufrac.io/gpu
    ("scheduler-config.yaml", True),                          # no managedResources: every pod
    ("benchmarks/scheduler-config-simulator.yaml", True),     # no managedResources, in-tree off
])
def test_the_profile_decides_which_pods_reach_the_extender(tmp_path: Path, config: str,
                                                           cpu_pods_filtered: bool) -> None:
    filtered: set[str] = set()

    class Counting(extender_client.InProcessClient):
        def filter(self, args: dict[str, Any]) -> dict[str, Any]:
            filtered.add(args["Pod"]["metadata"]["name"])
            return super().filter(args)

    specs = load_cluster_file(NODES, replicas_per_gpu=20)
    pods = trace.load_pods(PODS)
    client = Counting(specs, AdminConfig(scoring_config("bestfit")))
    if config == "gpu-pods-only":  # the shipped profile with the managedResources it documents
        cfg = yaml.safe_load((REPO / "scheduler-config.yaml").read_text())
        cfg["extenders"][0]["managedResources"] = [{"name": "gpufrac.io/gpu", "ignoredByScheduler": False}]
        (tmp_path / config).write_text(yaml.safe_dump(cfg))
    profile = Profile.from_file(tmp_path / config if config == "gpu-pods-only" else REPO / config)
    tasks = TaskTypes.from_counts(np.array([(1, 500, 1000, 1024)], dtype=np.int64))
    res = replay.replay_seed(client, specs, pods, tasks, 42, profile, tmp_path, progress=False, limit=200)
    seq = trace.arrival_sequence(pods, 42, 1000 * sum(len(s.gpus) for s in specs))[:200]
    gpu_pods = {p.name for p in seq if p.num_gpu}
    cpu_pods = {p.name for p in seq if not p.num_gpu}
    assert cpu_pods and res.gpu_pods_failed == 0
    assert gpu_pods <= filtered
    assert (cpu_pods <= filtered) if cpu_pods_filtered else not (cpu_pods & filtered)


def test_a_cut_short_replay_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--seeds", "42", "--limit", "100", "--in-process", "--out", str(tmp_path),
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "--limit 100: each seed replayed only its first 100 pods, and the trace stopped at" in out
    assert "A smoke run, not a result." in out



def test_benchmarks_without_the_bench_extras_say_what_to_install() -> None:
    # Issue 39: in a base install `python -m benchmarks --help` was a ModuleNotFoundError.
    import subprocess
    import sys

    code = ("import sys, runpy; sys.modules['httpx'] = None; sys.modules['tqdm'] = None; "
            "sys.argv = ['benchmarks', '--help']; runpy.run_module('benchmarks', run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "needs the bench extras" in proc.stderr and "pip install -e '.[bench]'" in proc.stderr


def test_the_state_at_100_percent_arrived_is_written_and_is_what_the_result_reads(tmp_path: Path) -> None:
    # 12 nodes of the bundled list: arrivals pass 100 % and 130 % of their GPUs within
    # seconds, so both marks are reached and the two placement files differ.
    lines = NODES.read_text().splitlines()
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("\n".join(lines[:1] + lines[1:13]) + "\n")
    out = tmp_path / "out"
    assert main(["replay", "--in-process", "--nodes", str(nodes), "--seeds", "42", "--out", str(out),
                 "--no-progress"]) == 0
    seed = json.loads((out / "result.json").read_text())["seeds"]["42"]
    capacity = 1000 * sum(len(s.gpus) for s in load_cluster_file(nodes))

    def allocated_pct(name: str) -> float:
        rows = list(csv.DictReader((out / name).open()))
        return 100.0 * sum(int(r["gpu_milli"]) * len(r["gpu_indices"].split("|")) for r in rows
                           if r["gpu_indices"]) / capacity

    assert allocated_pct("placements-42-at100.csv") == pytest.approx(seed["allocation_pct"]["100"], abs=1e-9)
    assert check_placements.check(nodes, PODS, out / "placements-42-at100.csv") == []
    # the end of the replay (arrivals go on past the 130 % mark) holds at least as much
    assert allocated_pct("placements-42.csv") >= seed["allocation_pct"]["130"] > seed["allocation_pct"]["100"]
