"""The replay's picture (``allocation.png``): what a person should learn from one run.

Two panels: the whole run (0-130 % of GPU capacity arrived, against the ideal) and the region
where policies differ (80-130 %), with each policy's unallocated % at 100 % arrived written
beside its line. On the bundled openb cluster and pod lists the zoomed panel also marks, at
100 % arrived, the two floors of ``benchmarks.floor`` for the seeds replayed (the
cutting-stock LP no placement beats, and the work-conserving floor no scheduler that places
every pod some GPU can hold beats) and, on the default list, the committed baselines (the
``fgd`` and ``bestfit`` presets, ``results/replay-*-simulator.json``, their median over the
same seeds). A ``--limit`` run is a smoke run: its title says so, and it draws no floor or
baseline (the trace stopped before 100 % arrived).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np

from benchmarks import floor, trace
from benchmarks.replay import GRID, SeedResult

RESULTS = Path(__file__).with_name("results")
BASELINES = {"fgd preset": RESULTS / "replay-fgd-simulator.json",
             "bestfit preset": RESULTS / "replay-bestfit-simulator.json"}
"""Committed baselines on openb default: label -> result file (per-seed unallocated % at 100 %)."""


def bundled(args: argparse.Namespace) -> bool:
    """Whether the run replays the bundled openb cluster and one of its pod lists, unchanged."""
    return (Path(args.nodes).resolve() == trace.DEFAULT_NODES.resolve()
            and Path(args.pods).resolve().parent == trace.DEFAULT_PODS.resolve().parent
            and not args.model_constrained and not args.memory_requests and args.gpu_memory == "openb")


def references(args: argparse.Namespace, seeds: list[int]) -> dict[str, float]:
    """Unallocated % at 100 % arrived that the run is read against, median over ``seeds``.

    Empty for a smoke run or a cluster other than the bundled one. Floors need scipy (the
    ``bench`` extra); without it they are left out.
    """
    if args.limit is not None or not bundled(args):
        return {}
    marks: dict[str, float] = {}
    pods = trace.load_pods(args.pods)
    kinds = floor.bundled_gpu_kinds()  # the node list read once, not per seed and floor
    try:
        cuts = [floor.unallocated_floor_pct(pods, s, kinds) for s in seeds]
        conserving = [floor.work_conserving_floor_pct(pods, s, sum(kinds.values())) for s in seeds]
    except ModuleNotFoundError:
        cuts, conserving = [], []
    if cuts:
        marks["floor (cutting-stock LP)"] = median(cuts)
    if conserving:
        marks["work-conserving floor"] = median(conserving)
    if Path(args.pods).resolve() == trace.DEFAULT_PODS.resolve():
        for label, path in BASELINES.items():
            per_seed = json.loads(path.read_text()).get("seeds", {})
            got = [per_seed[str(s)]["unallocated_pct_100"] for s in seeds if str(s) in per_seed]
            if len(got) == len(seeds):
                marks[f"{label} (committed)"] = median(got)
    return marks


def draw(out: Path, args: argparse.Namespace, policy: str, results: list[SeedResult],
         marks: dict[str, float]) -> None:
    """Write the picture (module notes) for ``results`` of ``policy``; ``marks`` from ``references``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = np.median(np.array([r.curve for r in results]), axis=0)
    unallocated = median(r.unallocated_pct_100 for r in results)
    seeds = f"seeds {results[0].seed}..{results[-1].seed}" if len(results) > 1 else f"seed {results[0].seed}"
    title = f"{Path(args.pods).name}, {seeds}"
    if args.limit is not None:
        arrived = min(r.arrived_pct for r in results)
        title += f"\nsmoke run (--limit {args.limit}, stopped at {arrived:.0f} % arrived): not a result"
    fig, (whole, zoom) = plt.subplots(1, 2, figsize=(11, 4.5), dpi=120, gridspec_kw={"width_ratios": [1, 1.2]})
    for ax in (whole, zoom):
        ax.plot(GRID, np.minimum(GRID, 100), color="0.7", linestyle="--", label="ideal")
        ax.plot(GRID, curve, color="C0", label=f"{policy} (median)")
        ax.grid(alpha=0.3)
        ax.set_xlabel("arrived workload (% of GPU capacity)")
    whole.set_xlim(0, 130)
    whole.set_ylim(0, 100)
    whole.set_ylabel("GPU allocation (% of capacity)")
    whole.axvspan(80, 130, color="0.9", zorder=0)
    low = min([100 - u for u in (unallocated, *marks.values())] + [float(curve[GRID >= 80].min())]) - 1.5
    zoom.set_xlim(80, 130)
    zoom.set_ylim(max(low, 0), 100.5)
    if args.limit is None:
        zoom.annotate(f"{unallocated:.2f} % unallocated at 100 %", (100, 100 - unallocated),
                      xytext=(104, 100 - unallocated - 1.2), arrowprops={"arrowstyle": "->", "color": "C0"},
                      color="C0")
    styles = iter([("C3", "v"), ("C2", "^"), ("C1", "s"), ("C4", "D")])
    for label, pct in marks.items():
        color, marker = next(styles)
        zoom.plot([100], [100 - pct], marker=marker, color=color, linestyle="none",
                  label=f"{label}: {pct:.2f} %")
    zoom.legend(loc="lower right", fontsize=8)
    zoom.set_title("where policies differ: 80-130 % arrived", fontsize=10)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def picture(out: Path, args: argparse.Namespace, result: dict[str, Any], results: list[SeedResult]) -> dict[str, float]:
    """``references`` then ``draw``: the marks (written into ``result.json`` by the replay)."""
    marks = references(args, [r.seed for r in results])
    draw(out, args, str(result["policy"]), results, marks)
    return marks
