"""The churn replay's report: one table per load (medians over seeds) and one picture."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from benchmarks.churn.queue import RunResult

GPU_CLASSES = ("fractional", "whole-1", "multi-gpu")


def duration(seconds: float) -> str:
    """``95`` -> ``1.6 min``; seconds below a minute, minutes below two hours, else hours."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def medians(runs: list[RunResult]) -> dict[str, Any]:
    """Medians over seeds of one (preset, load)'s runs."""
    out: dict[str, Any] = {
        "allocation_pct": _median([r.allocation_pct for r in runs]),
        "fragmentation_delay_pct": _median([r.fragmentation_delay_pct for r in runs]),
        "waiting_pct": _median([r.waiting_pct for r in runs]),
        "fragmentation_waiting_pods": _median([r.fragmentation_waiting_pods for r in runs]),
        "waiting_gpu_pods": _median([r.waiting_gpu_pods for r in runs]),
        "never_ran": _median([float(sum(r.pending[c]["never_ran"] for c in GPU_CLASSES)) for r in runs]),
        "seconds": sum(r.seconds for r in runs),
        "evictions_per_hour": _median([r.evictions_per_hour for r in runs]),
        "moved.p50_s": _median([r.moved_pending.get("p50_s", 0.0) for r in runs]),
        "moved.max_s": _median([r.moved_pending.get("max_s", 0.0) for r in runs]),
    }
    for c in GPU_CLASSES:
        for k in ("p50_s", "p99_s", "max_s"):
            out[f"{c}.{k}"] = _median([r.pending[c][k] for r in runs])
        out[f"{c}.n"] = _median([float(r.pending[c]["n"]) for r in runs])
    return out


def markdown(results: list[RunResult], record: dict[str, Any]) -> str:
    """Per load: a row per preset, medians over seeds."""
    cmd = record["command"]
    seeds = sorted({r.seed for r in results})
    lines = [f"Churn replay: {record['nodes']} nodes, {record['gpus']} GPUs (every {cmd['node_stride']}th node of "
             f"{Path(cmd['nodes']).name}), pods of {Path(cmd['pods']).name} (lifetimes cut at {cmd['lifetime_cap_hours']:g} h), "
             f"{cmd['hours']:g} h per run measured after {cmd['warmup_hours']:g} h, seeds {', '.join(map(str, seeds))}; medians over seeds."
             + (" A quick run (--quick): a smoke test, not a result." if record["quick"] else "")]
    for load in sorted({r.load for r in results}):
        lines += ["", f"### offered load {load:g} x capacity", "",
                  "| policy | GPU allocation % | fragmentation delay % (pods) | GPU pods waiting % (pods) | "
                  "pending p50 / p99 / max: fractional | whole 1-GPU | multi-GPU | GPU pods never ran | "
                  "evictions / h (moved pods pending p50 / max) | run s |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for preset in dict.fromkeys(r.preset for r in results):
            runs = [r for r in results if r.preset == preset and r.load == load]
            if not runs:
                continue
            m = medians(runs)
            cells = [" / ".join(duration(m[f"{c}.{k}"]) for k in ("p50_s", "p99_s", "max_s")) for c in GPU_CLASSES]
            moved = (f"{m['evictions_per_hour']:.1f} ({duration(m['moved.p50_s'])} / {duration(m['moved.max_s'])})"
                     if m["evictions_per_hour"] else "-")
            lines.append(f"| {preset} | {m['allocation_pct']:.2f} | {m['fragmentation_delay_pct']:.1f} "
                         f"({m['fragmentation_waiting_pods']:.1f}) | {m['waiting_pct']:.1f} ({m['waiting_gpu_pods']:.1f}) | "
                         f"{' | '.join(cells)} | {m['never_ran']:.0f} | {moved} | {m['seconds']:.0f} |")
    lines += ["", "GPU allocation: time-weighted share of GPU capacity allocated. Fragmentation delay: % of the time "
              "in which some GPU pod waited while the free GPU share summed over the cluster was at least its "
              "request; in brackets the time-average number of such pods. GPU pods waiting: % of the time any "
              "waited, and their time-average number. Pending time counts a pod still waiting at the end as "
              "waiting until then. Evictions: made acting on the defragmentation plan (+defrag), per hour "
              "of the measured window; the evicted pods' replacements' pending time apart (not in the classes)."]
    return "\n".join(lines) + "\n"


def plot(out: Path, record: dict[str, Any]) -> None:
    """Allocation and pending GPU pods over time, one line per preset, a row per load (first seed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, dict[str, list[float]]] = record["series"]
    loads = sorted({float(k.rsplit("@", 1)[1]) for k in series})
    fig, axes = plt.subplots(len(loads), 2, figsize=(11, 3.4 * len(loads)), dpi=110, squeeze=False)
    warm = record["command"]["warmup_hours"]
    for row, load in enumerate(loads):
        for key, s in series.items():
            preset, at = key.rsplit("@", 1)
            if float(at) != load:
                continue
            axes[row][0].plot(s["t_h"][:len(s["allocation_pct"])], s["allocation_pct"], label=preset, lw=1)
            axes[row][1].plot(s["t_h"][:len(s["pending_gpu_pods"])], s["pending_gpu_pods"], label=preset, lw=1)
        axes[row][0].set_ylabel(f"load {load:g}: GPU allocation %")
        axes[row][1].set_ylabel("GPU pods pending")
        for ax in axes[row]:
            ax.axvline(warm, color="0.6", ls=":", lw=1)
            ax.grid(alpha=0.3)
        axes[row][0].legend(loc="lower right", fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("simulated hours (dotted: end of warm-up)")
    title = "churn replay" + (" (quick: smoke run)" if record["quick"] else "")
    fig.suptitle(f"{title}: {record['gpus']} GPUs, seed {record['command']['seeds'][0]}")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
