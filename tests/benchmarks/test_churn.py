"""The churn replay: its offered load, kube-scheduler's queue as it emulates it, its report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks import cli, trace
from benchmarks.churn import report, subset_nodes
from benchmarks.churn.measures import RunResult, pod_class
from benchmarks.churn.queue import ChurnSim, backoff_s
from benchmarks.churn.workload import Arrival, arrival_rate_per_s, borrow_lifetimes, offered_arrivals
from benchmarks.extender_client import REPO_ROOT, InProcessClient
from benchmarks.scheduler_emulation import Profile
from extender.admin_config import AdminConfig, scoring_config
from scoring.specs import GpuSpec, NodeSpec

PROFILE = Profile.from_file(REPO_ROOT / "scheduler-config.yaml")


def node(name: str, gpus: int = 1) -> NodeSpec:
    return NodeSpec(name, 64_000, 262_144, tuple(
        GpuSpec(i, f"GPU-{name}-{i}", "V100M16", 16_384, 20) for i in range(gpus)))


def pod(name: str, num_gpu: int = 1, gpu_milli: int = 1000, lifetime_s: int = 100) -> trace.TracePod:
    return trace.TracePod(name, 1000, 1024, num_gpu, gpu_milli if num_gpu else 0, "", "LS", lifetime_s=lifetime_s)


def play(specs: list[NodeSpec], arrivals: list[Arrival], run_s: float, warmup_s: float = 0.0,
         preset: str = "default") -> RunResult:
    sim = ChurnSim(InProcessClient(specs, AdminConfig(scoring_config(preset))), specs, PROFILE, seed=1)
    return sim.run(arrivals, preset, 1.0, run_s, warmup_s)


def arrive(t_s: float, p: trace.TracePod) -> Arrival:
    return Arrival(t_s, p, float(p.lifetime_s))


# -- the offered load ---------------------------------------------------------------------------

def test_the_rate_offers_the_load_by_littles_law() -> None:
    # Two pods: 1 GPU for 100 s, and half a GPU for 400 s cut at 200 s: mean GPU work per
    # arrival (1000 * 100 + 500 * 200) / 2 = 100,000 milli-GPU-seconds; a CPU-only pod adds a
    # third arrival with none: 200,000 / 3. At load 0.5 on 4 GPUs (4,000 milli):
    # lambda = 0.5 * 4000 / (200000 / 3) = 0.03 arrivals/s.
    pods = [pod("a", 1, 1000, 100), pod("b", 1, 500, 400), pod("c", 0, 0, 50)]
    assert arrival_rate_per_s(pods, 4000, 0.5, 200.0) == pytest.approx(0.03)


def test_arrivals_are_seeded_ordered_and_offer_the_load() -> None:
    pods = trace.load_pods(trace.DEFAULT_PODS)
    cap_s, run_s, capacity = 3600.0, 48 * 3600.0, 50_000
    a = offered_arrivals(pods, capacity, 0.8, run_s, cap_s, seed=7)
    assert a == offered_arrivals(pods, capacity, 0.8, run_s, cap_s, seed=7)
    assert a != offered_arrivals(pods, capacity, 0.8, run_s, cap_s, seed=8)
    shorter = offered_arrivals(pods, capacity, 0.8, run_s / 3, cap_s, seed=7)
    assert shorter and shorter == a[:len(shorter)]  # a shorter run plays the same pods first
    times = np.array([x.t_s for x in a])
    assert (np.diff(times) >= 0).all() and times[-1] < run_s
    assert max(x.lifetime_s for x in a) <= cap_s
    assert len({x.pod.name for x in a}) == len(a)
    # The GPU work offered per second of run is load * capacity, within sampling noise (the
    # lifetimes are heavy-tailed: a 15 % band at ~1,000 arrivals).
    offered = sum(x.pod.gpu_request_milli * x.lifetime_s for x in a) / run_s
    assert offered == pytest.approx(0.8 * capacity, rel=0.15)


def test_a_pod_list_without_times_is_refused() -> None:
    no_times = [trace.TracePod("a", 1000, 1024, 1, 500, "", "LS")]
    with pytest.raises(ValueError, match="creation_time"):
        arrival_rate_per_s(no_times, 1000, 1.0, 100.0)


def test_the_node_sample_keeps_the_mix() -> None:
    specs = [node(f"n{i}", gpus=1 + i % 2) for i in range(8)]
    sample = subset_nodes(specs, 2)
    assert len(sample) == 4 and sorted(len(s.gpus) for s in sample) == [1, 1, 2, 2]
    with pytest.raises(ValueError):
        subset_nodes(specs, 0)
    # Another offset is another sample of the same mix, with no node in common.
    other = subset_nodes(specs, 2, offset=1)
    assert sorted(len(s.gpus) for s in other) == [1, 1, 2, 2]
    assert not {s.name for s in sample} & {s.name for s in other}
    with pytest.raises(ValueError, match="node-offset"):
        subset_nodes(specs, 2, offset=2)


def test_a_pod_list_without_times_borrows_them_by_class() -> None:
    donors = [pod("d1", 1, 1000, 100), pod("d2", 1, 1000, 300), pod("d3", 1, 250, 50), pod("d4", 4, 1000, 900),
              pod("d0", 0, 0, 7)]
    shapes = [trace.TracePod(f"p{i}", 1000, 1024, k, m, "", "LS") for i, (k, m) in
              enumerate([(1, 1000), (1, 1000), (1, 500), (4, 1000), (8, 1000), (0, 0)])]
    got = borrow_lifetimes(shapes, donors)
    assert got[0].lifetime_s in (100, 300) and got[1].lifetime_s in (100, 300)  # whole 1-GPU donors
    assert got[2].lifetime_s == 50  # a share: the share donor
    assert got[3].lifetime_s == 900 and got[4].lifetime_s == 900  # 8 GPUs: no donor, the 4-GPU ones
    assert got[5].lifetime_s == 7
    assert borrow_lifetimes(shapes, donors) == got  # by name: the same every time
    assert borrow_lifetimes([pod("keeps", 1, 1000, 5)], donors)[0].lifetime_s == 5
    with pytest.raises(ValueError, match="lifetime"):
        borrow_lifetimes(shapes, shapes)


def _result(preset: str, seed: int, alloc: float, never: int, p99_s: float) -> RunResult:
    classes = {c: {"n": 100, "never_ran": 0, "p50_s": 0.0, "p99_s": 0.0, "max_s": 0.0}
               for c in ("fractional", "whole-1", "multi-gpu", "cpu-only")}
    classes["multi-gpu"] = {"n": 100, "never_ran": never, "p50_s": 0.0, "p99_s": p99_s, "max_s": p99_s}
    return RunResult(preset, 0.9, seed, 1000, alloc, 0.0, 0.0, 0.0, 0.0, classes, 0, 0, 1.0, {})


def test_the_report_pairs_seeds_with_an_interval_and_sign_counts() -> None:
    # a minus b per seed: allocation +1, +2, +3 (mean 2, sd 1: t(0.975, 2) = 4.303, half
    # width 4.303 / sqrt(3) = 2.484); never ran 2-3, 2-2, 4-2 (a better, tied, worse).
    runs = [_result("a", s, 80 + d, n, 3600.0) for s, d, n in ((1, 1.0, 2), (2, 2.0, 2), (3, 3.0, 4))]
    runs += [_result("b", s, 80.0, n, 7200.0) for s, n in ((1, 3), (2, 2), (3, 2))]
    p = report.paired(runs, "a", "b", 0.9)
    assert p is not None and p["seeds"] == [1, 2, 3]
    assert p["allocation_pct"]["mean"] == pytest.approx(2.0)
    assert p["allocation_pct"]["ci95"] == (pytest.approx(2.0 - 2.484, abs=1e-3), pytest.approx(2.0 + 2.484, abs=1e-3))
    assert (p["allocation_pct"]["wins"], p["allocation_pct"]["ties"], p["allocation_pct"]["losses"]) == (3, 0, 0)
    assert (p["never_ran"]["wins"], p["never_ran"]["ties"], p["never_ran"]["losses"]) == (1, 1, 1)
    assert p["multi_p99_s"]["mean"] == -3600.0 and p["multi_p99_s"]["wins"] == 3  # shorter waits win
    md = "\n".join(report.comparison(runs, [0.9]))
    assert "| 0.9 | b | +2.00 [-0.48, +4.48] (3/0/0) |" in md
    # A p99 read off censored waits (more than 1 % of the class never ran) is marked a lower bound.
    assert report.medians([_result("a", 1, 80, 5, 3600.0)])["multi-gpu.censored"]
    assert not report.medians([_result("a", 1, 80, 1, 3600.0)])["multi-gpu.censored"]


# -- kube-scheduler's queue ---------------------------------------------------------------------

def test_a_pod_that_fits_nowhere_waits_and_runs_when_room_frees() -> None:
    # One GPU. a holds it 0..100; b arrives at 10, fails (back-off 1 s), and is retried when a
    # leaves at 100 (its back-off long past): it waited 90 s, then runs 100 s.
    r = play([node("n")], [arrive(0, pod("a")), arrive(10, pod("b"))], run_s=300)
    assert r.pending["whole-1"]["n"] == 2
    assert r.pending["whole-1"]["max_s"] == pytest.approx(90)
    assert r.pending["whole-1"]["never_ran"] == 0
    # Allocated 0..200 of 300 s: 66.67 %; some GPU pod waited 10..100 while nothing was free.
    assert r.allocation_pct == pytest.approx(100 * 200 / 300)
    assert r.waiting_pct == pytest.approx(100 * 90 / 300)
    assert r.fragmentation_delay_pct == 0.0


def test_a_retry_waits_out_its_back_off() -> None:
    # b fails at 99.5; a leaves at 100; b's back-off (1 s) ends at 100.5: it starts then.
    r = play([node("n")], [arrive(0, pod("a")), arrive(99.5, pod("b"))], run_s=300)
    assert r.pending["whole-1"]["max_s"] == pytest.approx(1.0)
    assert [backoff_s(k) for k in (1, 2, 3, 4, 5, 9, 5000)] == [1, 2, 4, 8, 10, 10, 10]


def test_the_oldest_failure_is_retried_first_and_the_loser_costs_no_cycle() -> None:
    # b (failed at 10) and c (failed at 20) wait for the one GPU; a's leaving wakes both, b gets it.
    r = play([node("n")], [arrive(0, pod("a")), arrive(10, pod("b", lifetime_s=1000)),
                           arrive(20, pod("c"))], run_s=300)
    waits = sorted([r.pending["whole-1"]["max_s"], r.pending["whole-1"]["p50_s"]])
    assert r.pending["whole-1"]["never_ran"] == 1  # c: b holds the GPU past the end
    assert waits[-1] == pytest.approx(300 - 20)  # c waited to the end
    # a, b, c on arrival and b's retry; c's retry, after b's, finds the GPU taken: no cycle.
    assert r.cycles == 4 and r.retries_skipped == 1


def test_room_too_small_wakes_nobody_and_fragmentation_is_measured() -> None:
    # Two one-GPU nodes under the spread preset: h1 (0.5) on one, h2 (0.3) on the emptier
    # other, s (0.2) there too (0.7 free against 0.5): 0.5 taken on each GPU. A whole-GPU pod
    # w waits though a whole GPU's share is free in sum (500 + 500): fragmentation delay. When
    # s leaves (0.7 free on its GPU), nothing wakes w: one cycle each, on arrival, only.
    specs = [node("n1"), node("n2")]
    arrivals = [arrive(0, pod("h1", 1, 500, 10_000)), arrive(1, pod("h2", 1, 300, 10_000)),
                arrive(2, pod("s", 1, 200, 50)), arrive(5, pod("w", 1, 1000, 100))]
    r = play(specs, arrivals, run_s=1000, preset="spread")
    assert r.pending["whole-1"]["never_ran"] == 1
    assert r.cycles == 4 and r.retries_skipped == 0
    # w waits from 5 to 1000 with 2,000 - 1,000 = 1,000 free (1,200 after s leaves at 52),
    # always >= its 1,000: fragmentation delay 995 of 1,000 s.
    assert r.fragmentation_delay_pct == pytest.approx(99.5)
    assert r.fragmentation_waiting_pods == pytest.approx(0.995) and r.waiting_gpu_pods == pytest.approx(0.995)
    assert pod_class(1, 1000) == "whole-1" and pod_class(2, 1000) == "multi-gpu"
    assert pod_class(1, 999) == "fractional" and pod_class(0, 0) == "cpu-only"


def test_warm_up_is_left_out_of_the_measures() -> None:
    r = play([node("n")], [arrive(0, pod("a", lifetime_s=100))], run_s=300, warmup_s=100)
    assert r.allocation_pct == 0.0 and r.pending["whole-1"]["n"] == 0


# -- the command --------------------------------------------------------------------------------

def test_the_command_writes_its_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "churn"
    assert cli.main(["churn", "--presets", "default,spread", "--loads", "1.1", "--seeds", "42",
                     "--hours", "0.5", "--lifetime-cap-hours", "0.25", "--warmup-hours", "0.25",
                     "--node-stride", "48", "--jobs", "1", "--out", str(out)]) == 0
    record = json.loads((out / "churn.json").read_text())
    assert {(r["preset"], r["load"], r["seed"]) for r in record["runs"]} == {("default", 1.1, 42), ("spread", 1.1, 42)}
    for r in record["runs"]:
        assert 0 < r["allocation_pct"] <= 100 and r["arrivals"] > 0
        assert set(r["pending"]) == {"fractional", "whole-1", "multi-gpu", "cpu-only"}
    assert set(record["series"]) == {"default@1.1", "spread@1.1"}
    assert (out / "churn.png").stat().st_size > 10_000
    md = (out / "churn.md").read_text()
    assert "### offered load 1.1 x capacity" in md and "| default |" in md and "| spread |" in md
    assert "churn.md" in capsys.readouterr().out
    # A second load in another folder; --merge writes one report of both, replaying nothing.
    other = tmp_path / "churn-0.6"
    assert cli.main(["churn", "--presets", "default,spread", "--loads", "0.6", "--seeds", "42",
                     "--hours", "0.5", "--lifetime-cap-hours", "0.25", "--warmup-hours", "0.25",
                     "--node-stride", "48", "--jobs", "1", "--no-picture", "--out", str(other)]) == 0
    assert not (other / "churn.png").exists()
    merged = tmp_path / "merged"
    assert cli.main(["churn", "--merge", str(out), str(other), "--out", str(merged)]) == 0
    both = json.loads((merged / "churn.json").read_text())
    assert "series" not in both and (merged / "churn.png").stat().st_size > 10_000  # drawn, not kept
    assert sorted((r["preset"], r["load"]) for r in both["runs"]) == [
        ("default", 0.6), ("default", 1.1), ("spread", 0.6), ("spread", 1.1)]
    text = (merged / "churn.md").read_text()
    assert "### offered load 0.6 x capacity" in text and "### offered load 1.1 x capacity" in text
    assert md.split("### default against")[0].split("### offered load 1.1")[1] in text  # the same rows
    # A policy re-run alone (here: the default at 0.6, as another commit wrote it) replaces its
    # earlier runs; the others are kept, and both commits recorded.
    rerun = json.loads((other / "churn.json").read_text())
    rerun["commit"], rerun["command"]["presets"] = "rerun", ["default"]
    # ... read from another checkout: the same pod list by name, in another folder
    rerun["command"]["pods"] = "/elsewhere/checkout/" + Path(rerun["command"]["pods"]).name
    rerun["runs"] = [{**r, "allocation_pct": 12.5} for r in rerun["runs"] if r["preset"] == "default"]
    (tmp_path / "rerun").mkdir()
    (tmp_path / "rerun" / "churn.json").write_text(json.dumps(rerun))
    assert cli.main(["churn", "--merge", str(out), str(other), str(tmp_path / "rerun"), "--no-picture",
                     "--out", str(tmp_path / "replaced")]) == 0
    replaced = json.loads((tmp_path / "replaced" / "churn.json").read_text())
    got = {(r["preset"], r["load"]): r["allocation_pct"] for r in replaced["runs"]}
    assert len(replaced["runs"]) == 4 and got[("default", 0.6)] == 12.5
    assert got[("spread", 0.6)] == next(r["allocation_pct"] for r in both["runs"] if r["preset"] == "spread"
                                        and r["load"] == 0.6)
    assert "rerun" in replaced["commits"] and len(replaced["commits"]) == 2
    # A merged folder merges again (its commits and dates are lists), and --tuning-seeds given
    # with --merge splits the report into tuning and held-out seeds.
    assert cli.main(["churn", "--merge", str(tmp_path / "replaced"), str(other), "--tuning-seeds", "42",
                     "--no-picture", "--out", str(tmp_path / "again")]) == 0
    again = json.loads((tmp_path / "again" / "churn.json").read_text())
    assert set(again["commits"]) == set(replaced["commits"]) and again["command"]["tuning_seeds"] == [42]
    assert "Tuning seeds" in (tmp_path / "again" / "churn.md").read_text()
    # Runs of another cluster are not merged.
    odd = tmp_path / "odd"
    assert cli.main(["churn", "--presets", "default", "--loads", "0.6", "--seeds", "42", "--hours", "0.5",
                     "--lifetime-cap-hours", "0.25", "--warmup-hours", "0.25", "--node-stride", "40",
                     "--jobs", "1", "--no-picture", "--out", str(odd)]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli.main(["churn", "--merge", str(out), str(odd), "--out", str(tmp_path / "x")])
    assert "replayed another cluster, pod list or window" in capsys.readouterr().err


def test_the_command_refuses_a_warm_up_past_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["churn", "--hours", "1", "--warmup-hours", "2", "--out", "/nonexistent/x"])
    assert "--warmup-hours" in capsys.readouterr().err


def test_acting_on_the_defragmentation_plan_moves_a_pod_so_the_waiting_one_runs() -> None:
    # Two one-GPU nodes, spread: two half-GPU pods (t=0, 1) land on different nodes. A
    # whole-GPU pod arrives at t=10: 500 + 500 free in sum, no GPU empty: it waits for
    # fragmentation until a pod leaves (t=5000, past the 2000 s run). Acting on the plan after
    # 60 s of waiting (plans every 30 s: t=0, 30, 60, 90; at 60 it has waited 50 s): at t=90
    # the plan frees one node by moving its half-GPU pod to the other; the replacement runs at
    # once, and the whole-GPU pod at once too (its retry comes with the room freed).
    from extender.cache.defrag import DefragPolicy

    specs = [node("a"), node("b")]
    arrivals = [arrive(0, pod("h1", 1, 500, 5000)), arrive(1, pod("h2", 1, 500, 5000)),
                arrive(10, pod("w", 1, 1000, 5000))]

    def run(defrag: DefragPolicy) -> RunResult:
        config = AdminConfig(scoring_config("spread"))
        sim = ChurnSim(InProcessClient(specs, config), specs, PROFILE, seed=1, defrag=defrag)
        return sim.run(arrivals, "spread", 1.0, 2000.0, 0.0)

    without = run(DefragPolicy())
    assert without.pending["whole-1"]["never_ran"] == 1 and without.evictions_per_hour == 0
    acted = run(DefragPolicy(evict=True, evict_after_s=60, max_evictions_per_hour=12, plan_every_s=30))
    assert acted.pending["whole-1"]["never_ran"] == 0
    assert acted.pending["whole-1"]["max_s"] == pytest.approx(80.0)  # arrived at 10, ran at 90
    assert acted.evictions_per_hour == pytest.approx(3600.0 / 2000.0)  # one eviction in 2000 s
    assert acted.moved_pending == {"n": 1.0, "p50_s": 0.0, "max_s": 0.0}
    # GPU allocation of 2000 milli: 500 for 1 s, 1000 until t=90, then 2000 (acted) or 1000.
    assert acted.allocation_pct == pytest.approx(100 * (500 * 1 + 1000 * 89 + 2000 * 1910) / (2000 * 2000))
    assert without.allocation_pct == pytest.approx(100 * (500 * 1 + 1000 * 1999) / (2000 * 2000))
